"""Select: the hybrid draft choice, per row, between a neural drafter and the SA.

Row ``b`` uses the suffix-automaton draft when its match is at least
``threshold`` tokens long (and not 0: a row without a match has no SA draft),
else the neural draft::

    drafts, use_sa = select_drafts(neural, sa_drafts, match_len, threshold=4)

``select_drafts`` is a torch op: element-wise, no host sync and no
data-dependent Python branching, so it runs on CPU or CUDA tensors and can be
captured in ``torch.cuda.graph``. ``select_drafts_np`` is the same in numpy
(for the simulator). ``threshold=float('inf')`` never uses the SA.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _check(neural: Any, sa: Any, match_len: Any) -> None:
    if neural.ndim != 2:
        raise ValueError(f"neural must be 2-D [B, K], got shape {tuple(neural.shape)}")
    if tuple(sa.shape) != tuple(neural.shape):
        raise ValueError(f"sa must have the shape of neural {tuple(neural.shape)}, got {tuple(sa.shape)}")
    if tuple(match_len.shape) != (neural.shape[0],):
        raise ValueError(f"match_len must have shape ({neural.shape[0]},), got {tuple(match_len.shape)}")


def _scalar_floor(threshold: float) -> float:
    """The smallest match length a scalar threshold accepts (at least 1);
    ``inf`` for +inf. Raises ``ValueError`` for NaN."""
    if math.isnan(threshold):
        raise ValueError("threshold must not be NaN")
    if math.isinf(threshold):
        return threshold if threshold > 0 else 1
    return max(1, math.ceil(threshold))


def select_drafts(neural: Any, sa: Any, match_len: Any, threshold: Any) -> tuple[Any, Any]:
    """Choose each row's draft: SA where ``match_len >= threshold`` and
    ``match_len > 0``, neural elsewhere.

    Args:
        neural: integer tensor [B, K], the neural drafter's tokens.
        sa: integer tensor [B, K], the engine's ``draft_out``.
        match_len: integer tensor [B], the engine's ``match_len_out`` (tokens).
        threshold: minimum match length in tokens: a python int/float, or a
            0-d or [B] tensor on the device of ``match_len`` (then a CUDA graph
            replay picks up its current value). ``float('inf')`` disables the SA.

    Returns:
        ``(drafts, use_sa)``: drafts [B, K], the dtype torch promotes
        ``neural`` and ``sa`` to, on their device; use_sa bool [B].
    """
    import torch

    _check(neural, sa, match_len)
    if isinstance(threshold, torch.Tensor):
        if threshold.dim() > 1 or (threshold.dim() == 1 and tuple(threshold.shape) != (neural.shape[0],)):
            raise ValueError(f"threshold must be 0-d or [{neural.shape[0]}], got shape {tuple(threshold.shape)}")
        use_sa = (match_len >= threshold) & (match_len > 0)
    else:
        lo = _scalar_floor(float(threshold))
        if math.isinf(lo):
            use_sa = torch.zeros(match_len.shape, dtype=torch.bool, device=match_len.device)
        else:
            use_sa = match_len >= int(lo)
    return torch.where(use_sa.unsqueeze(1), sa, neural), use_sa


def select_drafts_np(
    neural: np.ndarray, sa: np.ndarray, match_len: np.ndarray, threshold: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``select_drafts`` for numpy arrays: the same shapes, dtypes (numpy
    promotion) and rule; ``threshold`` a number or a [B] array."""
    neural, sa, match_len = np.asarray(neural), np.asarray(sa), np.asarray(match_len)
    _check(neural, sa, match_len)
    if np.ndim(threshold) == 0:
        lo = _scalar_floor(float(threshold))
        use_sa = np.zeros(match_len.shape, bool) if math.isinf(lo) else match_len >= int(lo)
    else:
        threshold = np.asarray(threshold)
        if threshold.shape != match_len.shape:
            raise ValueError(f"threshold must be a number or have shape {match_len.shape}, got {threshold.shape}")
        use_sa = (match_len >= threshold) & (match_len > 0)
    return np.where(use_sa[:, None], sa, neural), use_sa
