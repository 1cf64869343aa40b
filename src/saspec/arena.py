"""Arena: where automaton blobs live, on transparent huge pages.

A decode step reads a few records in each of many requests' blobs. On 4 KiB
pages most of those reads also miss the TLB, so blobs go on huge pages
(Linux): a blob of at least ``HUGE_PAGE`` bytes starts on a huge-page
boundary and is advised to use them (``empty_blob``); mid-size blobs, which
alone would sit on 4 KiB pages or end on them, are carved from shared
huge-page chunks by an engine's ``BlobArena``. Elsewhere every blob is a plain
numpy array. What the layout buys per step is in BENCHMARKS.md ("Host
engine").

An *allocator* is any callable ``words -> int32 array`` (``empty_blob``, or a
``BlobArena``); the builder (``build``) takes one wherever it allocates.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Callable

import numpy as np

Allocator = Callable[[int], np.ndarray]

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

#: Whether this platform can advise huge pages (Linux); without it the arena hands out plain arrays.
ADVISES_HUGE_PAGES = _madvise is not None


def empty_blob(words: int) -> np.ndarray:
    """An uninitialized int32 array of ``words`` words for a blob; from
    ``HUGE_PAGE`` bytes on, huge-page aligned and advised. The alignment
    padding is virtual memory that is never touched."""
    if 4 * words < HUGE_PAGE or _madvise is None:
        return np.empty(words, dtype=np.int32)
    raw = np.empty(words + HUGE_PAGE // 4, dtype=np.int32)
    skip = (-raw.ctypes.data % HUGE_PAGE) // 4
    buf = raw[skip : skip + words]
    _madvise(buf.ctypes.data, buf.nbytes, _MADV_HUGEPAGE)  # a hint: failure changes nothing
    return buf


# Blobs of ARENA_MIN to ARENA_MAX bytes (about 700 to 40,000 tokens) are carved
# from ARENA_CHUNK-byte chunks.
ARENA_MIN = 64 << 10
ARENA_MAX = 4 << 20
ARENA_CHUNK = 64 << 20
ARENA_REUSE = 1.5  # a free block up to this many times the size asked for is reused before carving a new one


def size_class(nbytes: int) -> int:
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

    A blob is a block of its size class (:func:`size_class`: at most 12.5%
    unused), from the class's free list, else a free block at most
    ``ARENA_REUSE`` times larger, else the current chunk (a new chunk when it
    is full; the old one's tail, less than ``ARENA_MAX``, stays unused). A
    block returns to the free list once no array views it any more (numpy
    keeps the block's owner alive), so memory is never reused while anything
    can still read it. Chunks are kept, not given back to the system: under
    churn the arena carves about the most its engine held at once. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}  # size class -> block addresses
        self._returned: list[tuple[int, int]] = []  # (size, address): freed, not yet in _free
        self._chunks: list[np.ndarray] = []
        self._next = 0  # the current chunk's unused range [_next, _end)
        self._end = 0
        self._carved = 0  # bytes of blocks carved from chunks (handed out now, or free)

    def __call__(self, words: int) -> np.ndarray:
        """An uninitialized int32 blob of ``words`` words (an ``Allocator``)."""
        nbytes = 4 * words
        if not ARENA_MIN <= nbytes < ARENA_MAX or _madvise is None:
            return empty_blob(words)
        size = size_class(nbytes)
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
                self._carved += size
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
    def used_bytes(self) -> int:
        """Bytes of the blocks handed out and still viewed by some array (a block returns once none
        views it, see ``_Block``): with every blob gone, 0."""
        with self._lock:
            free = sum(size for size, _ in self._returned)
            free += sum(size * len(blocks) for size, blocks in self._free.items())
            return self._carved - free

    @property
    def reserved_bytes(self) -> int:
        """Bytes of chunks this arena holds (used, free or not yet handed out)."""
        return len(self._chunks) * ARENA_CHUNK


def _block_of(blob: np.ndarray) -> _Block | None:
    base = blob.base
    while isinstance(base, np.ndarray):
        base = base.base
    return base if isinstance(base, _Block) else None


def is_arena_blob(blob: np.ndarray) -> bool:
    """Whether ``blob`` lies in an arena block (rather than in its own array)."""
    return _block_of(blob) is not None


def blob_bytes(blob: np.ndarray) -> int:
    """Bytes ``blob`` occupies: its arena block, or its own size."""
    block = _block_of(blob)
    return block.size if block is not None else int(blob.nbytes)


def address(blob: np.ndarray) -> int:
    """The address of the first word of ``blob``, an array as an allocator
    returned it (not a view of one). ``blob.ctypes.data`` builds a ctypes
    object, dear next to a decode step that re-allocates, so an arena blob's
    address is read from its block."""
    base = blob.base
    return base.addr if type(base) is _Block else blob.ctypes.data
