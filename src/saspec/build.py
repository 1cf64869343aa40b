"""Build: host-side automata whose memory grows with the request.

A request's automaton is one int32 *blob* laid out by ``core.init``. The host
builds it with ``ingest``, which runs the core's ``extend`` in a jitted loop
with the GIL released and, whenever the blob is full, grows it in Python (a
geometric re-allocation, outside the hot loop) and carries on.

``SuffixAutomaton`` wraps one blob for direct use and for tests. An engine
allocates its blobs from a ``BlobArena``, which packs mid-size ones onto huge
pages.
"""

from __future__ import annotations

import ctypes
import numbers
import sys
import threading
from typing import Any, Callable

import numpy as np
from numba import njit

from . import core

POLICIES: dict[str, int] = {
    "first": core.FIRST_OCC,
    "recent": core.RECENT,
    "near-first": core.NEAR_FIRST,
    "near-recent": core.NEAR_RECENT,
}
DEFAULT_POLICY = "near-first"
DEFAULT_RECENT_DEPTH = 4
MAX_RECENT_DEPTH = 1024  # the *recent policies cost O(recent_depth) per token
MAX_TOKEN = 2**31 - 1
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


# Blobs of at least HUGE_PAGE bytes start on a huge-page boundary and are
# advised to use transparent huge pages (Linux): a decode step reads records
# all over many requests' blobs, and with 4 KiB pages most of those reads also
# miss the TLB. The alignment padding is virtual memory that is never touched.
HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_madvise = _libc_madvise()


def empty_blob(words: int) -> np.ndarray:
    """An uninitialized int32 array of ``words`` words for a blob; from
    ``HUGE_PAGE`` bytes on, huge-page aligned and advised (see above)."""
    if 4 * words < HUGE_PAGE or _madvise is None:
        return np.empty(words, dtype=np.int32)
    raw = np.empty(words + HUGE_PAGE // 4, dtype=np.int32)
    skip = (-raw.ctypes.data % HUGE_PAGE) // 4
    buf = raw[skip : skip + words]
    _madvise(buf.ctypes.data, buf.nbytes, _MADV_HUGEPAGE)  # a hint: failure changes nothing
    return buf


# Blobs of ARENA_MIN to ARENA_MAX bytes (about 700 to 40,000 tokens) are carved
# from shared chunks that ``BlobArena`` lays on huge pages: alone, each would sit
# on 4 KiB pages (below HUGE_PAGE) or end on them. Measured (BENCHMARKS.md): a
# decode step 21-28% faster at 8k-token requests, 8-18% at 1k, 10% at 32k.
ARENA_MIN = 64 << 10
ARENA_MAX = 4 << 20
ARENA_CHUNK = 64 << 20
ARENA_REUSE = 1.5  # a free block up to this many times the size asked for is reused before carving a new one

Allocator = Callable[[int], np.ndarray]


def _size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to a size class: classes are 1/8 of a power of two
    apart, so a block is at most 12.5% larger than asked (and a multiple of 8 KiB)."""
    step = 1 << max(nbytes.bit_length() - 4, 13)
    return -(-nbytes // step) * step


_INT32 = np.dtype(np.int32).str


class _Block:
    """Owner of one arena block; numpy keeps it as the base of every array
    viewing the block, and it returns the block when the last one is gone."""

    __slots__ = ("arena", "addr", "size", "__array_interface__")

    def __init__(self, arena: BlobArena, addr: int, size: int, words: int) -> None:
        self.arena, self.addr, self.size = arena, addr, size
        self.__array_interface__ = {"data": (addr, False), "shape": (words,), "typestr": _INT32, "version": 3}

    def __del__(self) -> None:
        self.arena._returned.append((self.size, self.addr))  # list.append is atomic: safe from any thread's GC


class BlobArena:
    """Blob memory for one engine: blobs of ``ARENA_MIN`` to ``ARENA_MAX``
    bytes packed into ``ARENA_CHUNK``-byte chunks on transparent huge pages
    (Linux; elsewhere, and outside that range, ``empty_blob``).

    A decode step reads a few records in each of many requests' blobs, and
    on 4 KiB pages most of those reads also miss the TLB. A blob is a block
    of its size class (``_size_class``: at most 12.5% unused), from the
    class's free list, else a free block at most ``ARENA_REUSE`` times
    larger, else the current chunk (a new chunk when it is full; the old
    one's tail, less than ``ARENA_MAX``, stays unused). A block
    returns to the free list once no array views it any more (numpy keeps
    the block's owner alive), so memory is never reused while anything can
    still read it. Chunks are kept, not given back to the system: under
    churn the arena carves about the most its engine held at once (3,000
    adds and removes of 700-20,000-token requests, at most 21 live: 36 MiB
    carved). Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}  # size class -> block addresses
        self._returned: list[tuple[int, int]] = []  # (size, address): freed, not yet in _free
        self._chunks: list[np.ndarray] = []
        self._next = 0  # the current chunk's unused range [_next, _end)
        self._end = 0

    def __call__(self, words: int) -> np.ndarray:
        """An uninitialized int32 blob of ``words`` words (an ``Allocator``)."""
        nbytes = 4 * words
        if not ARENA_MIN <= nbytes < ARENA_MAX or _madvise is None:
            return empty_blob(words)
        size = _size_class(nbytes)
        with self._lock:
            while self._returned:
                freed_size, addr = self._returned.pop()
                self._free.setdefault(freed_size, []).append(addr)
            blocks = self._free.get(size)
            size, addr = (size, blocks.pop()) if blocks else self._take_free(size)
            if addr < 0:
                if self._next + size > self._end:
                    chunk = empty_blob(ARENA_CHUNK // 4)  # huge-page aligned and advised
                    self._chunks.append(chunk)
                    self._next, self._end = chunk.ctypes.data, chunk.ctypes.data + ARENA_CHUNK
                addr = self._next
                self._next += size
        return np.asarray(_Block(self, addr, size, words))

    def _take_free(self, size: int) -> tuple[int, int]:
        """(block size, address) of the smallest free block of ``size`` up to
        ``ARENA_REUSE`` times larger, so requests whose sizes drift do not keep
        carving new blocks; (size, -1) if none."""
        fits = [c for c, blocks in self._free.items() if blocks and size <= c <= ARENA_REUSE * size]
        if not fits:
            return size, -1
        c = min(fits)
        return c, self._free[c].pop()

    @property
    def reserved_bytes(self) -> int:
        """Bytes of chunks this arena holds (used, free or not yet handed out)."""
        return len(self._chunks) * ARENA_CHUNK


def blob_bytes(blob: np.ndarray) -> int:
    """Bytes ``blob`` occupies: its arena block, or its own size."""
    base = blob.base
    while isinstance(base, np.ndarray):
        base = base.base
    return base.size if isinstance(base, _Block) else int(blob.nbytes)


def policy_code(policy: str) -> int:
    """Numeric code of an occurrence policy name (see ``core``)."""
    try:
        return POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; expected one of {sorted(POLICIES)}") from None


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


def check_int(value: Any, name: str, low: int, *, what: str = "an int") -> int:
    """``value`` as an int if it is an int >= ``low`` (numpy ints too, not a
    bool); otherwise ``TypeError`` or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {what} >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be {what} >= {low}, got {value}")
    return int(value)


def optional_int(value: Any, name: str, low: int) -> int | None:
    """``None``, or ``value`` checked by :func:`check_int`."""
    return None if value is None else check_int(value, name, low, what="None or an int")


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
    more = int(more_tokens)
    (n, ns, used), (cap_tok0, cap_st0, ht0) = _fill(buf)
    cap_tok = max(cap_tok0, n + more)
    cap_st = max(cap_st0, ns + 2 * more)
    need_edges = used + int(_EDGES_PER_TOKEN * more)
    ht = ht0 if core.max_used(ht0) >= need_edges else _table_size(need_edges)
    if (cap_tok, cap_st, ht) == (cap_tok0, cap_st0, ht0):
        return buf
    return _copied(buf, cap_tok, cap_st, ht, alloc)


def address(blob: np.ndarray) -> int:
    """The address of the first word of ``blob``, an array as an ``Allocator``
    returned it (not a view of one): ``blob.ctypes.data``, which costs more
    than a microsecond, read from the block for arena blobs."""
    base = blob.base
    return base.addr if type(base) is _Block else blob.ctypes.data


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
def _ingest(buf, tokens, start, policy, depth):
    """Append tokens[start:] until done or out of room; return the next index."""
    i = start
    while i < tokens.shape[0]:
        r = core.extend(buf, tokens[i], policy, depth)
        if r == core.NO_ROOM:
            break
        i += 1
    return i


def ingest(buf: np.ndarray, tokens: np.ndarray, policy: int, depth: int, alloc: Allocator = empty_blob) -> np.ndarray:
    """Append validated int32 ``tokens`` to ``buf``, growing it as needed.

    Returns the blob that now holds the automaton (``buf`` or a grown copy
    from ``alloc``). Runs without the GIL except while growing.
    """
    i = 0
    while True:
        i = _ingest(buf, tokens, i, policy, depth)
        if i == tokens.shape[0]:
            return buf
        buf = grow(buf, tokens.shape[0] - i, alloc)


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
    """Validate ``recent_depth``: an int (numpy ints too, not bool) in
    [0, ``MAX_RECENT_DEPTH``]. Returns it as an int; raises ``TypeError`` or
    ``ValueError`` naming it otherwise. The bound keeps the ``*recent``
    policies at O(depth) per token (an unbounded walk is O(n) per token on
    repetitive text)."""
    if isinstance(depth, bool) or not isinstance(depth, numbers.Integral):
        raise TypeError(f"recent_depth must be an int in [0, {MAX_RECENT_DEPTH}], got {depth!r}")
    if not 0 <= depth <= MAX_RECENT_DEPTH:
        raise ValueError(f"recent_depth must be in [0, {MAX_RECENT_DEPTH}], got {depth}")
    return int(depth)


def as_tokens(tokens: Any, name: str = "tokens") -> np.ndarray:
    """Validate a 1-D sequence of token ids and return it as contiguous int32.

    Accepts lists, numpy arrays and CPU torch tensors of an integer dtype with
    values in [0, 2**31). Raises ``TypeError`` or ``ValueError`` naming the problem.
    """
    if type(tokens).__module__.startswith("torch"):
        if tokens.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor, got device {tokens.device}")
        tokens = tokens.detach().numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int32)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > MAX_TOKEN:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} holds token {bad}, outside [0, 2**31)")
    return np.ascontiguousarray(arr, dtype=np.int32)


def as_int32_array(x: Any, name: str, ndim: int, *, writable: bool = False, where: str = "for backend 'cpu'") -> np.ndarray:
    """View a numpy array or CPU torch tensor as a C-contiguous int32 numpy array
    without copying, or raise a ``TypeError``/``ValueError`` naming the problem."""
    if type(x).__module__.startswith("torch"):
        if x.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor {where}, got device {x.device}")
        if x.requires_grad:
            raise ValueError(f"{name} must not require grad")
        x = x.numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or torch tensor, got {type(x).__name__}")
    if x.dtype != np.int32:
        raise TypeError(f"{name} must have dtype int32, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writable and not x.flags.writeable:
        raise ValueError(f"{name} must be writable")
    return x


class SuffixAutomaton:
    """The suffix automaton of one growing token sequence.

    >>> sa = SuffixAutomaton([1, 2, 3, 9, 1, 2])
    >>> sa.match()
    (2, 2)
    >>> sa.draft(3).tolist()
    [3, 9, 1]

    Args:
        tokens: initial tokens (list, numpy array or CPU torch tensor of ints).
        policy: which earlier occurrence drafts are copied from: ``"first"``,
            ``"recent"``, ``"near-first"`` or ``"near-recent"`` (see ``core``).
        recent_depth: bound on the states whose recency is refreshed per token
            for the ``*recent`` policies, an int in [0, ``MAX_RECENT_DEPTH``].

    Holds at most ``MAX_REQUEST_TOKENS`` tokens: the constructor and
    ``extend`` raise ``ValueError`` (changing nothing) beyond that.
    """

    def __init__(
        self,
        tokens: Any = (),
        *,
        policy: str = DEFAULT_POLICY,
        recent_depth: int = DEFAULT_RECENT_DEPTH,
    ) -> None:
        self.policy = policy
        self._policy = policy_code(policy)
        self._depth = check_recent_depth(recent_depth)
        toks = as_tokens(tokens)
        check_request_tokens(toks.shape[0], "the automaton")
        self._buf = ingest(new_blob(toks.shape[0]), toks, self._policy, self._depth)

    def extend(self, tokens: Any) -> None:
        """Append tokens (a sequence of ids in [0, 2**31))."""
        toks = as_tokens(tokens)
        check_request_tokens(len(self) + toks.shape[0], "the automaton")
        self._buf = ingest(self._buf, toks, self._policy, self._depth)

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
        return f"SuffixAutomaton(tokens={len(self)}, states={self.num_states}, match={m}, policy={self.policy!r})"


@njit(nogil=True, cache=True)
def _draft(buf, out, k):
    return core.draft(buf, out, k)
