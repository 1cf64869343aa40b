"""The adaptive source rule the simulator replays (``acceptance``, ``realsim``): the SA or the neural draft per
row by expected accepted length, an earlier study's rule (the library's choice is ``saspec.policy``).

For the SA the expected accepted length is the mean seen so far at the match's bucket (all requests), scaled by
how this request's SA drafts fared against that mean recently; for the neural drafter, this request's recent
acceptance. Jitted, for the simulator's walks.
"""

from __future__ import annotations

from saspec import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from saspec.policy import N_BUCKETS, match_bucket


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
