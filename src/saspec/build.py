"""Build: host-side automata whose memory grows with the request.

A request's automaton is one int32 *blob* laid out by ``core.init``. The host
builds it with ``ingest``, which runs the core's ``extend`` in a jitted loop
with the GIL released and, whenever the blob is full, grows it in Python (a
geometric re-allocation, outside the hot loop) and carries on.

``SuffixAutomaton`` wraps one blob for direct use and for tests. Every
function that allocates takes an allocator (``arena``): an engine passes its
``BlobArena``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from . import core
from .arena import Allocator, empty_blob
from .validate import as_tokens, check_int, optional_int

OCCURRENCES: dict[str, int] = {
    "first": core.FIRST_OCC,
    "recent": core.RECENT,
    "near-first": core.NEAR_FIRST,
    "near-recent": core.NEAR_RECENT,
}
DEFAULT_OCCURRENCE = "near-first"
DEFAULT_RECENT_DEPTH = 4
MAX_RECENT_DEPTH = 1024  # the *recent rules cost O(recent_depth) per token
MAX_BLOB_WORDS = 2**31 - 1  # blob offsets are int32

# Sizing: the automaton of n tokens has at most 2n states and n table edges
# (second and later edges of a state, see ``core``); real text needs fewer
# states (random text about 1.0-1.3 per token, repetitive text up to 1.9) and
# about 0.4 (repetitive) to 1.0 (random) table edges per token. A blob starts
# at the typical need of its tokens plus headroom for the tokens decoding will
# add, and grows by GROWTH.
GROWTH = 1.5
_STATES_PER_TOKEN = 1.9
_EDGES_PER_TOKEN = 1.0  # table edges
_MIN_HEADROOM = 256
_HEADROOM_FRACTION = 8  # headroom: 1/8 of the prompt (at least _MIN_HEADROOM) for the tokens decoding adds
_TABLE_GROWTH = 2.0  # re-inserting every edge is the costly part of growth: do it rarely
_TABLE_MARGIN = 0.25  # table edges per token of new headroom below which a grow also resizes the table


def occurrence_code(occurrence: str) -> int:
    """Numeric code of an occurrence rule name (see ``core``)."""
    try:
        return OCCURRENCES[occurrence]
    except KeyError:
        raise ValueError(f"unknown occurrence rule {occurrence!r}; expected one of {sorted(OCCURRENCES)}") from None


def _table_size(edges: int) -> int:
    """Slots needed to hold ``edges`` table edges under the 3/4 load limit."""
    return max(4, (4 * edges) // 3 + 2)


def new_blob(expected_tokens: int = 0, headroom: int | None = None, alloc: Allocator = empty_blob) -> np.ndarray:
    """An empty automaton sized for about ``expected_tokens`` tokens plus
    headroom for the tokens decoding will add: 1/8 more, at least 256 (about
    80 bytes per prompt token, 108 at 500 tokens), or ``headroom`` if that is
    more. Each later re-allocation (``grow``) copies the whole automaton,
    which on a decode step costs far more than the step, so the headroom
    spends the memory budget on fewer of them. ``alloc`` gives the memory
    (``empty_blob``, or an engine's ``BlobArena``)."""
    n = int(expected_tokens)
    n += max(_MIN_HEADROOM, n // _HEADROOM_FRACTION, int(headroom or 0))
    cap_st = int(_STATES_PER_TOKEN * n) + 2
    ht_size = _table_size(int(_EDGES_PER_TOKEN * n))
    buf = alloc(core.layout_words(n, cap_st, ht_size))
    _init(buf, n, cap_st, ht_size)
    return buf


def check_new_tokens(value: Any, prompt_tokens: int) -> int | None:
    """Validate ``add_request``'s ``expected_new_tokens``: ``None`` or an int
    >= 0 such that the prompt and these tokens fit ``MAX_REQUEST_TOKENS``."""
    value = optional_int(value, "expected_new_tokens", 0)
    if value is not None:
        check_request_tokens(prompt_tokens + value, "prompt plus expected_new_tokens")
    return value


def grow(buf: np.ndarray, more_tokens: int, alloc: Allocator = empty_blob) -> np.ndarray:
    """A larger copy of ``buf`` with room for more tokens.

    Every capacity is sized together for ``target`` tokens, at least ``GROWTH``
    times the current count (and at least ``more_tokens`` more), at the typical
    rates above, so one re-allocation serves the next geometric stretch of
    tokens whichever capacity ran out first. Growth is therefore amortized
    O(1) per token. The table grows only when it has room for fewer than
    ``_TABLE_MARGIN`` edges per token of the new headroom (then by at least
    ``_TABLE_GROWTH``): re-inserting its edges is the costly part of a copy,
    and text that copies adds few edges (random text, about one per token,
    then grows the table on its own a little later). A token that needs more
    table room than that (a clone of a state with many edges) finds NO_ROOM
    again; the caller grows once more, and with text and states to spare that
    grow doubles the table.
    """
    more = max(int(more_tokens), 1)
    (n, ns, used), (cap_tok0, cap_st0, ht0) = _fill(buf)
    target = max(n + more, int(GROWTH * n))
    extra = target - n
    cap_tok = max(cap_tok0, target)
    cap_st = max(cap_st0, ns + 2 + int(_STATES_PER_TOKEN * extra))
    ht = ht0
    if core.max_used(ht0) < used + 2 + int(_TABLE_MARGIN * extra):
        ht = max(_table_size(used + 2 + int(_EDGES_PER_TOKEN * extra)), int(ht0 * _TABLE_GROWTH))
    elif (cap_tok, cap_st) == (cap_tok0, cap_st0):
        ht = int(ht0 * _TABLE_GROWTH)  # nothing else is short: one token needs many edges
    return _copied(buf, cap_tok, cap_st, ht, alloc)


def reserve(buf: np.ndarray, more_tokens: int, alloc: Allocator = empty_blob) -> np.ndarray:
    """``buf``, or a larger copy of it, with room for ``more_tokens`` more
    tokens: text, the at most two states each can add, and table slots at the
    typical rate of one edge per token (a rate, not a bound: a text that
    branches more grows later as usual)."""
    caps, have = _room_for(buf, int(more_tokens))
    return buf if caps == have else _copied(buf, *caps, alloc)


def copy_with_room(buf: np.ndarray, more_tokens: int, alloc: Allocator = empty_blob) -> np.ndarray:
    """Always a new copy of ``buf`` (``reserve``'s capacities), for a writer that must
    leave ``buf`` as it is for its readers (``pool``): state numbers are kept."""
    return _copied(buf, *_room_for(buf, int(more_tokens))[0], alloc)


def _room_for(buf: np.ndarray, more: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(the capacities ``reserve`` wants for ``more`` more tokens, ``buf``'s own): (tokens, states, table slots)."""
    (n, ns, used), have = _fill(buf)
    cap_tok0, cap_st0, ht0 = have
    need_edges = used + int(_EDGES_PER_TOKEN * more)
    ht = ht0 if core.max_used(ht0) >= need_edges else _table_size(need_edges)
    return (max(cap_tok0, n + more), max(cap_st0, ns + 2 * more), ht), have


def _fill(buf: np.ndarray) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """((tokens, states, table edges) held, (their capacities: tokens, states, table slots)) of a blob."""
    h = buf[: core.HEADER].tolist()  # one read: a decode step pays for this Python when a blob is full
    return (h[core.H_N], h[core.H_NSTATES], h[core.H_USED]), (h[core.H_CAP_TOK], h[core.H_CAP_ST], h[core.H_HT_SIZE])


def _copied(buf: np.ndarray, cap_tok: int, cap_st: int, ht: int, alloc: Allocator) -> np.ndarray:
    """A copy of ``buf``'s automaton in a new blob with these capacities."""
    new = alloc(core.layout_words(cap_tok, cap_st, ht))
    _copy_into(buf, new, cap_tok, cap_st, ht)
    return new


@njit(nogil=True, cache=True, **core.NO_NRT)
def _init(buf, cap_tok, cap_st, ht_size):
    core.init(buf, cap_tok, cap_st, ht_size)


@njit(nogil=True, cache=True, **core.NO_NRT)
def _copy_into(src, dst, cap_tok, cap_st, ht_size):
    core.lay_out(dst, cap_tok, cap_st, ht_size)
    core.copy_into(src, dst)


@njit(nogil=True, cache=True, **core.NO_NRT)
def _ingest(buf, tokens, start, occurrence, depth):
    """Append tokens[start:] until done or out of room; return the next index."""
    i = start
    while i < tokens.shape[0]:
        r = core.extend(buf, tokens[i], occurrence, depth)
        if r == core.NO_ROOM:
            break
        i += 1
    return i


def ingest(buf: np.ndarray, tokens: np.ndarray, occurrence: int, depth: int, alloc: Allocator = empty_blob) -> np.ndarray:
    """Append validated int32 ``tokens`` to ``buf``, growing it as needed.

    Returns the blob that now holds the automaton (``buf`` or a grown copy
    from ``alloc``). Runs without the GIL except while growing.
    """
    i = 0
    while True:
        i = _ingest(buf, tokens, i, occurrence, depth)
        if i == tokens.shape[0]:
            return buf
        buf = grow(buf, tokens.shape[0] - i, alloc)


def append_fitting(buf: np.ndarray, tokens: np.ndarray, occurrence: int, depth: int) -> int:
    """Append validated int32 ``tokens`` to ``buf`` while they fit (never growing it);
    return how many it took. Runs without the GIL."""
    return _ingest(buf, tokens, 0, occurrence, depth)


def worst_case_words(n_tokens: int) -> int:
    """An upper bound on the int32 words of any host blob holding ``n_tokens``
    tokens: every suffix automaton of n tokens has at most 2n states and 3n
    edges, and a blob's capacities exceed what it holds by less than a growth
    step (``GROWTH``, ``_TABLE_GROWTH``: at most 2x) plus headroom; the table
    keeps a 3/4 load limit."""
    n = int(n_tokens)
    pad = 4096
    table = (4 * (3 * n + 2) + 2) // 3 + 1
    return core.layout_words(2 * n + pad, 2 * (2 * n + 2) + pad, 2 * table + pad)


def _max_request_tokens() -> int:
    """The largest n with ``worst_case_words(n) <= MAX_BLOB_WORDS``."""
    lo, hi = 0, MAX_BLOB_WORDS
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if worst_case_words(mid) <= MAX_BLOB_WORDS:
            lo = mid
        else:
            hi = mid - 1
    return lo


# Tokens one host request may hold (about 37 million with today's layout): any
# blob for that many tokens keeps every int32 offset in range. add_request,
# SuffixAutomaton and extend refuse to go past it, before changing anything.
MAX_REQUEST_TOKENS = _max_request_tokens()


def check_request_tokens(total: int, name: str = "request") -> None:
    """Raise ``ValueError`` if a request would hold more than
    ``MAX_REQUEST_TOKENS`` tokens (``total``, in tokens)."""
    if total > MAX_REQUEST_TOKENS:
        raise ValueError(
            f"{name} would hold {total} tokens, more than the limit of {MAX_REQUEST_TOKENS} "
            "(build.MAX_REQUEST_TOKENS: blob offsets are int32)"
        )


def check_recent_depth(depth: Any) -> int:
    """Validate ``recent_depth``: an int in [0, ``MAX_RECENT_DEPTH``]; the
    bound keeps the ``*recent`` rules at O(depth) per token (an unbounded
    walk is O(n) per token on repetitive text)."""
    return check_int(depth, "recent_depth", 0, MAX_RECENT_DEPTH)


class SuffixAutomaton:
    """The suffix automaton of one growing token sequence.

    >>> sa = SuffixAutomaton([1, 2, 3, 9, 1, 2])
    >>> sa.match()
    (2, 2)
    >>> sa.draft(3).tolist()
    [3, 9, 1]

    Args:
        tokens: initial tokens (list, numpy array or CPU torch tensor of ints).
        occurrence: which earlier occurrence drafts are copied from: ``"first"``,
            ``"recent"``, ``"near-first"`` or ``"near-recent"`` (see ``core``).
        recent_depth: bound on the states whose recency is refreshed per token
            for the ``*recent`` rules, an int in [0, ``MAX_RECENT_DEPTH``].

    Holds at most ``MAX_REQUEST_TOKENS`` tokens: the constructor and
    ``extend`` raise ``ValueError`` (changing nothing) beyond that.
    """

    def __init__(
        self,
        tokens: Any = (),
        *,
        occurrence: str = DEFAULT_OCCURRENCE,
        recent_depth: int = DEFAULT_RECENT_DEPTH,
    ) -> None:
        self.occurrence = occurrence
        self._occurrence = occurrence_code(occurrence)
        self._depth = check_recent_depth(recent_depth)
        toks = as_tokens(tokens)
        check_request_tokens(toks.shape[0], "the automaton")
        self._buf = ingest(new_blob(toks.shape[0]), toks, self._occurrence, self._depth)

    def extend(self, tokens: Any) -> None:
        """Append tokens (a sequence of ids in [0, 2**31))."""
        toks = as_tokens(tokens)
        check_request_tokens(len(self) + toks.shape[0], "the automaton")
        self._buf = ingest(self._buf, toks, self._occurrence, self._depth)

    def match(self) -> tuple[int, int]:
        """(length, start): the longest suffix of the text that also ends earlier,
        in tokens, and the text position where the chosen earlier occurrence's
        continuation starts (-1 when length is 0)."""
        m = int(self._buf[core.H_MATCH_LEN])
        return m, (int(self._buf[core.H_MATCH_POS]) if m else -1)

    def draft(self, k: int) -> np.ndarray:
        """The next ``k`` draft tokens as int32 [<= k]; empty when there is no match."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        out = np.empty(k, dtype=np.int32)
        count = _draft(self._buf, out, k)
        return out[:count]

    @property
    def tokens(self) -> np.ndarray:
        """A copy of the text, int32 [len(self)]."""
        o = int(self._buf[core.H_O_TEXT])
        return self._buf[o : o + len(self)].copy()

    @property
    def num_states(self) -> int:
        return int(self._buf[core.H_NSTATES])

    @property
    def num_edges(self) -> int:
        return int(self._buf[core.H_USED])

    @property
    def nbytes(self) -> int:
        """Host bytes held by the automaton (its one blob)."""
        return int(self._buf.nbytes)

    def __len__(self) -> int:
        return int(self._buf[core.H_N])

    def __repr__(self) -> str:
        m, _ = self.match()
        return f"SuffixAutomaton(tokens={len(self)}, states={self.num_states}, match={m}, occurrence={self.occurrence!r})"


@njit(nogil=True, cache=True)
def _draft(buf, out, k):
    return core.draft(buf, out, k)
