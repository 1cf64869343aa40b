"""Policy: each step, every row's draft length and source for the most tokens per second of the whole step.

A speculative step verifies, for each of its ``B`` rows, the row's own token
plus ``d_b`` draft tokens, in one target forward over ``n = B + sum(d_b)``
tokens that costs ``C(n)`` seconds. If draft token ``i`` of row ``b`` is
accepted with probability ``P[b, i]`` (all tokens before it accepted too, so
``P`` falls along a row), the step emits ``B + sum of the P it verifies``
tokens on average. :class:`DraftPolicy` chooses the drafts that maximise

    expected tokens / (C(n) + the neural drafter's seconds, where it runs)

by marginal gain: every candidate draft token of every row is ranked by its
``P``; the verified set is the ``P >= threshold`` prefix of each row, with the
threshold (one per step) that gives the highest rate under the cost curve.
Since ``P`` is cumulative, a row's tokens above the threshold are a prefix,
so this is a draft length per row. The rank uses a 64-bin histogram, one
jitted pass over the ``B x K`` candidates: no sort.

Where the curve is compute-bound (a CPU, where a step of 8 rows costs about
its token count) the threshold rises with the batch and rows draft only what
is likely accepted; where it is memory-bound (a GPU at small batch: ``C``
flat) the threshold is low and rows draft long.

**The cost model** is :class:`saspec.step_cost.StepCost` (re-exported here): the engine's
cost curve, profiled up front or a prior shape, corrected online by a rule that no single timing, burst or
cold start moves for good.

**Acceptance.** The automaton's draft token ``i`` at a match of ``m`` tokens
continues a copy matched over ``m + i`` tokens; its probability comes from
per-match-bucket counts (``match_bucket(m + i)``) with ``prior_weight``
pseudo-tokens of prior at odds ``m`` to 1, times the row's own odds factor (a
Mantel-Haenszel ratio of its recent hits and misses against what was
predicted). Where the matched suffix's earlier occurrences went on with
several tokens (``branched``, from ``SpecEngine.extend``'s ``branch_out``), the
first draft token is one guess among the continuations seen: it has buckets of
its own, at prior odds ``m / 4`` to 1 (on recorded code edits and chat, a
branched match's first token was accepted a third to half as often as an
unbranched one of the same length; the tokens after it then match as usual).
A draft token further from the draft's start than the match is long
(``i >= m``) continues the copy past what the matched suffix showed: it has
buckets of its own too, with the same prior, learnt apart (served free-form
answers accept such tokens less often than the ``m + i`` bucket predicts,
recorded code edits more often: each engine learns which). Every offered automaton draft is scored against the tokens the row
emitted that step, verified or not (:meth:`DraftPolicy.observe`), so the
automaton needs no exploration. The neural drafter's per-token acceptance is
learnt from its verified drafts, with ``neural_prior`` as prior; its evidence
decays towards the prior (``neural_memory`` per step), so a run of early
misses cannot keep it out for good. Its cost is the target's cost curve times
a ratio learnt like a knot (prior ``neural_cost`` until two calls are timed,
so a 100x slow first call moves nothing): a call of ``k`` drafts costs one forward
over the tokens it has not read (its catch-up; none where the engine runs the
catch-up anyway) and ``k - 1`` forwards over its rows.

Every decision is counted in :attr:`DraftPolicy.stats`; ``log`` (a callable)
receives each step's :class:`Decision`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from .slab import slab, view1, view2
from .step_cost import StepCost, cost_arrays, cost_of, cpu_like, gpu_like, linear, observe_cost  # noqa: F401
from .validate import check_count, check_timing

#: Row sources, as :meth:`DraftPolicy.decide` returns them.
NONE, AUTOMATON, NEURAL = 0, 1, 2
SOURCE_NAMES = ("none", "automaton", "neural")
#: Match-length buckets: 0..7 exactly, then one per doubling. The bucket table holds them three times: a
#: draft token within the match's length of the draft's start, the first draft token of a branched match, and a
#: token further than the match is long.
N_BUCKETS = 16
#: The prior odds of a branched match's first token, as a share of an unbranched one's (m to 1).
BRANCHED_PRIOR_ODDS = 0.25
#: Bins of the per-token acceptance histogram the allocation ranks by.
N_BINS = 64


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


def _bucket_floor() -> np.ndarray:
    """float64 [N_BUCKETS]: each bucket's smallest match length."""
    m = np.arange(N_BUCKETS, dtype=np.float64)
    m[8:] = 2.0 ** (np.arange(8, N_BUCKETS) - 5)
    return m


# -- the allocation kernel -----------------------------------------------------------------------------------

# DraftPolicy's state, likewise in a few arrays (views of three buffers, in the order of _SLABS, by which _step
# finds them):
#   rowf   float64 [3, rows]: each row's odds factor, and the hits and misses behind it
#   bk     float64 [5, 3 * N_BUCKETS]: each match bucket's hits, trials, prior, estimate, and its odds (q / (1 - q));
#          the second third: a branched match's first token; the last: tokens beyond the match's length
#   probs  float64 [rows, k_max + 1]: the row's cumulative acceptance chances, and its expected tokens (scratch)
#   ri     int32 [3, rows]: each row's source, a trial source (scratch) and draft length (at first: its candidates)
#   hist   float64 [5, N_BINS]: the histogram's counts and sums, the rate down to each bin, and the automaton's
#          own counts and sums (all scratch)
#   st     int64 [len(STATS)]: the counters (DraftPolicy.stats)
#   prev   int32 [rows, k_max + 3]: for DraftPolicy.step, each row's last match, offer, branched and offered draft
#   last   int64 [2]: the rows and the tokens (rows plus draft tokens) of the last step
#: The arrays' order in DraftPolicy's slab, by which _step finds them.
_SLABS = ("rowf", "bk", "probs", "hist", "ri", "prev", "st", "last")
_ROWF, _BK, _PROBS, _HIST, _RI, _PREV, _STC, _LAST = range(len(_SLABS))
STATS = ("steps", "rows", "automaton_rows", "neural_rows", "none_rows", "automaton_tokens", "neural_tokens",
         "neural_steps", "plain_steps", "timed", "ignored_timings")
_ST = {name: i for i, name in enumerate(STATS)}


@njit(cache=True)
def _bucket_end(j):
    """The smallest match length past bucket ``j`` (a huge number for the last bucket)."""
    if j < 8:
        return j + 1
    if j >= N_BUCKETS - 1:
        return 1 << 62
    return 1 << (j - 4)


@njit(inline="always")
def _token_run(match, i, branched, d):
    """The bucket of a row's draft token ``i`` and where the run of tokens sharing it ends (before ``d``):
    a branched match's first token has a bucket of its own, and so do the tokens further from the draft's
    start than the match is long."""
    j = match_bucket(match + i)
    if i == 0 and branched != 0:
        return N_BUCKETS + j, 1
    if i < match:
        return j, min(d, _bucket_end(j) - match, match)
    return 2 * N_BUCKETS + j, min(d, _bucket_end(j) - match)


@njit(cache=True)
def _row_probs(match, offered, branched, rowf, odds_bucket, k_max, probs, ends, hist):
    """probs[b, i]: the chance that the automaton's draft tokens 0..i of row b are all accepted (0 at
    ``ends[b]``, where each row's candidates end, when that is below ``k_max``); the expected accepted
    tokens of each row's whole draft into probs[:, k_max]; every row's candidates counted into the
    automaton histogram ``hist[3:5]`` (counts and sums per bin). The tokens of one match bucket share its
    per-token chance: one division per bucket; ``p`` falls along a row, so its bins do too, and a bin
    changes only where ``p`` drops below the bin's floor."""
    hist[3:5, :] = 0.0
    for b in range(match.shape[0]):
        p = 1.0
        e = 0.0
        d = min(offered[b], k_max) if match[b] > 0 else 0
        ends[b] = d
        run_bin, cnt, tot = N_BINS - 1, 0.0, 0.0
        i = 0
        while i < d:
            j, stop = _token_run(match[b], i, branched[b], d)
            odds = odds_bucket[j] * rowf[0, b]
            a = odds / (1.0 + odds)
            a2 = a * a
            a3, a4 = a2 * a, a2 * a2
            while i < stop:
                if i + 4 <= stop and p * a4 * N_BINS >= run_bin:
                    # four tokens of one bin at a time, off one product: no chain of multiplications
                    p1, p2, p3, p4 = p * a, p * a2, p * a3, p * a4
                    probs[b, i], probs[b, i + 1], probs[b, i + 2], probs[b, i + 3] = p1, p2, p3, p4
                    add = (p1 + p2) + (p3 + p4)
                    e += add
                    cnt += 4.0
                    tot += add
                    p = p4
                    i += 4
                    continue
                p *= a
                probs[b, i] = p
                e += p
                if p * N_BINS < run_bin:  # a new bin
                    if cnt > 0.0:
                        hist[3, run_bin] += cnt
                        hist[4, run_bin] += tot
                    run_bin, cnt, tot = min(int(p * N_BINS), N_BINS - 1), 0.0, 0.0
                cnt += 1.0
                tot += p
                i += 1
        if cnt > 0.0:
            hist[3, run_bin] += cnt
            hist[4, run_bin] += tot
        if d < k_max:
            probs[b, d] = 0.0
        probs[b, k_max] = e


@njit(cache=True)
def _best_threshold(probs, k_max, src, q_nn, k_nn, base, fixed_s, curve, index, knot, hist, tol):
    """The histogram pass: (rate, bin) of the best threshold over the rows' candidate tokens (automaton
    rows: probs; neural rows (src == 2): q_nn ** (i + 1), i < k_nn); bin N_BINS means no draft. With
    more than one row and ``tol > 0``, the highest threshold (the fewest tokens) whose rate is within
    ``tol`` of the best. Without neural rows the automaton histogram of :func:`_row_probs` is the
    histogram (every row with candidates has src 1 then)."""
    hist[0:3, :] = 0.0
    if k_nn == 0:
        hist[0:2, :] = hist[3:5, :]
    else:
        # the neural rows' candidates are alike: counted once, added per row
        nn_cnt = np.zeros(N_BINS)
        nn_tot = np.zeros(N_BINS)
        p = 1.0
        for i in range(k_nn):
            p *= q_nn
            j = min(int(p * N_BINS), N_BINS - 1)
            nn_cnt[j] += 1.0
            nn_tot[j] += p
        for b in range(probs.shape[0]):
            if src[b] == 2:
                for j in range(N_BINS):
                    hist[0, j] += nn_cnt[j]
                    hist[1, j] += nn_tot[j]
            elif src[b] == 1:
                # p falls along a row, so its bins do too: add each run of one bin at once
                run_bin, cnt, tot = -1, 0.0, 0.0
                for i in range(k_max):
                    p = probs[b, i]
                    if p <= 0.0:
                        break
                    j = min(int(p * N_BINS), N_BINS - 1)
                    if j != run_bin:
                        if cnt > 0.0:
                            hist[0, run_bin] += cnt
                            hist[1, run_bin] += tot
                        run_bin, cnt, tot = j, 0.0, 0.0
                    cnt += 1.0
                    tot += p
                if cnt > 0.0:
                    hist[0, run_bin] += cnt
                    hist[1, run_bin] += tot
    plain = base / (cost_of(base, curve, index, knot) + fixed_s)
    best = plain
    best_bin = N_BINS
    n = base
    e = float(base)
    for j in range(N_BINS - 1, -1, -1):
        if hist[0, j] == 0.0:
            continue
        n += int(hist[0, j])
        e += hist[1, j]
        r = e / (cost_of(n, curve, index, knot) + fixed_s)
        hist[2, j] = r
        if r > best:
            best = r
            best_bin = j
    if tol > 0.0 and base > 1 and best_bin < N_BINS:
        # Where the rate is flat near its best (a compute-bound step), the extra tokens buy next to nothing
        # and make the step longer for every row in it and for the prefills that wait for it.
        floor = (1.0 - tol) * best
        if plain >= floor:
            return plain, N_BINS
        for j in range(N_BINS - 1, best_bin, -1):
            if hist[0, j] > 0.0 and hist[2, j] >= floor:
                return hist[2, j], j
    return best, best_bin


@njit(cache=True)
def _allocate(match, offered, branched, nn_ok, q_nn, k_nn, nn_fwd, nn_catch, k_max, rowf, bk, probs, ri, hist, st,
              count, curve, index, knot, tol):
    """Each row's draft length (ri[2]) and source (ri[0]); see the module doc. Counts the step into ``st``
    where ``count``. Returns (rate, plain rate, neural k, draft tokens)."""
    rows = match.shape[0]
    src, alt, lengths = ri[0], ri[1], ri[2]
    _row_probs(match, offered, branched, rowf, bk[4], k_max, probs, lengths, hist)  # lengths: each row's candidates
    for b in range(rows):
        src[b] = 1 if lengths[b] > 0 else 0
    plain = rows / cost_of(rows, curve, index, knot)
    best, best_bin = _best_threshold(probs, k_max, src, q_nn, 0, rows, 0.0, curve, index, knot, hist, tol)
    best_k = 0
    if k_nn > 0:  # the neural drafter at each of its lengths, for the rows it drafts better than the automaton
        one = cost_of(rows, curve, index, knot)
        for kk in range(1, k_nn + 1):
            e_nn = 0.0
            p = 1.0
            for i in range(kk):
                p *= q_nn
                e_nn += p
            any_nn = False
            for b in range(rows):
                alt[b] = src[b]
                if nn_ok[b] and e_nn > probs[b, k_max]:
                    alt[b] = 2
                    any_nn = True
            if not any_nn:
                continue
            fixed = nn_fwd * (nn_catch + (kk - 1) * one)
            r, bn = _best_threshold(probs, k_max, alt, q_nn, kk, rows, fixed, curve, index, knot, hist, tol)
            if r > best:
                best, best_bin, best_k = r, bn, kk
        if best_k > 0:
            e_nn = 0.0
            p = 1.0
            for i in range(best_k):
                p *= q_nn
                e_nn += p
            for b in range(rows):
                if nn_ok[b] and e_nn > probs[b, k_max]:
                    src[b] = 2
    n_auto = n_nn = t_auto = t_nn = 0
    for b in range(rows):
        d = 0
        if best_bin < N_BINS:
            if src[b] == 2:
                p = 1.0
                for i in range(best_k):
                    p *= q_nn
                    if min(int(p * N_BINS), N_BINS - 1) < best_bin:
                        break
                    d += 1
            elif src[b] == 1:
                # the row's tokens in a bin >= best_bin are a prefix (p falls along the row): bisect for its end
                lo, hi = 0, lengths[b]
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if probs[b, mid] * N_BINS < best_bin:
                        hi = mid
                    else:
                        lo = mid + 1
                d = lo
        lengths[b] = d
        if d == 0:
            src[b] = 0
        elif src[b] == 1:
            n_auto += 1
            t_auto += d
        else:
            n_nn += 1
            t_nn += d
    if count:
        st[0] += 1  # the order of STATS
        st[1] += rows
        st[2] += n_auto
        st[3] += n_nn
        st[4] += rows - n_auto - n_nn
        st[5] += t_auto
        st[6] += t_nn
        st[7] += best_k > 0
        st[8] += t_auto + t_nn == 0
    return best, plain, best_k, t_auto + t_nn


@njit(cache=True)
def _score(match, offered, branched, drafts, new, lens, rowf, bk, decay, w):
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
            j, stop = _token_run(match[b], i, branched[b], n)
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
    _estimate(bk, w)


@njit(cache=True)
def _estimate(bk, w):
    """Each match bucket's acceptance: its counts with ``w`` pseudo-tokens of its prior, kept inside (0, 1),
    and its odds (which the kernels scale by a row's factor)."""
    for j in range(bk.shape[1]):
        p = (bk[0, j] + w * bk[2, j]) / (bk[1, j] + w)
        q = min(max(p, 1e-6), 1.0 - 1e-6)
        bk[3, j] = q
        bk[4, j] = q / (1.0 - q)


@njit(cache=True)
def _step(match, offered, branched, drafts, new, lens, seconds, step_tokens, same, k_max, pf, p32, p64, decay, w,
          tol, cf, ci, max_age, q):
    """DraftPolicy.step in one call: the last step's timing (at ``step_tokens`` where > 0, else the rows
    and drafts it chose) and scores where ``same``, then this step's choice (automaton only). The policy's
    state comes as its three buffers, the cost's as its two. Returns (rate, plain rate)."""
    rowf, bk, probs, hist = view2(pf, p64, _ROWF), view2(pf, p64, _BK), view2(pf, p64, _PROBS), view2(pf, p64, _HIST)
    ri, prev, st, last = view2(p32, p64, _RI), view2(p32, p64, _PREV), view1(p64, p64, _STC), view1(p64, p64, _LAST)
    curve, index, knot, knot_i, ratios, steps, scale_buf, scratch, ctr = cost_arrays(cf, ci)
    b = match.shape[0]
    rowf, probs, ri = rowf[:, :b], probs[:b], ri[:, :b]
    k = prev.shape[1] - 3
    if same and last[0] == b:
        timed = step_tokens if step_tokens > 0 else last[1]
        if observe_cost(timed, seconds, curve, index, knot, knot_i, ratios, steps, scale_buf, scratch, ctr,
                         max_age, q):
            st[9] += 1
        else:
            st[10] += 1
        _score(prev[:b, 0], prev[:b, 1], prev[:b, 2], prev[:b, 3:], new, lens, rowf, bk, decay, w)
    nn_ok = np.zeros(0, np.bool_)
    rate, plain, _, tokens = _allocate(match, offered, branched, nn_ok, 0.0, 0, 0.0, 0.0, k_max, rowf, bk, probs, ri,
                                       hist, st, True, curve, index, knot, tol)
    width = min(drafts.shape[1], k)
    for r in range(b):  # _score reads no further than the offer
        n = min(offered[r], width)
        prev[r, 0] = match[r]
        prev[r, 1] = n
        prev[r, 2] = branched[r]
        for i in range(n):
            prev[r, 3 + i] = drafts[r, i]
    last[0] = b
    last[1] = b + tokens
    return rate, plain

# -- the policy ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """One step's choice, as ``log`` receives it.

    Attributes:
        step: the policy's step count.
        lengths: int32 [B] draft tokens per row.
        sources: int32 [B] :data:`NONE` / :data:`AUTOMATON` / :data:`NEURAL` per row.
        rate: expected tokens per second of the step as chosen.
        plain_rate: expected tokens per second without drafts.
        neural_k: draft tokens the neural drafter makes this step (0: it drafts nothing).
    """

    step: int
    lengths: np.ndarray
    sources: np.ndarray
    rate: float
    plain_rate: float
    neural_k: int


#: Where setting this environment variable (to anything but empty) makes the integrations log every decision.
LOG_ENV = "SASPEC_POLICY_LOG"


def log_decision(d: Decision) -> None:
    """A ``log`` for :class:`DraftPolicy` that writes each decision to the ``saspec.policy`` logger (INFO):
    step, rows by source, draft tokens, expected tokens per second against plain, the neural K."""
    import logging

    src = d.sources
    logging.getLogger("saspec.policy").info(
        "step %d: %d rows (automaton %d, neural %d, none %d), %d draft tokens, rate %.4g vs plain %.4g, neural k %d",
        d.step, len(src), int((src == AUTOMATON).sum()), int((src == NEURAL).sum()), int((src == NONE).sum()),
        int(d.lengths.sum()), d.rate, d.plain_rate, d.neural_k)


def env_log() -> Callable[[Decision], Any] | None:
    """:func:`log_decision` where ``$SASPEC_POLICY_LOG`` is set, else None."""
    import os

    return log_decision if os.environ.get(LOG_ENV, "").strip() else None


def _check_prob(value: Any, name: str, open_top: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    v = float(value)
    if not (0.0 <= v <= 1.0) or (open_top and v >= 1.0):
        raise ValueError(f"{name} must be in [0, 1{')' if open_top else ']'}, got {value!r}")
    return v


def _check_positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


@dataclass
class PolicySettings:
    """What a user sets (every field has a default; all are validated by :class:`DraftPolicy`).

    Attributes:
        prior_weight: pseudo-tokens of prior behind each acceptance estimate (finite, > 0).
        neural_prior: the neural drafter's per-token acceptance before any evidence, in [0, 1).
        neural_cost: a neural drafter forward's cost as a share of a target forward over the same
            tokens, before it is timed (finite, > 0).
        neural_memory: per step, how much of the neural drafter's acceptance evidence is kept (0, 1].
        row_memory: per step, how much of a row's own acceptance evidence is kept (0, 1].
        step_tolerance: with more than one row, the policy takes the shortest step whose expected
            tokens per second are within this share of the best, in [0, 0.5) (0: the best): where the
            rate is flat (verification compute-bound) longer steps buy next to nothing and delay every
            row and any prefill that waits for them.
        cost_shape: the cost curve's prior shape (see :class:`StepCost`) where no profile is given.
        window, max_age, quantile: the cost model's refresh rule (see :class:`StepCost`).
    """

    prior_weight: float = 8.0
    neural_prior: float = 0.6
    neural_cost: float = 0.25
    neural_memory: float = 0.995
    row_memory: float = 0.9
    step_tolerance: float = 0.02
    cost_shape: Any = field(default=None)
    window: int = 16
    max_age: int = 64
    quantile: float = 0.25


def engine_cost(settings: PolicySettings, device: str = "cpu", max_tokens: int | None = None) -> StepCost:
    """The :class:`StepCost` of an engine on ``device`` (``"cpu"``: the :func:`cpu_like` prior shape, else
    :func:`gpu_like`) unless ``settings.cost_shape`` is set, with ``settings``' refresh rule and
    ``max_tokens`` where given (see :meth:`DraftPolicy.for_engine`)."""
    shape = settings.cost_shape or (cpu_like if device == "cpu" else gpu_like)
    extra = {} if max_tokens is None else {"max_tokens": max(int(max_tokens), 1)}
    return StepCost(shape, window=settings.window, max_age=settings.max_age, quantile=settings.quantile, **extra)


class DraftPolicy:
    """Each step's draft length and source per row (see the module doc).

    Each step the caller:

    1. :meth:`decide` with each row's match length and the automaton's
       offered draft length (and the neural drafter's K, where there is one);
    2. verifies what it chose, then :meth:`observe_step` with the step's
       seconds (the neural drafter's apart, :meth:`observe_neural`) and
       :meth:`observe` with each row's offered draft and emitted tokens.

    An engine without a neural drafter does all three in one call per step,
    :meth:`step`, which keeps the offers to score itself.

    Args:
        k_max: the most automaton draft tokens per row (>= 1).
        cost: the engine's :class:`StepCost` (e.g. from :meth:`StepCost.profile`);
            default one on ``settings.cost_shape``.
        settings: :class:`PolicySettings`; default all defaults.
        neural_catchup_sunk: the engine runs the neural drafter's catch-up
            forward at every step anyway (vLLM's draft model): choosing it
            costs only its drafting forwards.
        log: called with each step's :class:`Decision`, or None.
        clock: the time source the integrations read (a test injects one).

    Raises:
        ValueError: a setting out of range (named in the message).

    Attributes:
        stats: counters (a new dict per read): ``steps``, ``rows``, ``automaton_rows``,
            ``neural_rows``, ``none_rows``, ``automaton_tokens``, ``neural_tokens``,
            ``neural_steps``, ``plain_steps`` (steps that drafted nothing), ``timed`` and
            ``ignored_timings`` (not finite or not > 0).
    """

    def __init__(self, k_max: int, *, cost: StepCost | None = None, settings: PolicySettings | None = None,
                 neural_catchup_sunk: bool = False, log: Callable[[Decision], Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.k_max = check_count(k_max, "k_max")
        s = settings if settings is not None else PolicySettings()
        self.settings = s
        self.neural_k = 0
        self.prior_weight = _check_positive(s.prior_weight, "prior_weight")
        self.neural_prior = _check_prob(s.neural_prior, "neural_prior", open_top=True)
        self.neural_cost = _check_positive(s.neural_cost, "neural_cost")
        self.step_tolerance = _check_prob(s.step_tolerance, "step_tolerance", open_top=True)
        if self.step_tolerance >= 0.5:
            raise ValueError(f"step_tolerance must be in [0, 0.5), got {s.step_tolerance!r}")
        for name in ("neural_memory", "row_memory"):
            v = _check_prob(getattr(s, name), name)
            if v == 0.0:
                raise ValueError(f"{name} must be in (0, 1], got 0")
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning seconds, got {clock!r}")
        if log is not None and not callable(log):
            raise ValueError(f"log must be a callable or None, got {log!r}")
        self.cost = cost if cost is not None else StepCost(s.cost_shape, window=s.window, max_age=s.max_age,
                                                            quantile=s.quantile)
        if not isinstance(self.cost, StepCost):
            raise ValueError(f"cost must be a saspec.policy.StepCost, got {type(self.cost).__name__}")
        self.catchup_sunk = bool(neural_catchup_sunk)
        self.log, self.clock = log, clock
        self._nn_hits = 0.0
        self._nn_trials = 0.0
        # The neural cost ratio: its latest timings, each against the target's cost of the same tokens.
        self._nn_calls = np.zeros((s.window, 5))  # its latest calls: seconds, read, drafted, rows, step
        self._nn_seen = 0
        self._rows: list[Any] | None = None
        self._saved: dict[Any, tuple[float, float]] = {}
        self._cap = 0
        self._step_tail: tuple | None = None
        self._grow(1)
        odds = np.concatenate((_bucket_floor(), BRANCHED_PRIOR_ODDS * _bucket_floor(), _bucket_floor()))
        self._bk[2] = odds / (odds + 1.0)
        _estimate(self._bk, self.prior_weight)

    @classmethod
    def for_engine(cls, k_max: int, *, device: str = "cpu", settings: PolicySettings | None = None,
                   max_tokens: int | None = None, neural_catchup_sunk: bool = False,
                   log: Callable[[Decision], Any] | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> DraftPolicy:
        """The policy an engine uses, with its cost model: the prior cost shape follows ``device``
        (``"cpu"``: :func:`cpu_like`, compute-bound; anything else: :func:`gpu_like`, memory-bound) unless
        ``settings.cost_shape`` is set; the :class:`StepCost` takes ``settings``' ``window``, ``max_age``
        and ``quantile``, and ``max_tokens`` (the most tokens a step verifies) where given.

        Args:
            k_max: the most automaton draft tokens per row (>= 1).
            device: the engine's device type (``"cpu"``, ``"cuda"``, ...).
            settings: :class:`PolicySettings`; default all defaults.
            max_tokens: the most tokens a step verifies (rows x (K + 1)); None: StepCost's default.
            neural_catchup_sunk, clock: as :class:`DraftPolicy`.
            log: called with each step's :class:`Decision`; None: :func:`env_log` (the logger where
                ``$SASPEC_POLICY_LOG`` is set).

        Raises:
            ValueError: a setting out of range (named in the message).
        """
        ps = settings if settings is not None else PolicySettings()
        return cls(k_max, cost=engine_cost(ps, device, max_tokens), settings=ps,
                   neural_catchup_sunk=neural_catchup_sunk, log=log if log is not None else env_log(), clock=clock)

    @property
    def stats(self) -> dict[str, int]:
        return dict(zip(STATS, self._st.tolist()))

    @property
    def last_tokens(self) -> int:
        """The draft tokens the last :meth:`decide` or :meth:`step` chose."""
        return int(self._last[1] - self._last[0])

    def _grow(self, rows: int) -> None:
        if rows <= self._cap:
            return
        cap = max(rows, 2 * self._cap)
        specs = {"rowf": (np.float64, (3, cap)), "bk": (np.float64, (5, 3 * N_BUCKETS)),
                 "probs": (np.float64, (cap, self.k_max + 1)), "hist": (np.float64, (5, N_BINS)),
                 "ri": (np.int32, (3, cap)), "prev": (np.int32, (cap, self.k_max + 3)),
                 "st": (np.int64, (len(STATS),)), "last": (np.int64, (2,))}
        self._buffers, v = slab({name: specs[name] for name in _SLABS})
        v["rowf"][0] = 1.0
        if self._cap:  # the evidence moves to the new buffers
            v["rowf"][:, : self._cap] = self._rowf
            for name in ("bk", "st", "last"):
                v[name][:] = getattr(self, "_" + name)
        self._rowf, self._bk, self._probs, self._hist = v["rowf"], v["bk"], v["probs"], v["hist"]
        self._ri, self._prev, self._st, self._last = v["ri"], v["prev"], v["st"], v["last"]
        self.p_bucket = self._bk[3]
        self._nn_ok = np.zeros(cap, np.bool_)
        self._unbranched = np.zeros(cap, np.int32)  # ``branched`` where the caller gives none
        self._last[0] = -1  # no last step to score: the rows moved
        self._cap = cap
        self._views: tuple | None = None

    # -- rows: each request's own acceptance evidence --

    def rows(self, request_ids: Sequence[Any]) -> None:
        """Name the rows of the next :meth:`decide` (any hashable ids); a row keeps its request's evidence
        when requests move between rows. Without it, rows are positions."""
        ids = list(request_ids)
        if ids == self._rows:
            return
        if self._rows is not None:
            for i, rid in enumerate(self._rows):
                self._saved[rid] = (self._rowf[1, i], self._rowf[2, i])
        self._grow(len(ids))
        for i, rid in enumerate(ids):
            num, den = self._saved.pop(rid, (0.0, 0.0))
            self._rowf[:, i] = ((1.0 + num) / (1.0 + den), num, den)
        self._rows = ids

    def forget(self, request_id: Any) -> None:
        """A finished request: drop its evidence."""
        self._saved.pop(request_id, None)
        if self._rows is not None and request_id in self._rows:
            self._rowf[:, self._rows.index(request_id)] = (1.0, 0.0, 0.0)

    # -- the choice --

    def q_neural(self) -> float:
        """The neural drafter's estimated per-token acceptance."""
        w = self.prior_weight
        return (self._nn_hits + w * self.neural_prior) / (self._nn_trials + w)

    def neural_ratio(self) -> float:
        """A neural forward's cost as a share of a target forward over the same tokens, as now learnt: the
        median of its timings of the last ``4 * max_age`` steps (each against the target's cost model
        as it stands now, so that timings taken before the target's steps were timed count right) once there
        are two, else the lower of ``neural_cost`` and the one timing (one slow call, a lazy start or a
        recompile, moves nothing)."""
        m = min(self._nn_seen, self._nn_calls.shape[0])
        calls = self._nn_calls[:m]
        calls = calls[self._st[0] - calls[:, 4] <= 4 * self.cost.max_age]
        if not len(calls):
            return self.neural_cost
        c = self.cost
        target = c.seconds(np.maximum(calls[:, 1], 1).astype(np.int64)) \
            + np.maximum(calls[:, 2] - 1, 0) * c.seconds(np.maximum(calls[:, 3], 1).astype(np.int64))
        ratios = np.sort(calls[:, 0] / target)
        if len(ratios) >= 2:  # the median: its calls mix catch-ups and drafting forwards of other shapes
            return float(ratios[(len(ratios) - 1) // 2])
        return float(min(self.neural_cost, ratios[0]))

    def _batch(self, b: int) -> tuple:
        """Views of the row state for a batch of ``b`` rows, reused while the batch keeps its size."""
        if b > self._cap:
            self._grow(b)
        v = self._views
        if v is None or v[0] != b:
            v = self._views = (b, self._rowf[:, :b], self._probs[:b], self._ri[:, :b], self._nn_ok[:b],
                               self._ri[2, :b], self._ri[0, :b], self._prev[:b])
        return v

    def decide(self, match_len: np.ndarray, offered: np.ndarray, neural_k: int = 0, neural_rows: Any = None,
               neural_behind: int = 0, catchup_share: float = 1.0, count: bool = True,
               branched: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each row's draft length and source for this step.

        Args:
            match_len: int [B]: each row's match length (tokens; <= 0: no automaton draft).
            offered: int [B]: the automaton draft tokens on offer per row (cut to ``k_max``).
            branched: int32 [B] or None: 1 where the row's match went on with several tokens
                earlier (``SpecEngine.extend``'s ``branch_out``); None: none did.
            neural_k: the most tokens the neural drafter makes per row this step (0: none).
            neural_rows: bool [B]: rows the neural drafter may draft for (default all, where
                ``neural_k > 0``).
            neural_behind: tokens the neural drafter must read before it drafts (its catch-up;
                ignored where the catch-up is sunk).
            catchup_share: the share of the catch-up this step is charged (a catch-up over a long
                stretch, like the prompt, serves the neural steps after it too), in (0, 1].
            count: False for a look-ahead that is not a step (not counted in :attr:`stats`).

        Returns:
            ``(lengths, sources)``: int32 [B] and int32 [B] (:data:`NONE`, :data:`AUTOMATON`,
            :data:`NEURAL`), views the next call overwrites. A row with length 0 has source NONE.

        Raises:
            ValueError: arrays of other shapes, or a negative ``neural_k``.
        """
        b = match_len.shape[0]
        if offered.shape != (b,):
            raise ValueError(f"offered must have shape ({b},), got {offered.shape}")
        branched = self._branched(branched, b)
        if neural_k < 0:
            raise ValueError(f"neural_k must be >= 0, got {neural_k}")
        if self._rows is not None and len(self._rows) != b:
            self._rows = None  # positions: the caller named no rows for this batch
        _, rowf, probs, ri, nn_ok, lengths, src, _ = self._batch(b)
        q_nn = ratio = catch = 0.0
        if neural_k > 0:
            nn_ok[:] = True if neural_rows is None else np.asarray(neural_rows, dtype=np.bool_)
            q_nn, ratio = self.q_neural(), self.neural_ratio()
            if not self.catchup_sunk:
                catch = self.cost.seconds(max(int(neural_behind), 1)) * min(max(float(catchup_share), 0.0), 1.0)
        c = self.cost
        rate, plain, nk, tokens = _allocate(match_len, offered, branched, nn_ok, q_nn, int(neural_k), ratio, catch,
                                            self.k_max, rowf, self._bk, probs, ri, self._hist, self._st, bool(count),
                                            *c.arrays()[:3], self.step_tolerance)
        if count:
            self._last[:] = (b, b + tokens)
            self.neural_k = int(nk)
            if self.log is not None:
                self.log(Decision(int(self._st[0]), lengths.copy(), src.copy(), float(rate), float(plain), int(nk)))
        return lengths, src

    def step(self, match_len: np.ndarray, offered: np.ndarray, drafts: np.ndarray, new: np.ndarray,
             new_lens: np.ndarray, seconds: float, same_rows: bool, branched: np.ndarray | None = None,
             step_tokens: int = 0) -> np.ndarray:
        """One step of an engine without a neural drafter, in one jitted call: where ``same_rows``,
        first the last step's forward (``seconds``; it verified the rows and the draft tokens the last
        call chose) and what followed each row's last offer, then this step's choice.

        Args:
            match_len: int32 [B]: each row's match length (<= 0: no automaton draft).
            offered: int32 [B]: the automaton draft tokens on offer per row (cut to ``k_max``).
            drafts: int32 [B, >= 1]: the offered drafts (kept, up to ``k_max`` tokens, for the next call).
            new: int32 [B, >= max(new_lens)]: the tokens each row emitted since the last call.
            new_lens: int32 [B]: how many (0: none).
            seconds: the last step's forward; not finite or not > 0: ignored (counted).
            same_rows: the rows are the last call's requests, in the same order (else nothing is scored
                or timed: a row's evidence moves with :meth:`rows`).
            branched: int32 [B] or None: as in :meth:`decide`.
            step_tokens: the tokens the timed forward processed, where the engine knows them (vLLM's
                scheduled tokens: a step that also prefills other requests costs what it processed);
                0: the rows and draft tokens the last call chose.

        Returns:
            int32 [B]: each row's draft length (a view the next call overwrites).

        Raises:
            ValueError: arrays of other shapes.
        """
        b = match_len.shape[0]
        if not (offered.shape == new_lens.shape == (b,) and drafts.shape[0] == b and new.shape[0] == b):
            raise ValueError("match_len, offered, drafts, new and new_lens must have the same rows")
        seconds = check_timing(seconds, "seconds")  # TypeError unless a real number (None, a bool)
        if self._rows is not None and len(self._rows) != b:
            self._rows = None
        v = self._batch(b)
        tail = self._step_tail
        if tail is None or tail[0] is not self._buffers or tail[1] is not self.cost:  # kept while they stay
            c, f = self.cost, self._buffers
            tail = self._step_tail = (f, c, (self.k_max, f[np.float64], f[np.int32], f[np.int64],
                                             self.settings.row_memory, self.prior_weight, self.step_tolerance,
                                             *c.slabs(), c.max_age, c.quantile))
        rate, plain = _step(match_len, offered, self._branched(branched, b), drafts, new, new_lens, seconds,
                            int(step_tokens), same_rows, *tail[2])
        lengths, src = v[5], v[6]
        self.neural_k = 0
        if self.log is not None:
            self.log(Decision(int(self._st[0]), lengths.copy(), src.copy(), float(rate), float(plain), 0))
        return lengths

    # -- what followed --

    def observe_step(self, tokens: int, seconds: float) -> None:
        """The step's target forward verified ``tokens`` tokens (rows plus draft tokens) in ``seconds``
        (the neural drafter's time apart). A timing that is not finite and > 0 is ignored."""
        self._st[_ST["timed" if self.cost.observe(int(tokens), seconds) else "ignored_timings"]] += 1
        if self.settings.neural_memory < 1.0:
            self._nn_hits *= self.settings.neural_memory
            self._nn_trials *= self.settings.neural_memory

    def observe_neural(self, seconds: float, read: int, drafted: int, rows: int = 1) -> None:
        """One neural drafter call: ``seconds``, after reading ``read`` tokens (its catch-up; its first
        forward), drafting ``drafted`` tokens per row for ``rows`` rows. Ignored when not finite and > 0."""
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            return
        self._nn_calls[self._nn_seen % self._nn_calls.shape[0]] = (seconds, read, drafted, rows, self._st[0])
        self._nn_seen += 1

    def observe_neural_outcome(self, drafted: int, accepted: int) -> None:
        """A neural draft of ``drafted`` tokens of which the first ``accepted`` were accepted."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        self._nn_hits += accepted
        self._nn_trials += accepted + (1 if accepted < drafted else 0)

    def observe(self, match_len: np.ndarray, offered: np.ndarray, drafts: np.ndarray, new: np.ndarray,
                new_lens: np.ndarray, branched: np.ndarray | None = None) -> None:
        """Score each row's automaton offer of the last :meth:`decide` against what followed.

        Args:
            match_len: int [B]: the match lengths given to :meth:`decide`.
            branched: int32 [B] or None: as given to :meth:`decide`.
            offered: int [B]: the automaton's offered draft lengths (verified or not).
            drafts: int [B, >= max(offered)]: the offered drafts.
            new: int [B, >= max(new_lens)]: the tokens each row emitted this step.
            new_lens: int [B]: how many (0: the row emitted nothing).
        """
        b = int(match_len.shape[0])
        if not (offered.shape == new_lens.shape == (b,) and drafts.shape[0] == b and new.shape[0] == b):
            raise ValueError("match_len, offered, drafts, new and new_lens must have the same rows")
        _score(match_len, offered, self._branched(branched, b), drafts, new, new_lens, self._batch(b)[1], self._bk,
               self.settings.row_memory, self.prior_weight)

    def _branched(self, branched: Any, b: int) -> np.ndarray:
        """``branched`` as int32 [b] (zeros where None); raises ``ValueError`` naming a wrong shape."""
        if branched is None:
            self._grow(b)
            return self._unbranched[:b]
        out = np.asarray(branched)
        if out.shape != (b,):
            raise ValueError(f"branched must have shape ({b},), got {out.shape}")
        return out if out.dtype == np.int32 else out.astype(np.int32)

    def q_automaton(self, match: int, row: int = 0, branched: bool = False) -> float:
        """The estimated chance the automaton's next draft token at a match of ``match`` is accepted
        (for row ``row`` of the last batch; ``branched``: the match went on with several tokens earlier)."""
        q = self.p_bucket[match_bucket(max(int(match), 0)) + (N_BUCKETS if branched else 0)]
        odds = q / (1 - q) * self._rowf[0, row]
        return float(odds / (1 + odds))


class CatchUpShare:
    """The share of a neural drafter's catch-up that a step is charged, and the step's choice with it.

    A neural drafter that skipped steps must read what it skipped before it
    drafts again. Charged whole to the step that ends the skip, a long catch-up
    would keep the neural drafter out for good, and the skipped span grows
    while it is out; charged too little, it reads a long span for one draft
    and falls behind again at the next automaton step. A step is charged each
    part of the catch-up over the neural steps that part serves:

    - a first read (the prompt, where the drafter has never run for a row)
      serves every neural step of the request after it: the share of recent
      steps whose best choice, were the drafter in step, was the neural
      drafter, times the steps left (``remaining`` tokens over the tokens per
      step so far);
    - a gap (the tokens of the automaton's steps since the drafter last ran)
      serves one run of neural steps: the mean length of recent runs of steps
      whose best choice, in step, was the neural drafter (1 before any). In a
      code edit the neural drafter is best only at isolated steps between the
      automaton's copies, so its gaps are charged whole; in free text its
      runs are long.
    """

    def __init__(self) -> None:
        self.prefer_neural = 0.5  # the share of recent steps whose best choice, in step, was the neural drafter
        self.run_len = 1.0  # the mean length of recent runs of such steps
        self.per_step = 1.0  # tokens per row and step so far (mean of the latest 32)
        self._steps = 0
        self._run = 0  # the length of the current run

    def observe_tokens(self, tokens: float) -> None:
        """A step emitted ``tokens`` tokens per row."""
        self._steps += 1
        self.per_step += (float(tokens) - self.per_step) / min(self._steps, 32)

    def _count(self, src: np.ndarray) -> None:
        """Count a step's best choice in step (``src``: each row's source)."""
        prefer = bool(np.any(src == NEURAL))
        self.prefer_neural = 0.9 * self.prefer_neural + 0.1 * float(prefer)
        if prefer:
            self._run += 1
        elif self._run:
            self.run_len += 0.25 * (self._run - self.run_len)
            self._run = 0

    def share(self, policy: DraftPolicy, match_len: np.ndarray, offered: np.ndarray, neural_k: int, neural_rows: Any,
              behind: int, in_step: int, remaining: int | None = None, first: int = 0,
              branched: np.ndarray | None = None) -> float:
        """The share, in (0, 1], of the cost of a catch-up over ``behind`` tokens that this step is charged,
        where a drafter in step would read ``in_step`` (charged whole) and ``first`` of the others are first
        reads; the other arguments are ``policy.decide``'s (``remaining``: tokens a row may still emit; None:
        256 assumed). Call it (or :meth:`decide`) once per step: it also counts the step's best choice in
        step."""
        if not neural_k:
            return 1.0
        _, src = policy.decide(match_len, offered, neural_k, neural_rows, neural_behind=in_step, count=False,
                               branched=branched)
        self._count(src)
        if behind <= in_step:
            return 1.0
        left = 256 if remaining is None else max(int(remaining), 1)
        extra = behind - in_step  # what it reads beyond a forward in step, which the step pays whole
        first = min(max(int(first), 0), extra)
        serves_first = max(1.0, self.prefer_neural * left / max(self.per_step, 1.0))
        serves_gap = max(1.0, self.run_len, float(self._run))
        part = (first / serves_first + (extra - first) / serves_gap) / extra
        whole, own = policy.cost.seconds(behind), policy.cost.seconds(in_step)
        return min(1.0, (own + part * max(whole - own, 0.0)) / whole)

    def decide(self, policy: DraftPolicy, match_len: np.ndarray, offered: np.ndarray, neural_k: int,
               neural_rows: Any, behind: int, in_step: int, remaining: int | None = None,
               first: int = 0, branched: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``policy.decide`` for this step with the catch-up's share charged (arguments as :meth:`share`).
        Where the drafter is in step (``behind <= in_step``) its choice in step is the step's choice: one
        allocation, not two."""
        if neural_k and behind <= in_step:
            lengths, src = policy.decide(match_len, offered, neural_k, neural_rows, neural_behind=behind,
                                         branched=branched)
            self._count(src)
            return lengths, src
        share = self.share(policy, match_len, offered, neural_k, neural_rows, behind, in_step, remaining, first,
                           branched)
        return policy.decide(match_len, offered, neural_k, neural_rows, neural_behind=behind, catchup_share=share,
                             branched=branched)


class SequencePolicy:
    """:class:`DraftPolicy` for one sequence (batch 1), in the call pattern of a decoding loop.

    Each step the loop:

    1. offers the automaton's draft (:meth:`offer`, before cutting it);
    2. asks :meth:`choose` for ``(source, length)``: ``"sa"``, ``"draft"``
       (the neural drafter) or ``"none"``;
    3. times the target forward (:meth:`observe_forward`; the neural drafter's
       calls apart, :meth:`observe_draft_call` or per forward
       :meth:`observe_draft_forward`), reports the neural draft's outcome
       (:meth:`observe` with ``"draft"``) and the tokens the step emitted
       (:meth:`observe_tokens`, which scores the automaton's offer).

    A neural drafter that must first read a long stretch (the prompt, when it
    has not drafted before) is charged a share of that catch-up
    (:class:`CatchUpShare`).

    Args:
        k_max: the most draft tokens of any source (>= 1).
        cost, settings, neural_catchup_sunk, log, clock: as :class:`DraftPolicy`.

    Attributes:
        policy: the :class:`DraftPolicy`.
        stats: ``steps``, ``sa``, ``draft``, ``none`` (steps by choice) and the policy's counters.
    """

    SOURCES = ("sa", "draft")

    def __init__(self, k_max: int, *, cost: StepCost | None = None, settings: PolicySettings | None = None,
                 neural_catchup_sunk: bool = False, log: Callable[[Decision], Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.policy = DraftPolicy(k_max, cost=cost, settings=settings, neural_catchup_sunk=neural_catchup_sunk,
                                  log=log, clock=clock)
        self.k_max = self.policy.k_max
        self.clock = clock
        self._offer: tuple[int, list[int], int] | None = None
        self._m = np.zeros(1, np.int64)
        self._off = np.zeros(1, np.int64)
        self._br = np.zeros(1, np.int32)
        self.catch_up = CatchUpShare()
        self._drafted = False  # the neural drafter has drafted in this sequence (begin: a new one): a gap
        self._counts = {"steps": 0, "sa": 0, "draft": 0, "none": 0}

    @classmethod
    def for_engine(cls, k_max: int, *, device: str = "cpu", settings: PolicySettings | None = None,
                   max_tokens: int | None = None, neural_catchup_sunk: bool = False,
                   log: Callable[[Decision], Any] | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> SequencePolicy:
        """The sequence policy an engine uses, with its cost model, as :meth:`DraftPolicy.for_engine`
        (same arguments and errors)."""
        ps = settings if settings is not None else PolicySettings()
        return cls(k_max, cost=engine_cost(ps, device, max_tokens), settings=ps,
                   neural_catchup_sunk=neural_catchup_sunk, log=log if log is not None else env_log(), clock=clock)

    @property
    def stats(self) -> dict[str, int]:
        return {**self.policy.stats, **self._counts}

    def offer(self, match: int, draft: Sequence[int], branched: bool = False) -> None:
        """The automaton's draft this step (before :meth:`choose` cuts it), made at a match of ``match``
        (``branched``: whose earlier occurrences went on with several tokens, ``SingleSequence.branched``)."""
        has = len(draft) and match > 0
        self._offer = (int(match), [int(t) for t in draft][: self.k_max], int(bool(branched))) if has else None
        self._br[0] = int(bool(branched)) if has else 0

    def withdraw_offer(self) -> None:
        """Drop the pending offer unscored (its sequence ended or changed)."""
        self._offer = None

    def begin(self) -> None:
        """A new sequence starts (a policy may serve several in turn): what the neural drafter has not read of
        it is a first read (its prompt), not a gap; a pending offer is dropped unscored."""
        self._offer = None
        self._drafted = False

    def choose(self, match: int, sa_len: int, model_k: int = 0, model_behind: int = 1,
               remaining: int | None = None) -> tuple[str, int]:
        """``(source, length)`` for this step: ``"sa"`` with up to ``sa_len`` tokens (the automaton's
        draft at a match of ``match``), ``"draft"`` with up to ``model_k`` neural tokens (it first reads
        the ``model_behind`` tokens it has not seen), or ``("none", 0)``. ``remaining``: the tokens the
        sequence may still emit (None: unknown, 256 assumed)."""
        self._counts["steps"] += 1
        self._m[0] = match if sa_len > 0 else 0
        self._off[0] = min(max(int(sa_len), 0), self.k_max)
        k_nn = min(max(int(model_k), 0), self.k_max)
        lengths, src = self.catch_up.decide(self.policy, self._m, self._off, k_nn, None, model_behind, 1, remaining,
                                            first=0 if self._drafted else model_behind, branched=self._br)
        d, s = int(lengths[0]), int(src[0])
        self._drafted |= s == NEURAL
        if s == AUTOMATON:
            self._counts["sa"] += 1
            return "sa", d
        if s == NEURAL:
            self._counts["draft"] += 1
            return "draft", d
        self._counts["none"] += 1
        return "none", 0

    def observe_forward(self, tokens: int, seconds: float) -> None:
        """A target forward over ``tokens`` tokens took ``seconds`` (ignored unless finite and > 0)."""
        self.policy.observe_step(tokens, seconds)

    def observe_draft_call(self, seconds: float, read: int, drafted: int) -> None:
        """A neural drafter call: ``seconds``, reading ``read`` tokens first, drafting ``drafted``."""
        self.policy.observe_neural(seconds, read, drafted)

    def observe_draft_forward(self, seconds: float, read: int) -> None:
        """One neural drafter forward over ``read`` tokens took ``seconds``."""
        self.policy.observe_neural(seconds, read, 1)

    def observe(self, source: str, match: int, drafted: int, accepted: int) -> None:
        """A step verified ``drafted`` tokens from ``source`` and accepted the first ``accepted``. The
        automaton's offers are scored by :meth:`observe_tokens` (this ignores ``"sa"``)."""
        if source not in self.SOURCES:
            raise ValueError(f"unknown source {source!r}; choose from {', '.join(self.SOURCES)}")
        if source == "draft":
            self.policy.observe_neural_outcome(int(drafted), int(accepted))
        elif not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")

    def observe_tokens(self, tokens: Sequence[int]) -> None:
        """The tokens the step emitted (accepted drafts and the target's own), in order."""
        tokens = [int(t) for t in tokens]
        self.catch_up.observe_tokens(len(tokens))
        if self._offer is None or not tokens:
            self._offer = None
            return
        match, draft, branched = self._offer
        self._offer = None
        n = min(len(draft), len(tokens))
        d = np.asarray(draft[:n], np.int64).reshape(1, n)
        t = np.asarray(tokens[:n], np.int64).reshape(1, n)
        self.policy.observe(np.array([match], np.int64), np.array([n], np.int64), d, t, np.array([n], np.int64),
                            np.array([branched], np.int32))
