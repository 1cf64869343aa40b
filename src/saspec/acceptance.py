"""Acceptance estimates: the match-length buckets, their priors, and the kernels that score each row's
offered automaton draft against what followed and re-estimate every bucket (see :mod:`saspec.policy`)."""

from __future__ import annotations

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

#: Match-length buckets: 0..7 exactly, then one per doubling. The bucket table holds them three times: a
#: draft token within the match's length of the draft's start, the first draft token of a branched match, and a
#: token further than the match is long.
N_BUCKETS = 16
#: The prior odds of a branched match's first token, as a share of an unbranched one's (m to 1).
BRANCHED_PRIOR_ODDS = 0.25


@njit(cache=True)
def match_bucket(m):
    """Bucket of a match length: 0..7 exactly, then one per doubling up to ``N_BUCKETS - 1``."""
    if m < 8:
        return max(m, 0)
    b = 8
    v = 16
    while m >= v and b < N_BUCKETS - 1:
        b += 1
        v *= 2
    return b


def bucket_floor() -> np.ndarray:
    """float64 [N_BUCKETS]: each bucket's smallest match length."""
    m = np.arange(N_BUCKETS, dtype=np.float64)
    m[8:] = 2.0 ** (np.arange(8, N_BUCKETS) - 5)
    return m


@njit(cache=True)
def bucket_end(j):
    """The smallest match length past bucket ``j`` (a huge number for the last bucket)."""
    if j < 8:
        return j + 1
    if j >= N_BUCKETS - 1:
        return 1 << 62
    return 1 << (j - 4)


@njit(inline="always")
def token_run(match, i, branched, d):
    """The bucket of a row's draft token ``i`` and where the run of tokens sharing it ends (before ``d``):
    a branched match's first token has a bucket of its own, and so do the tokens further from the draft's
    start than the match is long."""
    j = match_bucket(match + i)
    if i == 0 and branched != 0:
        return N_BUCKETS + j, 1
    if i < match:
        return j, min(d, bucket_end(j) - match, match)
    return 2 * N_BUCKETS + j, min(d, bucket_end(j) - match)


@njit(cache=True)
def score(match, offered, branched, drafts, new, lens, rowf, bk, decay, w):
    """Score each row's offered automaton draft against the tokens it emitted (see DraftPolicy.observe),
    then re-estimate every bucket from its counts with ``w`` pseudo-tokens of prior. The tokens of one
    match bucket share its chance: each run of one bucket is counted at once."""
    width = min(drafts.shape[1], new.shape[1])
    for b in range(match.shape[0]):
        n = min(lens[b], offered[b], width)
        if match[b] <= 0 or n <= 0:
            continue
        hit = rowf[1, b] * decay
        miss = rowf[2, b] * decay
        i = 0
        while i < n:  # one match bucket per pass: its chance is shared by the tokens up to its end
            j, stop = token_run(match[b], i, branched[b], n)
            odds = bk[4, j] * rowf[0, b]
            p = odds / (1.0 + odds)
            start = i
            while i < stop and drafts[b, i] == new[b, i]:
                i += 1
            hit += (i - start) * (1.0 - p)
            bk[0, j] += i - start
            if i < stop:  # a miss ends the row's draft
                bk[1, j] += i - start + 1
                miss += p
                break
            bk[1, j] += i - start
        rowf[1, b] = hit
        rowf[2, b] = miss
        rowf[0, b] = (1.0 + hit) / (1.0 + miss)
    estimate(bk, w)


@njit(cache=True)
def estimate(bk, w):
    """Each match bucket's acceptance: its counts with ``w`` pseudo-tokens of its prior, kept inside (0, 1),
    and its odds (which the kernels scale by a row's factor)."""
    for j in range(bk.shape[1]):
        p = (bk[0, j] + w * bk[2, j]) / (bk[1, j] + w)
        q = min(max(p, 1e-6), 1.0 - 1e-6)
        bk[3, j] = q
        bk[4, j] = q / (1.0 - q)
