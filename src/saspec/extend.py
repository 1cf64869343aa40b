"""Extend: the batched per-decode-step call, as jitted host loops over the batch.

One call appends each row's newly accepted tokens to its request's automaton,
then writes the row's match length and its next K draft tokens. Rows are
independent, so the parallel variant runs them with ``prange``.

Blobs reach the kernels as an *address table*, int64 [2, slots]:
``table[0, slot]`` is the address of slot ``slot``'s int32 blob and
``table[1, slot]`` its length in words (owned by the engine, which keeps every
blob alive while its address is in the table and changes entries only under
its lock). ``intrinsics.blob_at`` turns an entry back into an int32 array
inside jitted code. A ``numba.typed.List`` would do the same, but numba's
dispatcher unboxes one on every call, which costs more than a whole B=1 step;
for the same reason the per-call arguments are packed into few arrays:
``rp`` int32 [2, B] (row 0: each batch row's slot; row 1: its progress, tokens
appended so far this step) and ``ctl`` int64 [CTL_WORDS] (the ``C_*`` words).

``check_step`` validates the whole step before anything is written, so a
rejected call changes no state: the shapes against the prepared batch, that no
output shares memory with an input or with the other output, every length and
token, and that no row would grow past ``limit`` tokens. ``step`` is that check
fused with the serial kernel, and ``step_all`` the whole serial step in one
jitted call: ``step`` with the checks of the optional outputs before it, and
the growth marks and the cross-request pool's side after it (the host
backend's fast path: each jitted call pays numba's dispatch, which a one-row
step notices). ``extend_rows`` may stop a row early when its blob is full
(``progress[b] < lens[b]``); the engine grows that blob and calls it again,
which resumes each row where it stopped.
"""

from __future__ import annotations

import threading

from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
import numba
import numpy as np
from numba import njit, prange

from . import core
from .intrinsics import blob_at, prefetch, prefetch_lines_for_write, prefetch_write

# check_step() status codes: >= 0 is OK (step(): rows left blocked for lack of
# room); negative: rejected, nothing written; err[0], err[1] say where.
OK = 0
BAD_ROWS = -1  # draft_out.shape[0] != B
BAD_ACCEPTED_SHAPE = -2
BAD_LENS_SHAPE = -3
BAD_MATCH_SHAPE = -4
OVERLAP = -5  # err: the two arguments' indices (0 accepted, 1 accepted_lens, 2 match_len_out, 3 draft_out,
#              4 source_out, 5 branch_out: validate.STEP_ARG_NAMES)
BAD_LEN = -6  # err: row
BAD_TOKEN = -7  # err: row, column
TOO_LONG = -8  # err: row, the tokens it would hold
BAD_SOURCE_SHAPE = -9  # step_all: source_out.shape[0] != B
BAD_BRANCH_SHAPE = -10  # step_all: branch_out.shape[0] != B

ARG_NAMES = ("accepted", "accepted_lens", "match_len_out", "draft_out")

# ctl words
C_LIMIT = 0  # most tokens a row may hold after the step
C_OCCURRENCE = 1
C_DEPTH = 2
C_ERR = 3  # and C_ERR + 1: where a check failed (see the codes above)
C_LOOKAHEAD = 5  # prefetch rows ahead from this many bytes of blobs in the batch (see extend_rows)
C_MARKED = 6  # step_all: how many slots rows_past_mark wrote to its ``marked``
CTL_WORDS = 7


@njit(inline="always")
def _span(a):
    """Byte range [lo, hi) of a C-contiguous array; empty arrays have none."""
    lo = np.int64(a.ctypes.data)
    return lo, lo + np.int64(a.size) * np.int64(a.itemsize)


@njit(inline="always")
def overlap(a, b):
    """Whether two C-contiguous arrays' elements share memory (jitted callers: ``check_step``, ``pool``)."""
    alo, ahi = _span(a)
    blo, bhi = _span(b)
    return alo < ahi and blo < bhi and alo < bhi and blo < ahi


@njit(nogil=True, cache=True, **core.NO_NRT)
def check_step(table, rp, accepted, lens, match_out, draft_out, ctl, n_word):
    """Validate one step; return ``OK`` or a negative code with ``ctl[C_ERR:]`` set.

    accepted: int32 [B, K+1]; lens, match_out: int32 [B]; draft_out: int32
    [B, K]; ``rp[1]`` (progress) is zeroed for the ``extend_rows`` calls that
    follow. ``blob[n_word]`` of a row's blob is its token count. Valid: the
    shapes, no output sharing memory with an input or the other output,
    ``0 <= lens[b] <= K+1``, ``accepted[b, :lens[b]] >= 0``, and no row past
    ``ctl[C_LIMIT]`` tokens after the step.
    """
    rows = rp[0]
    progress = rp[1]
    b = rows.shape[0]
    k = draft_out.shape[1]
    if draft_out.shape[0] != b:
        return BAD_ROWS
    if accepted.shape[0] != b or accepted.shape[1] != k + 1:
        return BAD_ACCEPTED_SHAPE
    if lens.shape[0] != b:
        return BAD_LENS_SHAPE
    if match_out.shape[0] != b:
        return BAD_MATCH_SHAPE
    for i, j, hit in (
        (0, 2, overlap(accepted, match_out)),
        (0, 3, overlap(accepted, draft_out)),
        (1, 2, overlap(lens, match_out)),
        (1, 3, overlap(lens, draft_out)),
        (2, 3, overlap(match_out, draft_out)),
    ):
        if hit:
            ctl[C_ERR] = i
            ctl[C_ERR + 1] = j
            return OVERLAP
    width = accepted.shape[1]
    limit = ctl[C_LIMIT]
    for r in range(b):
        progress[r] = 0
        n = lens[r]
        if n < 0 or n > width:
            ctl[C_ERR] = r
            return BAD_LEN
        for j in range(n):
            if accepted[r, j] < 0:
                ctl[C_ERR] = r
                ctl[C_ERR + 1] = j
                return BAD_TOKEN
        total = np.int64(blob_at(table, rows[r])[n_word]) + n
        if total > limit:
            ctl[C_ERR] = r
            ctl[C_ERR + 1] = total
            return TOO_LONG
    return OK


@njit(inline="always")
def row_len(lens, accepted, b):
    """Row ``b``'s accepted-token count, read once and clamped to
    ``accepted``'s width: in bounds even if the caller's array changed since
    ``check_step``."""
    return min(lens[b], accepted.shape[1])


@njit(inline="always")
def _row(buf, accepted, lens, progress, match_out, draft_out, branch_out, b, occurrence, depth):
    n = row_len(lens, accepted, b)
    j = progress[b]
    while j < n:
        if core.extend(buf, accepted[b, j], occurrence, depth) == core.NO_ROOM:
            break
        j += 1
    progress[b] = j
    if j < n:
        return 1
    match_out[b] = core.match_len(buf)
    core.draft(buf, draft_out[b], draft_out.shape[1])
    if branch_out.shape[0] > b:
        branch_out[b] = core.branched(buf)
    return 0


# How many rows ahead ``extend_rows`` prefetches (see ``_look_ahead``), and the
# default total size of the batch's blobs from which it does: below it they
# mostly stay in the last level cache between steps, and the look-ahead's own
# work costs more than it saves (BENCHMARKS.md, "Host engine", has both sides
# of the threshold on a 32 MiB L3).
LOOKAHEAD = 3
LOOKAHEAD_MIN_BYTES = 16 << 20


@njit(inline="always")
def _prefetch_row_writes(buf, base, tokens):
    """Prefetch, to write, the lines that appending ``tokens`` tokens to the
    blob ``buf`` at address ``base`` will write: each adds at most two states
    (records, then aux records) and one text word."""
    ns = buf[core.H_NSTATES]
    prefetch_lines_for_write(base + 4 * core.state(buf, ns), base + 4 * core.state(buf, ns + 2 * tokens))
    prefetch_lines_for_write(base + 4 * core.aux(buf, ns), base + 4 * core.aux(buf, ns + 2 * tokens))
    prefetch_write(base + 4 * (buf[core.H_O_TEXT] + buf[core.H_N]))


@njit(inline="always")
def _look_ahead(table, slot, accepted, lens, progress, b, hops, first):
    """Prefetch the cache lines row ``b``'s next ``hops`` tokens will miss on.

    It writes nothing. With long contexts a step's time goes to dependent
    DRAM reads: a token that continues a copy reads the record of ``q``, the
    target of the match state's edge, and its suffix-link parent; a new token
    probes the edge table at the root. All of these follow from the row's
    accepted tokens and records already cached, so ``extend_rows`` walks rows
    ahead of the one it extends: a row visited ``j`` rows ahead follows
    ``hops`` first edges (cached by the earlier visits) and prefetches the
    next. On its first visit (``first``) it prefetches the root's table slots
    of all its tokens, and, to write, the lines its new states, their aux
    records and its text will take: each row writes sequentially, but every
    other row's step comes between two of its own, too far apart for the
    hardware prefetcher to follow (BENCHMARKS.md, "Against sa_spec", has what
    the write prefetch saves).
    """
    buf = blob_at(table, slot)
    base = table[0, slot]
    i = progress[b]
    n = row_len(lens, accepted, b)
    if first:
        for t in range(i, n):
            prefetch(base + 4 * core.find_slot_start(buf, 0, accepted[b, t]))
        _prefetch_row_writes(buf, base, n - i)
    s = buf[core.state(buf, buf[core.H_LAST]) + core.LINK]
    end = min(n, i + hops)
    while i < end and s >= 0:
        r = core.state(buf, s)
        d = buf[r + core.DST]
        if d == 0 or buf[r + core.TOK] != accepted[b, i]:
            if d < 0:
                prefetch(base + 4 * core.find_slot_start(buf, s, accepted[b, i]))
            return
        s = d if d > 0 else -d
        i += 1
        if i == end:
            prefetch(base + 4 * core.state(buf, s))
            prefetch(base + 4 * core.aux(buf, s))
            prefetch(base + 4 * core.state(buf, buf[r + core.LINK]))


@njit(nogil=True, cache=True, **core.NO_NRT)
def extend_rows(table, rp, accepted, lens, match_out, draft_out, branch_out, occurrence, depth, lookahead_bytes):
    """Serial batch extend, resuming each row at ``rp[1, b]``; returns how
    many rows stopped for lack of room. ``branch_out`` (int32 [B], or empty
    for none): each row's ``core.branched``. When the batch's blobs hold at least
    ``lookahead_bytes`` bytes (``LOOKAHEAD_MIN_BYTES`` in the engine), rows
    ahead are prefetched (``_look_ahead``); that writes nothing, so the
    results are the same."""
    rows = rp[0]
    progress = rp[1]
    nb = rows.shape[0]
    words = 0
    for b in range(nb):
        words += table[1, rows[b]]
    ahead = LOOKAHEAD if 4 * words >= lookahead_bytes else 0
    blocked = 0
    for b in range(nb):
        for j in range(1, ahead + 1):
            if b + j < nb:
                _look_ahead(table, rows[b + j], accepted, lens, progress, b + j, LOOKAHEAD + 1 - j,
                            j == LOOKAHEAD or b == 0)
        blocked += _row(blob_at(table, rows[b]), accepted, lens, progress, match_out, draft_out, branch_out, b,
                        occurrence, depth)
    return blocked


@njit(nogil=True, cache=True, parallel=True)
def extend_rows_parallel(table, rp, accepted, lens, match_out, draft_out, branch_out, occurrence, depth,
                         lookahead_bytes):
    """``extend_rows`` with the rows spread over threads (no look-ahead:
    ``lookahead_bytes`` is unused). Call it only while holding
    ``PARALLEL_LOCK`` (see there)."""
    rows = rp[0]
    progress = rp[1]
    blocked = 0
    for b in prange(rows.shape[0]):
        blocked += _row(blob_at(table, rows[b]), accepted, lens, progress, match_out, draft_out, branch_out, b,
                        occurrence, depth)
    return blocked


@njit(nogil=True, cache=True, **core.NO_NRT)
def step(table, rp, accepted, lens, match_out, draft_out, branch_out, ctl):
    """``check_step`` then, if it passed, ``extend_rows``, in one call.

    Returns a negative ``check_step`` code (nothing written) or the number of
    rows blocked for lack of room (0: the step is complete).
    """
    code = check_step(table, rp, accepted, lens, match_out, draft_out, ctl, core.H_N)
    if code != OK:
        return code
    return extend_rows(table, rp, accepted, lens, match_out, draft_out, branch_out, ctl[C_OCCURRENCE], ctl[C_DEPTH],
                       ctl[C_LOOKAHEAD])


# -- growth ahead of need (``host.HostBackend`` grows marked blobs on a background thread) ----------

GROW_MARK_MIN = 32  # tokens of room below which a blob is grown ahead, at least
GROW_MARK_FRACTION = 16  # ... or below 1/16 of its token capacity


@njit(nogil=True, cache=True, **core.NO_NRT)
def rows_past_mark(table, rp, ahead, out):
    """Mark the batch's blobs that are nearly full, for growth ahead of need.

    ahead: int64 [2, slots]: row 0, 1 where a slot is marked already; row 1,
    the tokens its request is expected to reach (0: unknown), whose blob is
    never marked once it has room for them. A blob is marked when it has less
    room than its mark (``GROW_MARK_MIN`` tokens, or 1/``GROW_MARK_FRACTION``
    of its token capacity) for tokens, twice that for states, or that many
    table edges. Writes the newly marked slots to ``out[:n]``; returns n.
    """
    rows = rp[0]
    n = 0
    for b in range(rows.shape[0]):
        slot = rows[b]
        if ahead[0, slot]:
            continue
        buf = blob_at(table, slot)
        cap = buf[core.H_CAP_TOK]
        if 0 < ahead[1, slot] <= cap:
            continue
        mark = max(GROW_MARK_MIN, cap // GROW_MARK_FRACTION)
        if (cap - buf[core.H_N] < mark or buf[core.H_CAP_ST] - buf[core.H_NSTATES] < 2 * mark
                or core.max_used(buf[core.H_HT_SIZE]) - buf[core.H_USED] < mark):
            ahead[0, slot] = 1
            out[n] = slot
            n += 1
    return n


# -- the cross-request pool's side of a step (the pool itself: ``pool.RequestPool``) ------------

@njit(nogil=True, cache=True, **core.NO_NRT)
def check_source(source_out, rows, accepted, lens, match_out, draft_out):
    """``extend``'s check of ``source_out`` (numpy arrays), before the step runs: -2 if it is not
    [rows], i in 0..3 if it shares memory with the i-th of the other arrays, else -1."""
    if source_out.shape[0] != rows:
        return -2
    if overlap(source_out, accepted):
        return 0
    if overlap(source_out, lens):
        return 1
    if overlap(source_out, match_out):
        return 2
    if overlap(source_out, draft_out):
        return 3
    return -1


@njit(inline="always")
def _follow_pool(pool, s, m, token):
    """``core.follow`` in the pool, except that a row token equal to the separator
    (id 2**31-1) breaks the match: a match never spans the end of a pooled text."""
    if token == core.SEPARATOR:
        return 0, 0
    return core.follow(pool, s, m, token)


POOL_LOOKAHEAD = 3  # rows ahead whose pool walk pool_rows prefetches (see _pool_look_ahead)


@njit(inline="always")
def _pool_look_ahead(pool, base, state, slot, accepted, lens, b, hops, epoch):
    """Prefetch the pool record row ``b``'s walk will miss on after ``hops`` tokens.

    The pool is one large automaton that the rows' walks cross at random, so each
    token that continues a match is a cache miss on the next state's record. As in
    ``extend_rows``, rows ahead are walked along records already cached (by
    earlier visits) and the next one is prefetched; this reads and writes nothing else.
    """
    if state[2, slot] != epoch:
        return
    s = state[0, slot]
    n = row_len(lens, accepted, b)
    i = 0
    while i < min(n, hops) and s >= 0:
        r = core.state(pool, s)
        d = pool[r + core.DST]
        if d <= 0 or pool[r + core.TOK] != accepted[b, i]:
            return  # a branching state or a mismatch: the walk probes the table, not worth guessing
        s = d
        i += 1
    prefetch(base + 4 * core.state(pool, s))
    prefetch(base + 4 * core.aux(pool, s))


@njit(nogil=True, cache=True, **core.NO_NRT)
def pool_rows(table, rp, accepted, lens, match_out, draft_out, source_out, branch_out, pool, base, state, epoch,
              sync_tokens):
    """After a step's own extend: follow each row's accepted tokens in the pool and
    draft from it where its match is strictly longer than the row's own.

    pool: the pool's blob, at address ``base``; state: int32 [3, slots], per slot
    its pool state, match length and the pool epoch they belong to (another epoch:
    re-match from the row's last ``sync_tokens`` tokens, which include this
    step's). Writes ``source_out[b]`` (1: row b's draft and match are the pool's,
    0: its own) and, for pool rows, ``match_out[b]``, ``draft_out[b]`` and (where
    ``branch_out`` has the row) whether the pool state branches.
    """
    rows = rp[0]
    nb = rows.shape[0]
    k = draft_out.shape[1]
    # Pass 1: each row's walk; rows that may draft from the pool are marked in
    # source_out (1), and their state's occurrence record is prefetched. The
    # later passes then take the two dependent misses of a pool draft (the
    # occurrence's position, then the text there) for all rows at once.
    for b in range(nb):
        for j in range(1, POOL_LOOKAHEAD + 1):
            if b + j < nb:
                _pool_look_ahead(pool, base, state, rows[b + j], accepted, lens, b + j, POOL_LOOKAHEAD + 1 - j,
                                 epoch)
        slot = rows[b]
        if state[2, slot] != epoch:
            buf = blob_at(table, slot)
            text = buf[core.H_O_TEXT]
            n = buf[core.H_N]
            s, m = 0, 0
            for i in range(max(0, n - sync_tokens), n):
                s, m = _follow_pool(pool, s, m, buf[text + i])
            state[2, slot] = epoch
        else:
            s, m = state[0, slot], state[1, slot]
            for j in range(row_len(lens, accepted, b)):
                s, m = _follow_pool(pool, s, m, accepted[b, j])
        state[0, slot] = s
        state[1, slot] = m
        source_out[b] = 0
        if m > match_out[b] and s > 0:
            source_out[b] = 1
            prefetch(base + 4 * (core.aux(pool, s) + core.POS))
    # Pass 2: prefetch the text where each marked row's continuation starts.
    text = pool[core.H_O_TEXT]
    n = pool[core.H_N]
    for b in range(nb):
        if source_out[b]:
            start = pool[core.aux(pool, state[0, rows[b]]) + core.POS] + 1
            if start < n:
                prefetch(base + 4 * (text + start))
    # Pass 3: the drafts.
    for b in range(nb):
        if source_out[b]:
            start = core.continuation(pool, state[0, rows[b]], core.SEPARATOR)
            source_out[b] = 0
            if start >= 0:
                core.draft_from(pool, start, draft_out[b], k, core.SEPARATOR)
                match_out[b] = state[1, rows[b]]
                source_out[b] = 1
                if branch_out.shape[0] > b:
                    branch_out[b] = core.state_branches(pool, state[0, rows[b]])


# -- the whole serial step in one call (``host.HostBackend``'s fast path) ----------------------------

POOL_ON = 1  # step_all's flags: a pool is attached (source_out is checked and written, rows draft from it)
BRANCH_ON = 2  # branch_out is the caller's (checked); else it is empty and never written


@njit(inline="always")
def _check_row_outs(b, accepted, lens, match_out, draft_out, source_out, branch_out, ctl, flags):
    """``step_all``'s checks of ``source_out`` (with ``POOL_ON``) and ``branch_out`` (with
    ``BRANCH_ON``): the shape [B], and no memory shared with the arguments before it in
    ``extend``'s order (``OVERLAP``, ``ctl[C_ERR:]`` naming the two). ``OK`` or the code."""
    if flags & POOL_ON:
        if source_out.shape[0] != b:
            return BAD_SOURCE_SHAPE
        for j, hit in ((0, overlap(source_out, accepted)), (1, overlap(source_out, lens)),
                       (2, overlap(source_out, match_out)), (3, overlap(source_out, draft_out))):
            if hit:
                ctl[C_ERR] = 4
                ctl[C_ERR + 1] = j
                return OVERLAP
    if flags & BRANCH_ON:
        if branch_out.shape[0] != b:
            return BAD_BRANCH_SHAPE
        for j, hit in ((0, overlap(branch_out, accepted)), (1, overlap(branch_out, lens)),
                       (2, overlap(branch_out, match_out)), (3, overlap(branch_out, draft_out)),
                       (4, overlap(branch_out, source_out))):
            if hit:
                ctl[C_ERR] = 5
                ctl[C_ERR + 1] = j
                return OVERLAP
    return OK


@njit(nogil=True, cache=True, **core.NO_NRT)
def step_all(table, rp, accepted, lens, match_out, draft_out, source_out, branch_out, ahead, marked, pool, base,
             pool_state, epoch, sync_tokens, ctl, flags):
    """A whole serial step of suffix-automaton blobs in one call: the checks of every argument
    before anything is written, the step (``step``), the rows past their fill mark
    (``rows_past_mark`` into ``marked``, their count in ``ctl[C_MARKED]``) and the pool's side
    (``pool_rows``; with a pool still empty, ``source_out`` all 0).

    source_out: int32 [B] with ``POOL_ON`` (a scratch array where the caller gave none), else
    unused; branch_out: int32 [B] with ``BRANCH_ON``, else empty; pool, base, pool_state,
    epoch, sync_tokens: ``pool_rows``'s (unused without ``POOL_ON``).

    Returns a negative code (nothing written; ``check_step``'s, ``BAD_SOURCE_SHAPE``,
    ``BAD_BRANCH_SHAPE``, or ``OVERLAP`` naming source_out or branch_out), 0 (the whole step
    is done), or the number of rows blocked for lack of room: the caller grows them, resumes the
    step, then marks and drafts from the pool itself (neither has run).
    """
    code = _check_row_outs(rp.shape[1], accepted, lens, match_out, draft_out, source_out, branch_out, ctl, flags)
    if code != OK:
        return code
    code = step(table, rp, accepted, lens, match_out, draft_out, branch_out, ctl)
    if code != OK:
        return code
    ctl[C_MARKED] = rows_past_mark(table, rp, ahead, marked)
    if flags & POOL_ON:
        if pool[core.H_N] == 0:  # nothing pooled yet: every row keeps its own draft (and its pool state)
            for b in range(source_out.shape[0]):
                source_out[b] = 0
        else:
            pool_rows(table, rp, accepted, lens, match_out, draft_out, source_out, branch_out, pool, base,
                      pool_state, epoch, sync_tokens)
    return OK


# Parallel kernels run one at a time in the process. numba's workqueue
# threading layer aborts the process when two threads enter parallel code at
# once, and the other layers gain nothing from it (each parallel call already
# uses every core), so every saspec parallel kernel is called under this lock,
# whichever layer numba picked.
PARALLEL_LOCK = threading.Lock()


def threading_layer() -> str:
    """The threading layer numba uses (after the first parallel call), or
    ``NUMBA_THREADING_LAYER``'s setting before it."""
    try:
        return numba.threading_layer()
    except ValueError:
        return numba.config.THREADING_LAYER
