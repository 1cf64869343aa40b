"""Acceptance estimates: the match-length buckets, their priors, and the kernels that score each row's
offered automaton draft against what followed and re-estimate every bucket (see :mod:`saspec.policy`).

The kernels are ``register_jitable`` functions without allocation, compiled for the host (``DraftPolicy``)
and for CUDA (``saspec.device.policy_kernel``) from this one source; ``saspec.portable`` says how they give the
same bits on both. A row's own evidence lives at a *state index* ``s`` (the row on the host, the engine's
slot on the device), apart from the row ``b`` of the step's arrays.
"""

from __future__ import annotations

import math

import numpy as np
from numba import int64
from numba.extending import register_jitable

from .core import host_inline
from .portable import add_at2, fmul

#: Match-length buckets: 0..7 exactly, then one per doubling. The bucket table holds them three times: a
#: draft token within the match's length of the draft's start, the first draft token of a branched match, and a
#: token further than the match is long.
N_BUCKETS = 16
#: The trials a bucket remembers: past this, its hits and trials are halved (rounded down: integers, so the
#: device adds them in any order to the same bits). Its estimate then follows the requests of late, not every
#: request since the start: a server's code edits copy on far past a match, its prose questions do not, and the
#: rows' own factors cannot move a bucket learnt on thousands of code tokens far enough.
BUCKET_MEMORY = 256.0
#: The prior odds of a branched match's first token, as a share of an unbranched one's (m to 1).
BRANCHED_PRIOR_ODDS = 0.25
#: The shortest match whose offer counts as evidence of its row's factor. A one-token match is a guess
#: at the next word, not a copy: the buckets learn how often it is right, but in a row that copies well it
#: misses as often as in prose, and counted against the row it cut the copies that follow.
ROW_EVIDENCE_MATCH = 2


@register_jitable
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


def bucket_priors() -> np.ndarray:
    """float64 [3 * N_BUCKETS]: each bucket's prior acceptance: odds ``m`` to 1 at its smallest match ``m``
    (a branched match's first token: ``BRANCHED_PRIOR_ODDS`` of that)."""
    odds = np.concatenate((bucket_floor(), BRANCHED_PRIOR_ODDS * bucket_floor(), bucket_floor()))
    return odds / (odds + 1.0)


@register_jitable
def bucket_end(j):
    """The smallest match length past bucket ``j`` (a huge number for the last bucket)."""
    if j < 8:
        return int64(j + 1)
    if j >= N_BUCKETS - 1:
        return int64(1) << 62
    return int64(1) << (j - 4)


@register_jitable
def token_run(match, i, branched, d):
    """The bucket of a row's draft token ``i`` and where the run of tokens sharing it ends (before ``d``):
    a branched match's first token has a bucket of its own, and so do the tokens further from the draft's
    start than the match is long. (int64 throughout: the simulator computes on numpy scalars.)"""
    m = int64(match)
    i = int64(i)
    d = int64(d)
    j = match_bucket(m + i)
    if i == 0 and branched != 0:
        return N_BUCKETS + j, i + 1
    if i < m:
        return j, min(d, bucket_end(j) - m, m)
    return 2 * N_BUCKETS + j, min(d, bucket_end(j) - m)


@host_inline
def score_row(match, branched, n, drafts, dr, d0, new, b, rowf, s, bk, decay):
    """Score one row's offered automaton draft (made at a match of ``match``, ``branched``; its tokens
    ``drafts[dr, d0:]``) against the tokens it emitted (``new[b]``), over the first ``n`` of both: the row's
    evidence at state index ``s`` (``rowf[:, s]``: odds factor, hits, misses; decayed by ``decay`` first;
    only at a match of :data:`ROW_EVIDENCE_MATCH` or more) and
    each bucket's hits and trials (``bk[0:2]``, added with ``add_at2``: integers, exact in any order). Reads
    ``bk[4]``, which only :func:`estimate_bucket` writes. The tokens of one match bucket share its chance:
    each run of one bucket is counted at once. Nothing where ``match <= 0`` or ``n <= 0``."""
    if match <= 0 or n <= 0:
        return
    hit = fmul(rowf[1, s], decay)
    miss = fmul(rowf[2, s], decay)
    i = int64(0)
    while i < n:  # one match bucket per pass: its chance is shared by the tokens up to its end
        j, stop = token_run(match, i, branched, n)
        odds = fmul(bk[4, j], rowf[0, s])
        p = odds / (1.0 + odds)
        start = i
        while i < stop and drafts[dr, d0 + i] == new[b, i]:
            i += 1
        hit += fmul(float(i - start), 1.0 - p)
        add_at2(bk, 0, j, float(i - start))
        if i < stop:  # a miss ends the row's draft
            add_at2(bk, 1, j, float(i - start + 1))
            miss += p
            break
        add_at2(bk, 1, j, float(i - start))
    if match >= ROW_EVIDENCE_MATCH:
        rowf[1, s] = hit
        rowf[2, s] = miss
        rowf[0, s] = (1.0 + hit) / (1.0 + miss)


@host_inline
def estimate_bucket(bk, j, w):
    """Bucket ``j``'s acceptance: its counts (halved first where they pass :data:`BUCKET_MEMORY` trials) with
    ``w`` pseudo-tokens of its prior, kept inside (0, 1), and its odds (which the kernels scale by a row's
    factor)."""
    if bk[1, j] > BUCKET_MEMORY:
        bk[0, j] = math.floor(bk[0, j] * 0.5)
        bk[1, j] = math.floor(bk[1, j] * 0.5)
    p = (bk[0, j] + fmul(w, bk[2, j])) / (bk[1, j] + w)
    q = min(max(p, 1e-6), 1.0 - 1e-6)
    bk[3, j] = q
    bk[4, j] = q / (1.0 - q)


@register_jitable
def estimate(bk, w):
    """Every bucket's acceptance (:func:`estimate_bucket`)."""
    for j in range(bk.shape[1]):
        estimate_bucket(bk, j, w)


@register_jitable
def score(match, offered, branched, drafts, new, lens, rowf, bk, decay, w):
    """Score each row's offered automaton draft against the tokens it emitted (see DraftPolicy.observe;
    row ``b``'s evidence at ``rowf[:, b]``), then re-estimate every bucket with ``w`` pseudo-tokens of prior."""
    width = min(drafts.shape[1], new.shape[1])
    for b in range(match.shape[0]):
        score_row(match[b], branched[b], min(lens[b], offered[b], width), drafts, b, 0, new, b, rowf, b, bk, decay)
    estimate(bk, w)


@host_inline
def keep_offer(prev, s, match, offered, branched, drafts, b, width):
    """Keep row ``b``'s automaton offer for :func:`score_kept` at the next step: ``prev[s]`` (int32
    [k_max + 3]) = its match, its length (``offered`` cut to ``width``), ``branched``, and its tokens
    (``drafts[b]``; scoring reads no further than the offer)."""
    n = max(min(int64(offered), int64(width)), int64(0))
    prev[s, 0] = match
    prev[s, 1] = n
    prev[s, 2] = branched
    for i in range(n):
        prev[s, 3 + i] = drafts[b, i]


@host_inline
def score_kept(prev, s, new, b, n_new, rowf, bk, decay):
    """:func:`score_row` for the offer kept at ``prev[s]`` against the ``n_new`` tokens ``new[b]`` emitted,
    into the evidence at state index ``s``."""
    n = min(int64(n_new), int64(prev[s, 1]), int64(prev.shape[1] - 3), int64(new.shape[1]))
    score_row(prev[s, 0], prev[s, 2], n, prev, s, 3, new, b, rowf, s, bk, decay)
