"""The allocation kernels: each row's cumulative acceptance chances, the one threshold per step that
gives the most tokens per second under the step-cost table, and each row's draft length and source
(see :mod:`saspec.policy`).

The per-row and per-step pieces are ``register_jitable`` functions without allocation, compiled for the
host (:func:`allocate`, ``DraftPolicy``) and for CUDA (``saspec.device.policy_kernel``, the automaton-only step)
from this one source. The histogram's sums are fixed-point integers held in float64 (:data:`FIX`): sums of
integers below 2**53 are exact in any order, so device threads may add them in any order and the host and
the device rank the same tokens the same way.
"""

from __future__ import annotations

from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import int64, njit
from numba.extending import register_jitable

from .acceptance import token_run
from .core import NO_NRT, host_inline
from .portable import add_at, add_at2, fmul
from .step_cost import cost_of

#: Row sources, as :meth:`DraftPolicy.decide` returns them.
NONE, AUTOMATON, NEURAL = 0, 1, 2
SOURCE_NAMES = ("none", "automaton", "neural")

#: Bins of the per-token acceptance histogram the allocation ranks by.
N_BINS = 64
#: The histogram's sums hold each row's run of one bin (the sum of its tokens' chances, summed in the row's
#: order) times ``FIX``, floored: integers, exact in any order while a bin's tokens number below 2**21
#: (``DevicePolicy`` checks rows x K against that).
FIX = 2.0 ** 32
INV_FIX = 1.0 / FIX
#: The histogram's rows (float64 [HIST_ROWS, N_BINS]): the step's counts and sums per bin, the rate down to
#: each bin, the automaton's own counts and sums, and the neural drafter's (all scratch).
H_CNT, H_SUM, H_RATE, H_AUTO_CNT, H_AUTO_SUM, H_NN_CNT, H_NN_SUM = range(7)
HIST_ROWS = 7

#: DraftPolicy.stats' counters, in the order the kernels count them.
STATS = ("steps", "rows", "automaton_rows", "neural_rows", "none_rows", "automaton_tokens", "neural_tokens",
         "neural_steps", "plain_steps", "timed", "ignored_timings")


@register_jitable
def fixed(p):
    """``p`` in the histogram's fixed point (see :data:`FIX`)."""
    return float(int64(fmul(p, FIX)))


@host_inline
def clear_automaton_hist(hist, j):
    """Empty bin ``j`` of the automaton's histogram (before :func:`row_probs_row` counts a step)."""
    hist[H_AUTO_CNT, j] = 0.0
    hist[H_AUTO_SUM, j] = 0.0


@host_inline
def row_probs_row(b, s, match, offered, branched, rowf, odds_bucket, k_max, probs, hist):
    """Row ``b``'s automaton candidates (returned: ``offered`` cut to ``k_max``, none without a match):
    probs[b, i], the chance that its draft tokens 0..i are all accepted (0 at the candidates' end, when that
    is below ``k_max``), and the expected accepted tokens of its whole draft in probs[b, k_max]; its
    candidates counted into the automaton histogram (``hist[H_AUTO_CNT]``, ``hist[H_AUTO_SUM]``, with
    ``add_at2``). The row's odds factor is ``rowf[0, s]``. The tokens of one match bucket share its per-token
    chance: one division per bucket; ``p`` falls along a row, so its bins do too, and a bin changes only
    where ``p`` drops below the bin's floor."""
    p = 1.0
    e = 0.0
    d = max(min(int64(offered), int64(k_max)), int64(0)) if match > 0 else int64(0)
    run_bin = int64(N_BINS - 1)
    cnt = 0.0
    tot = 0.0
    i = int64(0)
    while i < d:
        j, stop = token_run(match, i, branched, d)
        odds = fmul(odds_bucket[j], rowf[0, s])
        a = odds / (1.0 + odds)
        a2 = fmul(a, a)
        a3 = fmul(a2, a)
        a4 = fmul(a2, a2)
        while i < stop:
            if i + 4 <= stop and fmul(fmul(p, a4), N_BINS) >= run_bin:
                # four tokens of one bin at a time, off one product: no chain of multiplications
                p1 = fmul(p, a)
                p2 = fmul(p, a2)
                p3 = fmul(p, a3)
                p4 = fmul(p, a4)
                probs[b, i] = p1
                probs[b, i + 1] = p2
                probs[b, i + 2] = p3
                probs[b, i + 3] = p4
                add = (p1 + p2) + (p3 + p4)
                e += add
                cnt += 4.0
                tot += add
                p = p4
                i += 4
                continue
            p = fmul(p, a)
            probs[b, i] = p
            e += p
            if fmul(p, N_BINS) < run_bin:  # a new bin
                if cnt > 0.0:
                    add_at2(hist, H_AUTO_CNT, run_bin, cnt)
                    add_at2(hist, H_AUTO_SUM, run_bin, fixed(tot))
                run_bin = min(int64(fmul(p, N_BINS)), int64(N_BINS - 1))
                cnt = 0.0
                tot = 0.0
            cnt += 1.0
            tot += p
            i += 1
    if cnt > 0.0:
        add_at2(hist, H_AUTO_CNT, run_bin, cnt)
        add_at2(hist, H_AUTO_SUM, run_bin, fixed(tot))
    if d < k_max:
        probs[b, d] = 0.0
    probs[b, k_max] = e
    return d


@register_jitable
def running_rate(rate, curve, index, knot):
    """The running rate (tokens a second) of ``rate`` (float64 [5]: the decayed sums of the tokens the rows
    emitted, of the tokens the steps verified, of the steps, and of the neural drafter's modeled seconds; then
    the last step's neural seconds), its steps priced at the step-cost table as it stands now (at their mean
    size: a table that is still learning its scale prices every past step anew); 0 before any step. A step's
    own best rate falls short of it at a short match (prose), where the tokens it would draft deep are drafted
    at the next step from a longer match anyway."""
    if rate[2] <= 0.0:
        return 0.0
    size = max(int64(rate[1] / rate[2] + 0.5), int64(1))
    seconds = fmul(rate[2], cost_of(size, curve, index, knot)) + rate[3]
    if seconds <= 0.0:
        return 0.0
    return rate[0] / seconds


@register_jitable
def update_rate(rate, new_lens, rows, memory, tokens):
    """Add the last step to ``rate`` (see :func:`running_rate`), after decaying its sums by ``memory``: the
    tokens its ``rows`` rows emitted (``new_lens``; no more than it verified), the ``tokens`` its forward
    verified, and its neural seconds. Nothing where no step was chosen (``tokens`` 0) or ``memory`` is 0."""
    if tokens <= 0 or memory <= 0.0:
        return
    emitted = 0.0
    for r in range(rows):
        emitted += new_lens[r]
    # a step emits no more than it verified: tokens that came another way (a caller's own) add no rate
    emitted = min(emitted, float(tokens))
    rate[0] = fmul(rate[0], memory) + emitted
    rate[1] = fmul(rate[1], memory) + float(tokens)
    rate[2] = fmul(rate[2], memory) + 1.0
    rate[3] = fmul(rate[3], memory) + rate[4]


@register_jitable
def best_threshold(probs, k_max, src, q_nn, k_nn, base, fixed_s, curve, index, knot, hist, tol, lam):
    """The histogram pass over a step of ``base`` rows: (rate, bin, floor bin) of the best threshold over the
    rows' candidate tokens (automaton rows: probs; neural rows (src == 2): q_nn ** (i + 1), i < k_nn); bin
    N_BINS means no draft. With more than one row and ``tol > 0``, the highest threshold (the fewest tokens)
    whose rate is within ``tol`` of the best. With a running rate ``lam > 0`` (tokens a second), no lower
    threshold than the one that earns the most tokens less ``lam`` times the step's seconds (see
    :func:`running_rate`); the floor bin is the one without it (rows keep its tokens within their match:
    :func:`row_length`). Without neural rows (``k_nn == 0``) the automaton histogram of
    :func:`row_probs_row` is the histogram (every row with candidates has src 1 then) and neither ``probs``
    nor ``src`` is read."""
    for j in range(N_BINS):
        hist[H_RATE, j] = 0.0
        if k_nn == 0:
            hist[H_CNT, j] = hist[H_AUTO_CNT, j]
            hist[H_SUM, j] = hist[H_AUTO_SUM, j]
        else:
            hist[H_CNT, j] = 0.0
            hist[H_SUM, j] = 0.0
            hist[H_NN_CNT, j] = 0.0
            hist[H_NN_SUM, j] = 0.0
    if k_nn > 0:
        # the neural rows' candidates are alike: counted once, added per row
        p = 1.0
        for i in range(k_nn):
            p = fmul(p, q_nn)
            j = min(int64(fmul(p, N_BINS)), int64(N_BINS - 1))
            hist[H_NN_CNT, j] += 1.0
            hist[H_NN_SUM, j] += fixed(p)
        for b in range(base):
            if src[b] == 2:
                for j in range(N_BINS):
                    hist[H_CNT, j] += hist[H_NN_CNT, j]
                    hist[H_SUM, j] += hist[H_NN_SUM, j]
            elif src[b] == 1:
                # p falls along a row, so its bins do too: add each run of one bin at once
                run_bin = int64(-1)
                cnt = 0.0
                tot = 0.0
                for i in range(k_max):
                    p = probs[b, i]
                    if p <= 0.0:
                        break
                    j = min(int64(fmul(p, N_BINS)), int64(N_BINS - 1))
                    if j != run_bin:
                        if cnt > 0.0:
                            hist[H_CNT, run_bin] += cnt
                            hist[H_SUM, run_bin] += fixed(tot)
                        run_bin = j
                        cnt = 0.0
                        tot = 0.0
                    cnt += 1.0
                    tot += p
                if cnt > 0.0:
                    hist[H_CNT, run_bin] += cnt
                    hist[H_SUM, run_bin] += fixed(tot)
    seconds = cost_of(base, curve, index, knot) + fixed_s
    plain = base / seconds
    best = plain
    best_bin = int64(N_BINS)
    # what the step earns at the running rate: its tokens less what its seconds would have made
    net = base - fmul(lam, seconds)
    net_bin = int64(N_BINS)
    n = int64(base)
    e_fix = 0.0
    for j in range(N_BINS - 1, -1, -1):
        if hist[H_CNT, j] == 0.0:
            continue
        n += int64(hist[H_CNT, j])
        e_fix += hist[H_SUM, j]
        tokens = base + fmul(e_fix, INV_FIX)
        seconds = cost_of(n, curve, index, knot) + fixed_s
        r = tokens / seconds
        hist[H_RATE, j] = r
        if r > best:
            best = r
            best_bin = int64(j)
        v = tokens - fmul(lam, seconds)
        if v > net:
            net = v
            net_bin = int64(j)
    if tol > 0.0 and base > 1 and best_bin < N_BINS:
        # Where the rate is flat near its best (a compute-bound step), the extra tokens buy next to nothing
        # and make the step longer for every row in it and for the prefills that wait for it.
        floor = fmul(1.0 - tol, best)
        if plain >= floor:
            best, best_bin = plain, int64(N_BINS)
        else:
            for j in range(N_BINS - 1, best_bin, -1):
                if hist[H_CNT, j] > 0.0 and hist[H_RATE, j] >= floor:
                    best, best_bin = hist[H_RATE, j], int64(j)
                    break
    floor_bin = best_bin
    if lam > 0.0 and net_bin > best_bin:
        # A step whose own best rate is below the running rate (a short match) drafts only the tokens that
        # pay at the running rate: a token it skips is drafted at the next step from a longer match.
        best_bin = net_bin
        best = plain if net_bin >= N_BINS else hist[H_RATE, net_bin]
    return best, best_bin, floor_bin


@host_inline
def automaton_length(probs, b, cands, best_bin):
    """Row ``b``'s automaton draft length at the step's threshold bin ``best_bin``: its tokens in a bin
    >= ``best_bin`` are a prefix of its ``cands`` candidates (p falls along the row): bisect for its end."""
    if best_bin >= N_BINS:
        return int64(0)
    lo = int64(0)
    hi = int64(cands)
    while lo < hi:
        mid = (lo + hi) >> 1
        if fmul(probs[b, mid], N_BINS) < best_bin:
            hi = mid
        else:
            lo = mid + 1
    return lo


@host_inline
def row_length(probs, b, cands, best_bin, floor_bin, match):
    """Row ``b``'s automaton draft length at the step's bin ``best_bin``, but no shorter than its tokens
    within its match (``match``) at ``floor_bin``, the bin without the running rate: the running rate cuts
    only the tokens deeper than the match showed, the ones the next step drafts again from a longer match (a
    timing that makes a longer step look dear, times a high running rate, cannot stop a copy)."""
    d = automaton_length(probs, b, cands, best_bin)
    if floor_bin < best_bin:
        top = min(int64(cands), int64(match))
        while d < top and fmul(probs[b, d], N_BINS) >= floor_bin:  # p falls along the row: a prefix
            d += 1
    return d


@host_inline
def count_row(st, src, d):
    """Count a row's choice (source ``src``, ``d`` tokens; none where ``d == 0``) into the counters ``st``
    (the order of :data:`STATS`), with ``add_at``."""
    if d == 0:
        add_at(st, 4, 1)
    elif src == AUTOMATON:
        add_at(st, 2, 1)
        add_at(st, 5, d)
    else:
        add_at(st, 3, 1)
        add_at(st, 6, d)


@host_inline
def count_step(st, rows, neural, tokens):
    """Count a step of ``rows`` rows, ``tokens`` draft tokens (``neural``: the neural drafter drafted)."""
    st[0] += 1
    st[1] += rows
    st[7] += neural
    st[8] += tokens == 0


@njit(cache=True, **NO_NRT)
def allocate(match, offered, branched, nn_ok, q_nn, k_nn, nn_fwd, nn_catch, k_max, rowf, bk, probs, ri, hist, st,
             count, curve, index, knot, tol, lam):
    """Each row's draft length (ri[2]) and source (ri[0]); see the module doc, ``lam`` the running rate
    (:func:`running_rate`). Counts the step into ``st`` where ``count``. Compiled without reference counting
    (``core.NO_NRT``: it allocates nothing; every per-row call would pay an incref and a decref per array).
    Returns (rate, plain rate, neural k, draft tokens, the neural drafter's modeled seconds). Without the neural
    drafter (``k_nn == 0``) this is the sequence of calls the device step makes (``saspec.device.policy_kernel``)."""
    rows = match.shape[0]
    src, alt, lengths = ri[0], ri[1], ri[2]
    for j in range(N_BINS):
        clear_automaton_hist(hist, j)
    for b in range(rows):
        lengths[b] = row_probs_row(b, b, match[b], offered[b], branched[b], rowf, bk[4], k_max, probs, hist)
        src[b] = AUTOMATON if lengths[b] > 0 else NONE
    one = cost_of(rows, curve, index, knot)
    plain = rows / one
    best, best_bin, floor_bin = best_threshold(probs, k_max, src, q_nn, 0, rows, 0.0, curve, index, knot, hist, tol,
                                               lam)
    best_k = 0
    if k_nn > 0:  # the neural drafter at each of its lengths, for the rows it drafts better than the automaton
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
                    alt[b] = NEURAL
                    any_nn = True
            if not any_nn:
                continue
            fixed_s = nn_fwd * (nn_catch + (kk - 1) * one)
            r, bn, fb = best_threshold(probs, k_max, alt, q_nn, kk, rows, fixed_s, curve, index, knot, hist, tol,
                                       lam)
            if r > best:
                best, best_bin, floor_bin, best_k = r, bn, fb, kk
        if best_k > 0:
            e_nn = 0.0
            p = 1.0
            for i in range(best_k):
                p *= q_nn
                e_nn += p
            for b in range(rows):
                if nn_ok[b] and e_nn > probs[b, k_max]:
                    src[b] = NEURAL
    tokens = 0
    for b in range(rows):
        d = 0
        if src[b] == NEURAL:
            if best_bin < N_BINS:
                p = 1.0
                for i in range(best_k):
                    p = fmul(p, q_nn)
                    if min(int64(fmul(p, N_BINS)), int64(N_BINS - 1)) < best_bin:
                        break
                    d += 1
        elif src[b] == AUTOMATON:
            d = row_length(probs, b, lengths[b], best_bin, floor_bin, match[b])
        lengths[b] = d
        if d == 0:
            src[b] = NONE
        tokens += d
        if count:
            count_row(st, src[b], d)
    if count:
        count_step(st, rows, best_k > 0, tokens)
    neural_s = nn_fwd * (nn_catch + (best_k - 1) * one) if best_k > 0 else 0.0
    return best, plain, best_k, tokens, neural_s
