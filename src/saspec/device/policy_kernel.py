"""The drafting policy's step on the GPU: one CUDA kernel over the host's own policy functions.

``decide_kernel`` is ``DraftPolicy.step``'s choice for a batch without a
neural drafter (its timing apart, which the host observes), compiled with
``numba.cuda.jit`` from the same ``register_jitable`` functions the host
compiles with ``njit`` (``saspec.acceptance``, ``saspec.allocation``,
``saspec.step_cost.cost_of``), in the same order:

1. whether the rows are the last step's (their slots, in order, and no slot
   forgotten since): only then are the last step's offers scored;
2. each row's kept offer scored against the tokens it emitted
   (``score_kept``), then every match bucket re-estimated;
3. each row's cumulative acceptance chances and the step's histogram
   (``row_probs_row``);
4. the threshold under the step-cost table and the running rate (``update_rate``, ``best_threshold``);
5. each row's length and source (``row_length``), counted, and its
   offer kept for the next step.

One block runs it, its threads striding over the rows, the phases separated
by ``syncthreads``; the histogram's and the buckets' sums are integers (the
histogram in fixed point), added with atomics, exact in any order, and the
per-row work is sequential within its thread, so the lengths are the host's
bit for bit (``saspec.portable`` keeps the compiler from fusing products into
FMAs). A row's evidence and kept offer live at its slot (``slots[b]``); a slot
outside the state gets no draft and changes nothing.

Importing this module imports ``numba.cuda`` (numba-cuda).
"""

from __future__ import annotations

from numba import cuda, float64, int32, int64

from ..acceptance import estimate_bucket, keep_offer, score_kept
from ..allocation import (AUTOMATON, N_BINS, NONE, best_threshold, clear_automaton_hist, count_row, count_step,
                          row_length, row_probs_row, running_rate, update_rate)
from ..portable import add_at
from . import portable  # noqa: F401  (the CUDA implementations of the helpers above)
from . import runtime  # noqa: F401  (saspec's cache locator for the kernel below)


@cuda.jit(cache=True)
def decide_kernel(match, offered, branched, drafts, new, new_lens, slots, lengths, sources, rowf, prev, bk, probs,
                  hist, st, last, last_slots, rate, curve, index, knot, decay, w, tol, rate_memory):
    """One policy step over ``B = match.shape[0]`` rows; run it with one block (any number of threads).

    Rows (int32): match, offered, branched, new_lens, slots, lengths (out), sources (out): [B];
    drafts [B, >= 1]; new [B, >= 0]. State: rowf float64 [3, slots]; prev int32 [slots, K + 3];
    bk float64 [5, 3 * N_BUCKETS]; probs float64 [>= B, K + 1]; hist float64 [HIST_ROWS, N_BINS];
    st int64 [len(STATS)]; last int64 [5]: the last step's rows (-1: none to score) and its tokens, then this
    step's flags (its rows are the last step's; the threshold's bin; the bin without the running rate) in global
    memory, which every thread of the block reads after a ``syncthreads`` (the simulator's shared arrays are not
    thread-safe to create);
    last_slots int32 [>= B]; rate float64 [5]: the running rate (``saspec.allocation.running_rate``). The
    step-cost table: curve float64 [2, T + 1], index int64 [2, T + 1], knot float64 [4, knots]. decay, w, tol,
    rate_memory: the settings' row_memory, prior_weight, step_tolerance, rate_memory.
    """
    t = cuda.threadIdx.x
    nt = cuda.blockDim.x
    rows = match.shape[0]
    n_slots = rowf.shape[1]
    k_max = prev.shape[1] - 3
    if t == 0:
        same = last[0] == rows
        for r in range(rows):
            if last_slots[r] != slots[r]:
                same = False
        if same:
            update_rate(rate, new_lens, rows, rate_memory, last[1])
        last[2] = 1 if same else 0
        last[1] = rows
    for j in range(t, N_BINS, nt):
        clear_automaton_hist(hist, j)
    cuda.syncthreads()
    if last[2] != 0:
        for r in range(t, rows, nt):
            s = slots[r]
            if 0 <= s < n_slots:
                score_kept(prev, s, new, r, new_lens[r], rowf, bk, decay)
    cuda.syncthreads()
    if last[2] != 0:
        for j in range(t, bk.shape[1], nt):
            estimate_bucket(bk, j, w)
    cuda.syncthreads()
    odds = bk[4]
    for r in range(t, rows, nt):
        s = slots[r]
        d = int64(0)
        if 0 <= s < n_slots:
            d = row_probs_row(r, s, match[r], offered[r], branched[r], rowf, odds, k_max, probs, hist)
        lengths[r] = d
    cuda.syncthreads()
    if t == 0:
        _, best_bin, floor_bin = best_threshold(probs, k_max, sources, 0.0, 0, rows, 0.0, curve, index, knot, hist,
                                                tol, running_rate(rate, curve, index, knot))
        last[3] = best_bin
        last[4] = floor_bin
    cuda.syncthreads()
    width = min(drafts.shape[1], k_max)
    for r in range(t, rows, nt):
        s = slots[r]
        d = row_length(probs, r, lengths[r], last[3], last[4], match[r])
        src = AUTOMATON if d > 0 else NONE
        lengths[r] = d
        sources[r] = src
        count_row(st, src, d)
        add_at(last, 1, d)
        if 0 <= s < n_slots:
            keep_offer(prev, s, match[r], offered[r], branched[r], drafts, r, width)
        last_slots[r] = s
    cuda.syncthreads()
    if t == 0:
        count_step(st, rows, 0, last[1] - rows)
        last[0] = rows


KERNELS = {"decide_kernel": decide_kernel}

_I1, _I2 = int32[::1], int32[:, ::1]
_F2 = float64[:, ::1]
#: The kernel's signature as launched (``tests/library/test_device_policy.py`` compiles it to PTX with it).
SIGNATURES: dict[str, tuple] = {
    "decide_kernel": (_I1, _I1, _I1, _I2, _I2, _I1, _I1, _I1, _I1, _F2, _I2, _F2, _F2, _F2, int64[::1], int64[::1],
                      _I1, float64[::1], _F2, int64[:, ::1], _F2, float64, float64, float64, float64),
}
