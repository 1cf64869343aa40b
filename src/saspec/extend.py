"""Extend: the batched per-decode-step call, as jitted host loops over the batch.

One call appends each row's newly accepted tokens to its request's automaton,
then writes the row's match length and its next K draft tokens. Rows are
independent, so the parallel variant runs them with ``prange``.

``check_step`` validates the whole step before anything is written, so a
rejected call changes no state. ``extend_rows`` may stop a row early when its
blob is full (``progress[b] < lens[b]``); the engine grows that blob and calls
it again, which resumes each row where it stopped.
"""

from __future__ import annotations

from numba import njit, prange

from . import core

# check_step() error codes.
OK = 0
BAD_LEN = 1
BAD_TOKEN = 2


@njit(nogil=True, cache=True)
def check_step(accepted, lens, progress):
    """Return (code, row, col) of the first invalid entry, or (OK, -1, -1).

    Valid: 0 <= lens[b] <= accepted.shape[1]; accepted[b, :lens[b]] >= 0.
    Also zeroes ``progress`` for the ``extend_rows`` calls that follow.
    """
    width = accepted.shape[1]
    for b in range(lens.shape[0]):
        progress[b] = 0
        n = lens[b]
        if n < 0 or n > width:
            return BAD_LEN, b, -1
        for j in range(n):
            if accepted[b, j] < 0:
                return BAD_TOKEN, b, j
    return OK, -1, -1


@njit(inline="always")
def _row(buf, accepted, lens, progress, match_out, draft_out, b, policy, depth):
    j = progress[b]
    while j < lens[b]:
        if core.extend(buf, accepted[b, j], policy, depth) == core.NO_ROOM:
            break
        j += 1
    progress[b] = j
    if j < lens[b]:
        return 1
    match_out[b] = core.match_len(buf)
    core.draft(buf, draft_out[b], draft_out.shape[1])
    return 0


@njit(nogil=True, cache=True)
def extend_rows(blobs, rows, accepted, lens, progress, match_out, draft_out, policy, depth):
    """Serial batch extend; returns how many rows stopped for lack of room."""
    blocked = 0
    for b in range(rows.shape[0]):
        blocked += _row(blobs[rows[b]], accepted, lens, progress, match_out, draft_out, b, policy, depth)
    return blocked


@njit(nogil=True, cache=True, parallel=True)
def extend_rows_parallel(blobs, rows, accepted, lens, progress, match_out, draft_out, policy, depth):
    """``extend_rows`` with the rows spread over threads."""
    blocked = 0
    for b in prange(rows.shape[0]):
        blocked += _row(blobs[rows[b]], accepted, lens, progress, match_out, draft_out, b, policy, depth)
    return blocked
