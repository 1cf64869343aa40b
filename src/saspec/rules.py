"""Rules: the fixed drafting rules, for where the policy is off (``saspec.policy`` is the default).

* draft lengths from the match length (``draft_length`` for one row, ``draft_lengths`` per row, on numpy
  or torch): ``fixed`` drafts K, ``per-match`` ``ceil(scale * m)``, ``per-match-recent`` also at most
  ``2 * last + 2`` after a row accepted ``last``;
* the hybrid's threshold rule as a torch op (``select_drafts``: element-wise, no host sync, capturable in
  a CUDA graph; ``select_drafts_np`` in numpy): a row takes the automaton's draft where its match is at
  least ``threshold`` tokens, else the neural one.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from .validate import check_count, check_int_tensor, is_torch

DRAFT_LENGTH_RULES = ("fixed", "per-match", "per-match-recent")
#: The rule and scale ``draft_lengths`` uses by default.
DEFAULT_LENGTH_RULE = "per-match"
DEFAULT_LENGTH_SCALE = 2.0


@njit(cache=True)
def draft_length(m, k_max, rule, scale, last):
    """Draft tokens to propose for one row (int, 0..k_max).

    ``m``: the row's match length (tokens); ``k_max``: the most draft tokens;
    ``rule``: index into :data:`DRAFT_LENGTH_RULES`; ``scale``: tokens per
    matched token; ``last``: the draft tokens the row accepted at its previous
    step, or -1 when unknown. 0 where ``m <= 0`` (no draft); otherwise

    * fixed: ``k_max``;
    * per-match: ``min(k_max, ceil(scale * m))``, at least 1;
    * per-match-recent: per-match, also at most ``2 * last + 2`` when
      ``last >= 0`` (a row that just missed drafts 2; a copy that keeps being
      accepted doubles its length every step).
    """
    if m <= 0 or k_max <= 0:
        return 0
    if rule == 0:
        return k_max
    x = scale * m
    n = k_max if x >= k_max else int(math.ceil(x))  # compared as a float: a huge product must not overflow an int
    if rule == 2 and last >= 0:
        n = min(n, 2 * last + 2)
    return max(n, 1)


def check_length_rule(rule: str, scale: float) -> int:
    """Validate a draft-length rule and its scale; return the rule's index
    into :data:`DRAFT_LENGTH_RULES` (what :func:`draft_length` takes).

    Raises ``ValueError`` naming the problem: an unknown rule, or a scale
    that is not a finite number > 0 (``fixed`` ignores its scale).
    """
    try:
        r = DRAFT_LENGTH_RULES.index(rule)
    except ValueError:
        raise ValueError(f"unknown draft-length rule {rule!r}; choose from {', '.join(DRAFT_LENGTH_RULES)}") from None
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}") from None
    if r != 0 and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale}")
    return r


def draft_lengths(match_len: Any, k_max: int, rule: str = DEFAULT_LENGTH_RULE, scale: float = DEFAULT_LENGTH_SCALE,
                  last_accepted: Any = None) -> Any:
    """Per-row draft lengths from match lengths (see :func:`draft_length`).

    Args:
        match_len: integer array [B] (numpy, or a torch tensor on any device):
            the engine's ``match_len_out``, in tokens.
        k_max: the most draft tokens per row (the engine's K), >= 1.
        rule: one of :data:`DRAFT_LENGTH_RULES`.
        scale: draft tokens per matched token (> 0; unused by ``fixed``).
        last_accepted: for ``per-match-recent``: integer array [B] like
            ``match_len``, each row's accepted draft tokens at its previous
            step, -1 where unknown (a new row). Ignored by the other rules.

    Returns:
        int32 [B] in ``[0, k_max]``, 0 exactly where ``match_len <= 0``; a torch
        tensor on ``match_len``'s device for torch input (element-wise ops only:
        no host sync, capturable in a CUDA graph), numpy otherwise. Row ``b``
        should verify only ``draft_out[b, :lengths[b]]``
        (:func:`truncate_drafts` blanks the rest with -1).
    """
    r = check_length_rule(rule, scale)
    k_max = check_count(k_max, "k_max")
    scale = float(scale)
    if not is_torch(match_len):
        match_len = np.asarray(match_len)
        if last_accepted is not None:
            last_accepted = np.asarray(last_accepted)
    if len(tuple(match_len.shape)) != 1:
        raise ValueError(f"match_len must be 1-D [B], got shape {tuple(match_len.shape)}")
    if r == 2 and last_accepted is None:
        raise ValueError("rule 'per-match-recent' needs last_accepted ([B], -1 where unknown)")
    if r == 2 and tuple(last_accepted.shape) != tuple(match_len.shape):
        raise ValueError(f"last_accepted must have shape {tuple(match_len.shape)}, got {tuple(last_accepted.shape)}")
    if is_torch(match_len):
        import torch

        check_int_tensor(match_len, "match_len")
        m = match_len.to(torch.int64)
        if r == 0:
            n = torch.full_like(m, k_max)
        else:
            n = torch.ceil(m.to(torch.float64) * scale).clamp(1, k_max).to(torch.int64)
            if r == 2:
                last = last_accepted.to(device=m.device, dtype=torch.int64)
                n = torch.where(last >= 0, torch.minimum(n, 2 * last + 2), n).clamp(min=1)
        return torch.where(m > 0, n, torch.zeros_like(n)).to(torch.int32)
    m = np.asarray(match_len)
    if not np.issubdtype(m.dtype, np.integer):
        raise ValueError(f"match_len must hold integers, got dtype {m.dtype}")
    m = m.astype(np.int64)
    if r == 0:
        n = np.full_like(m, k_max)
    else:
        n = np.clip(np.ceil(m.astype(np.float64) * scale), 1, k_max).astype(np.int64)
        if r == 2:
            last = np.asarray(last_accepted).astype(np.int64)
            n = np.maximum(np.where(last >= 0, np.minimum(n, 2 * last + 2), n), 1)
    return np.where(m > 0, n, 0).astype(np.int32)


def truncate_drafts(drafts: Any, lengths: Any, fill: int = -1) -> Any:
    """``drafts`` [B, K] with entries at column >= ``lengths[b]`` set to ``fill``
    (a new array/tensor; torch: element-wise, no host sync)."""
    if drafts.ndim != 2 or tuple(lengths.shape) != (drafts.shape[0],):
        raise ValueError(f"drafts must be [B, K] and lengths [B], got {tuple(drafts.shape)} and {tuple(lengths.shape)}")
    if is_torch(drafts):
        import torch

        cols = torch.arange(drafts.shape[1], device=drafts.device)
        keep = cols.unsqueeze(0) < lengths.to(drafts.device).unsqueeze(1)
        return torch.where(keep, drafts, torch.full_like(drafts, fill))
    drafts = np.asarray(drafts)
    keep = np.arange(drafts.shape[1])[None, :] < np.asarray(lengths)[:, None]
    return np.where(keep, drafts, np.asarray(fill, drafts.dtype))


#: The default hybrid threshold: a row takes the SA's draft when its match is at least this many tokens
#: (among the best fixed thresholds on code edits in ``saspec simulate``).
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


