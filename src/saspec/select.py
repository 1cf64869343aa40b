"""Select: the hybrid draft choice, per row, between a neural drafter and the SA.

Row ``b`` uses the suffix-automaton draft when its match is at least
``threshold`` tokens long (and not 0: a row without a match has no SA draft),
else the neural draft::

    drafts, use_sa = select_drafts(neural, sa_drafts, match_len, threshold=4)

``select_drafts`` is a torch op: element-wise, no host sync and no
data-dependent Python branching, so it runs on CPU or CUDA tensors and can be
captured in ``torch.cuda.graph``. ``select_drafts_np`` is the same in numpy
(for the simulator). ``threshold=float('inf')`` never uses the SA.

The other parts of the hybrid are importable from here too: per-row draft
lengths (``lengths``), the adaptive selector (``adaptive``) and the cost gate
(``gate``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

# The rest of the hybrid's public API stays importable from here; each part has a module of its own.
from .adaptive import (N_BUCKETS, AdaptiveSelector, adaptive_init, adaptive_observe,  # noqa: F401
                       adaptive_prefers_sa, match_bucket)
from .gate import CostGate, best_draft_length, expected_tokens  # noqa: F401
from .lengths import (DEFAULT_LENGTH_RULE, DEFAULT_LENGTH_SCALE, DRAFT_LENGTH_RULES,  # noqa: F401
                      check_length_rule, draft_length, draft_lengths, truncate_drafts)
from .validate import check_int_tensor

#: The default hybrid threshold: a row takes the SA's draft when its match is at least this many tokens
#: (among the best fixed thresholds on code edits in ``saspec simulate``; BENCHMARKS.md, "Draft quality").
HYBRID_THRESHOLD = 4


def _check(neural: Any, sa: Any, match_len: Any) -> None:
    if neural.ndim != 2:
        raise ValueError(f"neural must be 2-D [B, K], got shape {tuple(neural.shape)}")
    if tuple(sa.shape) != tuple(neural.shape):
        raise ValueError(f"sa must have the shape of neural {tuple(neural.shape)}, got {tuple(sa.shape)}")
    if tuple(match_len.shape) != (neural.shape[0],):
        raise ValueError(f"match_len must have shape ({neural.shape[0]},), got {tuple(match_len.shape)}")


def _scalar_floor(threshold: Any) -> int | None:
    """The smallest match length a scalar threshold accepts (at least 1), as a
    Python int, or ``None`` when it accepts none (``+inf``).

    Integers are used exactly (no float rounding, no fixed-width wrap); floats
    are rounded up. Raises ``ValueError`` for NaN and ``TypeError`` for
    anything that is not a real number (bool counts as an int).
    """
    if isinstance(threshold, np.ndarray) and threshold.ndim == 0:
        threshold = threshold.item()
    if isinstance(threshold, numbers.Integral):
        return max(1, int(threshold))
    if not isinstance(threshold, numbers.Real):
        raise TypeError(f"threshold must be a real number or an array/tensor, got {type(threshold).__name__}")
    value = float(threshold)
    if math.isnan(value):
        raise ValueError("threshold must not be NaN")
    if math.isinf(value):
        return None if value > 0 else 1
    return max(1, math.ceil(value))


def _never(lo: int | None, top: float) -> bool:
    """True when no match length up to ``top`` reaches the floor ``lo``."""
    return lo is None or lo > top


def select_drafts(neural: Any, sa: Any, match_len: Any, threshold: Any) -> tuple[Any, Any]:
    """Choose each row's draft: SA where ``match_len >= threshold`` and
    ``match_len > 0``, neural elsewhere.

    Args:
        neural: integer tensor [B, K], the neural drafter's tokens.
        sa: integer tensor [B, K], the engine's ``draft_out``.
        match_len: integer tensor [B], the engine's ``match_len_out`` (tokens).
        threshold: minimum match length in tokens: a real number (Python or
            numpy int/float, compared exactly at any magnitude; NaN is
            rejected), or a 0-d or [B] tensor on the device of ``match_len``
            (then a CUDA graph replay picks up its current value).
            ``float('inf')`` disables the SA.

    Returns:
        ``(drafts, use_sa)``: drafts [B, K], the dtype torch promotes
        ``neural`` and ``sa`` to, on their device; use_sa bool [B].
    """
    import torch

    _check(neural, sa, match_len)
    check_int_tensor(match_len, "match_len")
    if isinstance(threshold, torch.Tensor):
        if threshold.device != match_len.device:
            raise ValueError(f"threshold must be on match_len's device ({match_len.device}), got {threshold.device}")
        if threshold.dim() > 1 or (threshold.dim() == 1 and tuple(threshold.shape) != (neural.shape[0],)):
            raise ValueError(f"threshold must be 0-d or [{neural.shape[0]}], got shape {tuple(threshold.shape)}")
        use_sa = (match_len >= threshold) & (match_len > 0)
    else:
        # Compare with the floor only where it fits match_len's dtype: torch
        # would wrap a larger Python int to the dtype's width.
        lo = _scalar_floor(threshold)
        dt = match_len.dtype
        top = torch.iinfo(dt).max if not (dt.is_floating_point or dt.is_complex or dt == torch.bool) else math.inf
        if _never(lo, top):
            use_sa = torch.zeros(match_len.shape, dtype=torch.bool, device=match_len.device)
        else:
            use_sa = match_len >= lo
    return torch.where(use_sa.unsqueeze(1), sa, neural), use_sa


def select_drafts_np(
    neural: np.ndarray, sa: np.ndarray, match_len: np.ndarray, threshold: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``select_drafts`` for numpy arrays: the same shapes, dtypes (numpy
    promotion) and rule; ``threshold`` a number or a [B] array."""
    neural, sa, match_len = np.asarray(neural), np.asarray(sa), np.asarray(match_len)
    _check(neural, sa, match_len)
    if np.ndim(threshold) == 0:
        lo = _scalar_floor(threshold)
        top = np.iinfo(match_len.dtype).max if match_len.dtype.kind in "iu" else math.inf
        use_sa = np.zeros(match_len.shape, bool) if _never(lo, top) else match_len >= lo
    else:
        threshold = np.asarray(threshold)
        if threshold.shape != match_len.shape:
            raise ValueError(f"threshold must be a number or have shape {match_len.shape}, got {threshold.shape}")
        use_sa = (match_len >= threshold) & (match_len > 0)
    return np.where(use_sa[:, None], sa, neural), use_sa


