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
from numba import njit


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


# -- the adaptive rule -------------------------------------------------------------
#
# Pick the source with the higher expected accepted length. For the SA it is the
# mean acceptance seen so far at this match-length bucket (all requests), scaled
# by how this request's SA drafts fared against that mean recently; for the
# neural drafter, this request's recent acceptance. After each verification the
# accepted tokens are known, so both sources' drafts are scored against them
# (an acceptance equal to the known length is a lower bound, used as is).
# The simulator (``simulate.walk``) and ``AdaptiveSelector`` share these helpers.

N_BUCKETS = 16


@njit(cache=True)
def match_bucket(m):
    """Bucket of a match length: 0..7 exactly, then one per doubling up to 15."""
    if m < 8:
        return m
    b = 8
    v = 16
    while m >= v and b < N_BUCKETS - 1:
        b += 1
        v *= 2
    return b


@njit(cache=True)
def adaptive_init(g_sum, g_cnt, k):
    """Prior for the per-bucket SA statistics: a match of length m predicts
    about min(m, k) / 2 accepted tokens."""
    for i in range(N_BUCKETS):
        g_sum[i] = min(k, max(1, i)) * 0.5
        g_cnt[i] = 1.0


@njit(cache=True)
def adaptive_prefers_sa(g_sum, g_cnt, sa_ratio, nn_recent, m):
    """True when the SA's expected acceptance at match length m beats the neural one."""
    if m <= 0:
        return False
    b = match_bucket(m)
    return sa_ratio * g_sum[b] / g_cnt[b] > nn_recent


@njit(cache=True)
def adaptive_observe(g_sum, g_cnt, sa_ratio, nn_recent, m, sa_accepted, nn_accepted):
    """Update the statistics with one step's scored drafts; return the
    request's new (sa_ratio, nn_recent)."""
    if m > 0:
        b = match_bucket(m)
        expect = g_sum[b] / g_cnt[b]
        g_sum[b] += sa_accepted
        g_cnt[b] += 1.0
        sa_ratio = 0.7 * sa_ratio + 0.3 * (sa_accepted + 0.5) / (expect + 0.5)
    return sa_ratio, 0.8 * nn_recent + 0.2 * nn_accepted


def _prefix_len(draft: np.ndarray, verified: np.ndarray) -> int:
    n = min(draft.shape[0], verified.shape[0])
    miss = np.flatnonzero(draft[:n] != verified[:n])
    return int(miss[0]) if miss.size else n


class AdaptiveSelector:
    """Host-side adaptive choice between SA and neural drafts, per request.

    In the simulator it matches the best fixed threshold on every workload
    within 1% without tuning (see BENCHMARKS.md).

    Args:
        k: draft tokens per step.
        neural_prior: expected accepted tokens of the neural drafter before
            any observation (e.g. its measured mean).
    """

    def __init__(self, k: int, neural_prior: float = 2.0) -> None:
        self.k = int(k)
        self.neural_prior = float(neural_prior)
        self._g_sum = np.zeros(N_BUCKETS)
        self._g_cnt = np.zeros(N_BUCKETS)
        adaptive_init(self._g_sum, self._g_cnt, self.k)
        self._req: dict[Any, tuple[float, float]] = {}

    def _state(self, rid: Any) -> tuple[float, float]:
        return self._req.get(rid, (1.0, self.neural_prior))

    def choose(self, request_ids: Any, match_len: np.ndarray) -> np.ndarray:
        """bool [B]: row b should use the SA draft."""
        return np.array(
            [adaptive_prefers_sa(self._g_sum, self._g_cnt, *self._state(r), int(m)) for r, m in zip(request_ids, match_len)],
            dtype=bool,
        )

    def observe(self, request_ids: Any, match_len: np.ndarray, sa_drafts: np.ndarray, neural_drafts: np.ndarray,
                verified: list[np.ndarray]) -> None:
        """Score both drafts of each row against ``verified[b]``, the tokens the
        target produced this step (accepted drafts plus its own token)."""
        for b, r in enumerate(request_ids):
            o_sa = _prefix_len(np.asarray(sa_drafts[b]), verified[b])
            o_nn = _prefix_len(np.asarray(neural_drafts[b]), verified[b])
            self._req[r] = adaptive_observe(self._g_sum, self._g_cnt, *self._state(r), int(match_len[b]), o_sa, o_nn)

    def remove(self, request_id: Any) -> None:
        """Forget a finished request's statistics."""
        self._req.pop(request_id, None)
