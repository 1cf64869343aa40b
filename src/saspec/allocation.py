"""The allocation kernels: each row's cumulative acceptance chances, the one threshold per step that
gives the most tokens per second under the step-cost table, and each row's draft length and source
(see :mod:`saspec.policy`)."""

from __future__ import annotations

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from .acceptance import token_run
from .step_cost import cost_of

#: Row sources, as :meth:`DraftPolicy.decide` returns them.
NONE, AUTOMATON, NEURAL = 0, 1, 2
SOURCE_NAMES = ("none", "automaton", "neural")

#: Bins of the per-token acceptance histogram the allocation ranks by.
N_BINS = 64

#: DraftPolicy.stats' counters, in the order the kernels count them.
STATS = ("steps", "rows", "automaton_rows", "neural_rows", "none_rows", "automaton_tokens", "neural_tokens",
         "neural_steps", "plain_steps", "timed", "ignored_timings")


@njit(cache=True)
def row_probs(match, offered, branched, rowf, odds_bucket, k_max, probs, ends, hist):
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
            j, stop = token_run(match[b], i, branched[b], d)
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
def best_threshold(probs, k_max, src, q_nn, k_nn, base, fixed_s, curve, index, knot, hist, tol):
    """The histogram pass: (rate, bin) of the best threshold over the rows' candidate tokens (automaton
    rows: probs; neural rows (src == 2): q_nn ** (i + 1), i < k_nn); bin N_BINS means no draft. With
    more than one row and ``tol > 0``, the highest threshold (the fewest tokens) whose rate is within
    ``tol`` of the best. Without neural rows the automaton histogram of :func:`row_probs` is the
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
def allocate(match, offered, branched, nn_ok, q_nn, k_nn, nn_fwd, nn_catch, k_max, rowf, bk, probs, ri, hist, st,
              count, curve, index, knot, tol):
    """Each row's draft length (ri[2]) and source (ri[0]); see the module doc. Counts the step into ``st``
    where ``count``. Returns (rate, plain rate, neural k, draft tokens)."""
    rows = match.shape[0]
    src, alt, lengths = ri[0], ri[1], ri[2]
    row_probs(match, offered, branched, rowf, bk[4], k_max, probs, lengths, hist)  # lengths: each row's candidates
    for b in range(rows):
        src[b] = 1 if lengths[b] > 0 else 0
    plain = rows / cost_of(rows, curve, index, knot)
    best, best_bin = best_threshold(probs, k_max, src, q_nn, 0, rows, 0.0, curve, index, knot, hist, tol)
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
            r, bn = best_threshold(probs, k_max, alt, q_nn, kk, rows, fixed, curve, index, knot, hist, tol)
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
