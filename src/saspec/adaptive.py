"""Deprecated (importing it warns; :mod:`saspec.policy` is the drafting choice): the SA or the neural draft
per row by expected accepted length.

Pick the source with the higher expected accepted length. For the SA it is the
mean acceptance seen so far at this match-length bucket (all requests), scaled
by how this request's SA drafts fared against that mean recently; for the
neural drafter, this request's recent acceptance. After each verification the
accepted tokens are known, so both sources' drafts are scored against them
(an acceptance equal to the known length is a lower bound, used as is).
The simulator (``simulate.walk``) and ``AdaptiveSelector`` share these helpers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

import warnings

from .validate import check_count

warnings.warn("saspec.adaptive is deprecated: saspec.policy chooses each row's draft source and length",
              DeprecationWarning, stacklevel=2)

# One bucketing of match lengths for every rule: the policy's (non-negative lengths bucket alike).
from .policy import N_BUCKETS, match_bucket  # noqa: E402


@njit(cache=True)
def adaptive_init(g_sum, g_cnt, k):
    """Prior for the per-bucket SA statistics (one pseudo-observation each): a
    match of length m predicts about min(m, k) / 2 accepted tokens, m the
    bucket's smallest match (see ``match_bucket``)."""
    for i in range(N_BUCKETS):
        m = i if i < 8 else 2 ** (i - 5)
        g_sum[i] = min(k, max(1, m)) * 0.5
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


def _same_rows(request_ids: Any, **per_row: Any) -> None:
    """``ValueError`` unless every ``per_row`` argument has ``len(request_ids)`` rows."""
    b = len(request_ids)
    for name, x in per_row.items():
        if len(x) != b:
            raise ValueError(f"{name} has {len(x)} rows, expected {b} (one per request id)")


def _prefix_len(draft: np.ndarray, verified: np.ndarray) -> int:
    n = min(draft.shape[0], verified.shape[0])
    miss = np.flatnonzero(draft[:n] != verified[:n])
    return int(miss[0]) if miss.size else n


class AdaptiveSelector:
    """Host-side adaptive choice between SA and neural drafts, per request.

    In the simulator it matches the best fixed threshold on every workload
    closely without tuning (BENCHMARKS.md, "Draft quality").

    Args:
        k: draft tokens per step.
        neural_prior: expected accepted tokens of the neural drafter before
            any observation (e.g. its measured mean).
    """

    def __init__(self, k: int, neural_prior: float = 2.0) -> None:
        self.k = check_count(k, "k")
        self.neural_prior = float(neural_prior)
        self._g_sum = np.zeros(N_BUCKETS)
        self._g_cnt = np.zeros(N_BUCKETS)
        adaptive_init(self._g_sum, self._g_cnt, self.k)
        self._req: dict[Any, tuple[float, float]] = {}

    def _state(self, rid: Any) -> tuple[float, float]:
        return self._req.get(rid, (1.0, self.neural_prior))

    def choose(self, request_ids: Any, match_len: np.ndarray) -> np.ndarray:
        """bool [B]: row b should use the SA draft."""
        _same_rows(request_ids, match_len=match_len)
        return np.array(
            [adaptive_prefers_sa(self._g_sum, self._g_cnt, *self._state(r), int(m)) for r, m in zip(request_ids, match_len)],
            dtype=bool,
        )

    def observe(self, request_ids: Any, match_len: np.ndarray, sa_drafts: np.ndarray, neural_drafts: np.ndarray,
                verified: list[np.ndarray]) -> None:
        """Score both drafts of each row against ``verified[b]``, the tokens the
        target produced this step (accepted drafts plus its own token).
        All five arguments have B rows (``ValueError`` otherwise, nothing updated)."""
        _same_rows(request_ids, match_len=match_len, sa_drafts=sa_drafts, neural_drafts=neural_drafts,
                   verified=verified)
        for b, r in enumerate(request_ids):
            o_sa = _prefix_len(np.asarray(sa_drafts[b]), verified[b])
            o_nn = _prefix_len(np.asarray(neural_drafts[b]), verified[b])
            self._req[r] = adaptive_observe(self._g_sum, self._g_cnt, *self._state(r), int(match_len[b]), o_sa, o_nn)

    def remove(self, request_id: Any) -> None:
        """Forget a finished request's statistics."""
        self._req.pop(request_id, None)
