"""The n-gram prompt-lookup baseline, with the same lifecycle API as ``SpecEngine``.

Like vLLM's ``ngram`` proposer: each step it rescans the request's whole
context for the earliest earlier occurrence of its last ``n`` tokens, trying
``n = max_n`` down to ``min_n``, and proposes the tokens that followed. Cost
per step is O(context length x n), which is what the suffix automaton avoids.

A request's blob is ``[n, tokens...]`` (int32), grown geometrically on the host.
"""

from __future__ import annotations

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit, prange

from .arena import Allocator
from .engine import SpecEngine
from .extend import row_len
from .host import HostBackend
from .intrinsics import blob_at
from .validate import check_int

_GROWTH = 1.5


@njit(nogil=True, cache=True)
def ngram_draft(ctx, n_ctx, min_n, max_n, out, k):
    """Draft from the earliest earlier occurrence of the longest suffix n-gram.

    ``ctx[:n_ctx]`` is the context. Writes up to ``k`` tokens to ``out[:k]``
    (-1 after them) and returns (tokens written, n of the matched n-gram).
    """
    for n in range(min(max_n, n_ctx - 1), min_n - 1, -1):
        tail = n_ctx - n
        for i in range(0, tail):
            j = 0
            while j < n and ctx[i + j] == ctx[tail + j]:
                j += 1
            if j == n:
                count = min(k, n_ctx - (i + n))
                for t in range(count):
                    out[t] = ctx[i + n + t]
                for t in range(count, k):
                    out[t] = -1
                return count, n
    for t in range(k):
        out[t] = -1
    return 0, 0


@njit(inline="always")
def _row(blob, accepted, lens, progress, match_out, draft_out, b, min_n, max_n):
    n = blob[0]
    room = blob.shape[0] - 1 - n
    count = row_len(lens, accepted, b)
    if count - progress[b] > room:
        return 1
    for j in range(progress[b], count):
        blob[1 + n] = accepted[b, j]
        n += 1
    blob[0] = n
    progress[b] = count
    _, m = ngram_draft(blob[1:], n, min_n, max_n, draft_out[b], draft_out.shape[1])
    match_out[b] = m
    return 0


@njit(nogil=True, cache=True)
def _step(table, rp, accepted, lens, match_out, draft_out, min_n, max_n):
    rows = rp[0]
    progress = rp[1]
    blocked = 0
    for b in range(rows.shape[0]):
        blocked += _row(blob_at(table, rows[b]), accepted, lens, progress, match_out, draft_out, b, min_n, max_n)
    return blocked


@njit(nogil=True, cache=True, parallel=True)
def _step_parallel(table, rp, accepted, lens, match_out, draft_out, min_n, max_n):
    """``_step`` over threads; called only under ``extend.PARALLEL_LOCK``."""
    rows = rp[0]
    progress = rp[1]
    blocked = 0
    for b in prange(rows.shape[0]):
        blocked += _row(blob_at(table, rows[b]), accepted, lens, progress, match_out, draft_out, b, min_n, max_n)
    return blocked


class NgramBlobs:
    """The n-gram baseline's blobs (``[n, tokens...]``, int32) for ``host.HostBackend``.

    Args:
        min_n, max_n: n-gram sizes tried, longest first (validated by ``NgramDrafter``).
    """

    n_word = 0  # a blob is [n, tokens...]
    fused = False  # extend.step is the SA kernel: steps go through check_step, then ``run``
    grows_ahead = False  # a copy of tokens only: cheap enough inside the step

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    # Blobs are plain arrays (``alloc`` unused): they hold tokens only, a few bytes each.
    def build(self, tokens: np.ndarray, headroom: int | None, alloc: Allocator) -> np.ndarray:
        room = max(64, tokens.shape[0] // 8, headroom or 0)
        blob = np.empty(1 + tokens.shape[0] + room, dtype=np.int32)
        blob[0] = tokens.shape[0]
        blob[1: 1 + tokens.shape[0]] = tokens
        return blob

    def grow(self, blob: np.ndarray, more_tokens: int, alloc: Allocator) -> np.ndarray:
        n = int(blob[0])
        new = np.empty(max(1 + n + more_tokens, int(blob.shape[0] * _GROWTH)), dtype=np.int32)
        new[: 1 + n] = blob[: 1 + n]
        return new

    def tokens(self, blob: np.ndarray) -> int:
        return int(blob[0])

    def text(self, blob: np.ndarray) -> np.ndarray:
        return blob[1: 1 + int(blob[0])].copy()

    def run(self, table, rp, acc, lens, mout, dout, bout, parallel: bool, ctl) -> int:
        bout[:] = 0  # an n-gram match says nothing of how its earlier occurrences went on
        run = _step_parallel if parallel else _step
        return run(table, rp, acc, lens, mout, dout, self.min_n, self.max_n)


class NgramDrafter(SpecEngine):
    """Prompt-lookup drafts (the baseline), driven exactly like ``SpecEngine``
    (whose ids, checks and threading it keeps; its blobs are ``NgramBlobs``).

    ``match_len_out`` receives the length n of the matched n-gram (0: none).

    Args:
        min_n, max_n: n-gram sizes tried, longest first (1 <= min_n <= max_n).
        parallel_threshold: ``None`` (default, serial) or the batch size from
            which steps use all cores, as in ``SpecEngine``.
    """

    def __init__(self, *, min_n: int = 1, max_n: int = 4, parallel_threshold: int | None = None) -> None:
        check_int(min_n, "min_n", 1)
        check_int(max_n, "max_n", 1)
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        super().__init__(parallel_threshold=parallel_threshold)
        self.occurrence = "ngram"
        self.min_n, self.max_n = int(min_n), int(max_n)
        kind = NgramBlobs(self.min_n, self.max_n)
        self._attach(HostBackend(kind, self._occurrence, self._depth, self._parallel_from))
