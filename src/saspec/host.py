"""The host backend of ``SpecEngine``: request blobs in host memory, stepped by ``extend``'s kernels.

Three small pieces, composed:

* a *blob kind* says how one request's blob is built, grown, read and stepped:
  ``SABlobs`` (the suffix automaton, ``core``/``build``), or ``ngram.NgramBlobs``
  (the prompt-lookup baseline);
* ``HostSlots`` holds the blobs in numbered slots, with the address table the
  kernels read (see ``extend``) and the per-slot arrays (prompt length, pool match);
* ``HostBackend`` runs the steps over them: the prepared batch's rows, the fused
  fast path, and the cross-request pool's side of a step; the growth of full
  blobs (ahead of need, inside a step, or parked) is its ``growth.Growth``'s.

The engine keeps the request ids, validation order and threading rules and calls
these under its lock (``build`` excepted: it runs without the lock and the GIL).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import int32, int64, njit

from . import build, core
from . import extend as kx
from .arena import Allocator, BlobArena, address, blob_bytes
from .growth import STEP_GROWTH_WORDS, Growth  # noqa: F401  (STEP_GROWTH_WORDS: docs name it host.STEP_GROWTH_WORDS)
from .validate import BRANCH_PAIRS, SOURCE_PAIRS, as_int32_array, check_no_overlap, overlap_message

EMPTY_BLOB = build.new_blob(0)  # what a free slot holds
_I32 = np.dtype(np.int32)  # native byte order
_STEP_EXACT = None  # kx.step_all compiled for exactly the argument types of the fast path (see _exact_step)


def _exact_step():
    """``kx.step_all`` as a dispatcher that accepts only what a valid call passes:
    writable C-contiguous int32 numpy arrays of the right ranks (and the int64
    address table and growth marks). Anything else fails numba's dispatch with
    ``TypeError`` before any code runs, and ``extend`` then re-checks the
    arguments one by one to say what is wrong. ``extend`` also sends only
    native-byte-order int32 arrays here: numba types a byte-swapped array like a
    native one once its type cache has seen an unaligned array of that rank.
    Built on first use (it compiles eagerly)."""
    global _STEP_EXACT
    if _STEP_EXACT is None:
        a1, a2, i2 = int32[::1], int32[:, ::1], int64[:, ::1]
        sig = int64(i2, a2, a2, a1, a1, a2, a1, a1, i2, a1, a1, int64, a2, int64, int64, int64[::1], int64)
        _STEP_EXACT = njit(sig, nogil=True, cache=True, **core.NO_NRT)(_step_exact_impl)
    return _STEP_EXACT


def _step_exact_impl(table, rp, accepted, lens, match_out, draft_out, source_out, branch_out, ahead, marked, pool,
                     base, pool_state, epoch, sync_tokens, ctl, flags):
    return kx.step_all(table, rp, accepted, lens, match_out, draft_out, source_out, branch_out, ahead, marked, pool,
                       base, pool_state, epoch, sync_tokens, ctl, flags)


class BlobKind(Protocol):
    """What ``HostBackend`` needs of a drafter's blobs (``SABlobs``, ``ngram.NgramBlobs``)."""

    n_word: int  # the blob word that holds the token count (``check_step``)
    fused: bool  # steps may take ``extend.step_all``: the checks, the SA kernel and the pool's side in one call
    grows_ahead: bool  # nearly full blobs are grown on a background thread (``extend.rows_past_mark``)

    def build(self, tokens: np.ndarray, headroom: int | None, alloc: Allocator) -> np.ndarray: ...
    def grow(self, blob: np.ndarray, more_tokens: int, alloc: Allocator) -> np.ndarray: ...
    def append_fitting(self, blob: np.ndarray, tokens: np.ndarray) -> int: ...  # kinds that grow ahead
    def tokens(self, blob: np.ndarray) -> int: ...
    def text(self, blob: np.ndarray) -> np.ndarray: ...
    def run(self, table: np.ndarray, rp: np.ndarray, acc, lens, mout, dout, bout, parallel: bool, ctl) -> int: ...


class SABlobs:
    """The suffix automaton's blobs (``core``, ``build``), stepped by ``extend.extend_rows``.

    Args:
        occurrence: an occurrence rule code (``build.occurrence_code``).
        depth: the recency depth (``build.check_recent_depth``).
    """

    n_word = core.H_N
    fused = True
    grows_ahead = True

    def __init__(self, occurrence: int, depth: int) -> None:
        self.occurrence, self.depth = occurrence, depth

    def build(self, tokens: np.ndarray, headroom: int | None, alloc: Allocator) -> np.ndarray:
        """The automaton of validated int32 ``tokens``, with room for ``headroom`` more (None: the default)."""
        blob = build.ingest(build.new_blob(tokens.shape[0], headroom, alloc), tokens, self.occurrence, self.depth, alloc)
        return blob if headroom is None else build.reserve(blob, headroom, alloc)

    def grow(self, blob: np.ndarray, more_tokens: int, alloc: Allocator) -> np.ndarray:
        return build.grow(blob, more_tokens, alloc)

    def append_fitting(self, blob: np.ndarray, tokens: np.ndarray) -> int:
        """Append int32 ``tokens`` to ``blob`` as a step would, while they fit; how many did."""
        return build.append_fitting(blob, tokens, self.occurrence, self.depth)

    def tokens(self, blob: np.ndarray) -> int:
        return int(blob[core.H_N])

    def text(self, blob: np.ndarray) -> np.ndarray:
        """A copy of the blob's tokens."""
        o = int(blob[core.H_O_TEXT])
        return blob[o: o + int(blob[core.H_N])].copy()

    def run(self, table, rp, acc, lens, mout, dout, bout, parallel: bool, ctl) -> int:
        """One step over the address table; how many rows stopped for lack of room.
        ``bout``: int32 [B] for each row's ``core.branched``, or empty. ``parallel``: the
        caller holds ``extend.PARALLEL_LOCK``."""
        run = kx.extend_rows_parallel if parallel else kx.extend_rows
        return run(table, rp, acc, lens, mout, dout, bout, self.occurrence, self.depth, ctl[kx.C_LOOKAHEAD])


class HostSlots:
    """Request blobs in numbered host slots, and the address table the kernels read.

    Slot ``s`` holds ``blobs[s]``; ``table[:, s]`` is its (address, words)
    (see ``extend``). The two change together (``put``), only under the
    engine's lock, and ``blobs`` keeps every addressed blob alive. Per slot
    also: its request's prompt length, its match in a cross-request pool
    (``pool_state``: state, length, epoch; see ``extend.pool_rows``), and
    ``ahead`` (marked for growth ahead of need, the tokens its request is
    expected to reach; see ``extend.rows_past_mark``), which a new blob resets,
    and ``parked``: for a slot whose full blob waits for the background thread
    (see ``growth.Growth``), the tokens it could not take yet, in order.
    """

    def __init__(self) -> None:
        self.blobs: list[np.ndarray] = []
        self.arena = BlobArena()  # packs mid-size blobs onto huge pages
        self.table = np.zeros((2, 16), dtype=np.int64)
        self.prompt_len = np.zeros(16, dtype=np.int64)
        self.pool_state = np.full((3, 16), -1, dtype=np.int32)
        self.ahead = np.zeros((2, 16), dtype=np.int64)
        self.parked: dict[int, np.ndarray] = {}
        self._free: list[int] = []

    def take(self, blob: np.ndarray, prompt_len: int, expected_tokens: int = 0) -> int:
        """A free slot, now holding ``blob``, a request of ``prompt_len`` prompt tokens
        expected to reach ``expected_tokens`` (0: unknown)."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self.blobs)
            self.blobs.append(EMPTY_BLOB)
        self.put(slot, blob)
        self.prompt_len[slot] = prompt_len
        self.pool_state[:, slot] = (0, 0, -1)
        self.ahead[1, slot] = expected_tokens
        return slot

    def put(self, slot: int, blob: np.ndarray) -> None:
        """Make ``blob`` slot ``slot``'s, in ``blobs`` and the address table."""
        table = self.table
        if slot >= table.shape[1]:
            slots = max(2 * table.shape[1], slot + 1)
            self.table = table = _grown(table, slots, 0)
            self.prompt_len = _grown(self.prompt_len, slots, 0)
            self.pool_state = _grown(self.pool_state, slots, -1)
            self.ahead = _grown(self.ahead, slots, 0)
        self.blobs[slot] = blob
        self.ahead[0, slot] = 0
        table[0, slot] = address(blob)
        table[1, slot] = blob.shape[0]

    @property
    def free_count(self) -> int:
        """Slots free to hand out again."""
        return len(self._free)

    def free(self, slot: int) -> None:
        """Drop slot ``slot``'s blob and hand the slot out again."""
        self.put(slot, EMPTY_BLOB)
        self.ahead[1, slot] = 0
        self.parked.pop(slot, None)
        self._free.append(slot)


def _grown(a: np.ndarray, slots: int, fill: int) -> np.ndarray:
    """``a`` (per slot along its last axis) widened to ``slots`` slots, the new ones ``fill``."""
    out = np.full((*a.shape[:-1], slots), fill, dtype=a.dtype)
    out[..., : a.shape[-1]] = a
    return out


class HostBackend:
    """``SpecEngine``'s CPU backend: host blobs of ``kind``, one jitted call per step.

    Full blobs grow ahead of need on a background thread, or inside a step
    within a copy budget, else their rows are parked until grown: ``growth``,
    a ``growth.Growth``, does all of it, called at a few points of each step.

    Args:
        kind: the blobs' kind (``SABlobs`` or ``ngram.NgramBlobs``).
        occurrence, depth: the occurrence rule code and recency depth the step's
            control words carry (``extend.step``).
        parallel_from: batch size from which steps run ``prange`` kernels.

    ``step_growth_words`` (default ``STEP_GROWTH_WORDS``) may be set per backend;
    ``grown_ahead`` and ``grown_in_step`` count the blobs grown on the thread and
    inside steps. ``lock`` is the engine's lock and ``faults`` its fault-injection
    hook (``saspec.faults``; None: off), both set by the engine and used by growth
    (see ``growth.Growth``). All five are ``growth``'s.
    """

    device = False

    def __init__(self, kind: BlobKind, occurrence: int, depth: int, parallel_from: int) -> None:
        self.kind = kind
        self.slots = HostSlots()
        self._parallel_from = parallel_from
        self._rp = np.zeros((2, 0), dtype=np.int32)  # the batch rows' slots, and their progress in a step
        self._parallel = False  # the prepared batch runs the parallel kernel
        self._ctl = np.zeros(kx.CTL_WORDS, dtype=np.int64)
        self._ctl[kx.C_LIMIT] = build.MAX_REQUEST_TOKENS
        self._ctl[kx.C_OCCURRENCE] = occurrence
        self._ctl[kx.C_DEPTH] = depth
        self._ctl[kx.C_LOOKAHEAD] = kx.LOOKAHEAD_MIN_BYTES
        self._source = np.zeros(0, dtype=np.int32)  # source_out when the caller gives none
        self._no_branch = np.zeros(0, dtype=np.int32)  # branch_out when the caller gives none (never written)
        self.growth = Growth(self.slots, kind)
        self._fused = kind.fused and kind.grows_ahead  # steps may take extend.step_all (the SA kernel)
        self.slow_steps = 0  # steps run on the checked path rather than the fused fast path

    # -- growth's settings and counters, by the names the engine and tests use ----------

    @property
    def lock(self) -> Any:
        """The engine's lock (set by the engine): growth ahead takes it."""
        return self.growth.lock

    @lock.setter
    def lock(self, lock: Any) -> None:
        self.growth.lock = lock

    @property
    def faults(self) -> Any:
        """The engine's fault-injection hook (set by the engine; None: off), asked before each growth."""
        return self.growth.faults

    @faults.setter
    def faults(self, faults: Any) -> None:
        self.growth.faults = faults

    @property
    def step_growth_words(self) -> int:
        """The most int32 words of blobs one step copies to grow full rows (default ``STEP_GROWTH_WORDS``)."""
        return self.growth.step_growth_words

    @step_growth_words.setter
    def step_growth_words(self, words: int) -> None:
        self.growth.step_growth_words = words

    @property
    def grown_ahead(self) -> int:
        """Blobs grown ahead of need, on the background thread."""
        return self.growth.grown_ahead

    @property
    def grown_in_step(self) -> int:
        """Blobs grown inside a step (full before their turn)."""
        return self.growth.grown_in_step

    def wait_growth(self) -> None:
        """Wait until the growth handed to the background thread is done, including
        what it hands on to itself (for tests)."""
        self.growth.wait()

    # -- requests (the engine holds its lock, except in ``build``) ------------------

    def check_prompt(self, n_tokens: int) -> None:
        """Nothing to check on the host: blobs grow."""

    def build(self, tokens: np.ndarray, headroom: int | None) -> np.ndarray:
        return self.kind.build(tokens, headroom, self.slots.arena)

    def install(self, blob: np.ndarray, prompt_len: int, expected_tokens: int = 0) -> int:
        return self.slots.take(blob, prompt_len, expected_tokens)

    def text(self, request_id: Hashable, slot: int) -> np.ndarray:
        """A copy of a request's whole text (parked tokens included)."""
        text = self.kind.text(self.slots.blobs[slot])
        parked = self.slots.parked.get(slot)
        return text if parked is None else np.concatenate((text, parked))

    def prompt_len(self, slot: int) -> int:
        return int(self.slots.prompt_len[slot])

    def release(self, request_id: Hashable, slot: int) -> None:
        self.slots.free(slot)

    def prepare(self, ids: tuple[Hashable, ...], slots: Sequence[int], request_pool: Any = None) -> None:
        rp = np.zeros((2, len(ids)), dtype=np.int32)
        rp[0] = slots
        self._rp = rp
        self._parallel = len(ids) >= self._parallel_from
        self.growth.prepare(len(ids))

    # -- the step --------------------------------------------------------------------

    def extend(self, accepted: Any, accepted_lens: Any, match_len_out: Any, draft_out: Any, source_out: Any,
               request_pool: Any, batch: tuple[Hashable, ...], branch_out: Any = None) -> None:
        """``SpecEngine.extend`` on the host (under the engine's lock; the batch is prepared)."""
        nd = np.ndarray
        rp, parallel, table = self._rp, self._parallel, self.slots.table
        b = rp.shape[1]
        parked = self.slots.parked
        budget = None  # words this step may still copy to grow blobs (None: all of step_growth_words)
        code = None
        src = None
        if (
            self._fused
            and not parallel
            and not parked  # a parked row's tokens count toward its limit: the checks below
            and type(accepted) is nd
            and type(accepted_lens) is nd
            and type(match_len_out) is nd
            and type(draft_out) is nd
            and accepted.dtype is _I32  # numba types a byte-swapped int32 array like a native one
            and accepted_lens.dtype is _I32
            and match_len_out.dtype is _I32
            and draft_out.dtype is _I32
            and (source_out is None or (type(source_out) is nd and source_out.dtype is _I32))
            and (branch_out is None or (type(branch_out) is nd and branch_out.dtype is _I32))
        ):
            # The fast path: one jitted call checks every argument, runs the step, marks the rows to
            # grow ahead and drafts from the pool.
            flags, bout, pool, base, epoch, sync = 0, self._no_branch, self._no_branch, 0, 0, 0
            if request_pool is not None:
                flags = kx.POOL_ON
                src = self._scratch_source(b) if source_out is None else source_out
                pool, epoch, base = request_pool.current  # one read: the builder swaps it whole
                sync = request_pool.sync_tokens
            else:
                src = self._no_branch  # unused without a pool
            if branch_out is not None:
                flags |= kx.BRANCH_ON
                bout = branch_out
            s = self.slots
            try:
                code = (_STEP_EXACT or _exact_step())(table, rp, accepted, accepted_lens, match_len_out, draft_out,
                                                      src, bout, s.ahead, self.growth.marked, pool, base,
                                                      s.pool_state, epoch, sync, self._ctl, flags)
            except (TypeError, ValueError, NotImplementedError):
                code = None  # numba rejected an argument's type: the checks below name it
            else:
                if code == 0:
                    n = self._ctl[kx.C_MARKED]
                    if n:
                        self.growth.grow_marked(int(n))
                    return
                if code < 0:
                    raise self._rejection(code, batch, accepted, accepted_lens, draft_out, match_len_out, src, bout)
            acc, lens, mout, dout = accepted, accepted_lens, match_len_out, draft_out
            src = src if request_pool is not None else None
        if code is None:
            # The checked path: each argument converted (CPU tensors) and checked in Python, in extend's order.
            bout = self._no_branch
            outs = (accepted, accepted_lens, match_len_out, draft_out)
            if request_pool is not None:  # before anything runs: a rejected call changes nothing
                src = self._check_row_out(source_out, "source_out", b, outs, SOURCE_PAIRS)
            if branch_out is not None:
                bout = self._check_row_out(branch_out, "branch_out", b, (*outs, source_out), BRANCH_PAIRS)
            acc = as_int32_array(accepted, "accepted", 2)
            lens = as_int32_array(accepted_lens, "accepted_lens", 1)
            mout = as_int32_array(match_len_out, "match_len_out", 1, writable=True)
            dout = as_int32_array(draft_out, "draft_out", 2, writable=True)
            code = kx.check_step(table, rp, acc, lens, mout, dout, self._ctl, self.kind.n_word)
            if code == kx.OK and parked:
                code = self.growth.check_parked(rp, lens, self._ctl)
            if code == kx.OK:
                self.slow_steps += 1
                if parked:
                    budget = self.growth.unpark()
                code = self._step(parallel, acc, lens, mout, dout, bout)
            if code < 0:
                raise self._rejection(code, batch, acc, lens, dout, mout, src, bout)
        # Here the step ran on the checked path, or stopped on the fast path for lack of room: rows to
        # grow, then the marks and the pool's side.
        if code > 0:
            # a partial, not a lambda: a closure would make the step's locals cells on every call
            self.growth.grow_full_rows(rp, lens, budget, partial(self._step, parallel, acc, lens, mout, dout, bout))
        if self.kind.grows_ahead:  # rows past their fill mark go to the thread (the kernel runs here: no extra call)
            growth = self.growth
            n = kx.rows_past_mark(self.slots.table, rp, self.slots.ahead, growth.marked)
            if n:
                growth.grow_marked(n)
        if request_pool is not None:
            self._draft_from_pool(request_pool, rp, acc, lens, mout, dout, src, bout)
        if parked:
            self.growth.park(rp, acc, lens, mout, dout, src, bout)

    def _step(self, parallel: bool, acc, lens, mout, dout, bout) -> int:
        s = self.slots
        if not parallel:
            return self.kind.run(s.table, self._rp, acc, lens, mout, dout, bout, False, self._ctl)
        with kx.PARALLEL_LOCK:
            return self.kind.run(s.table, self._rp, acc, lens, mout, dout, bout, True, self._ctl)

    def _draft_from_pool(self, request_pool, rp, acc, lens, mout, dout, src, bout) -> None:
        """The pool's side of a step: see ``extend.pool_rows``."""
        blob, epoch, base = request_pool.current  # one read: the builder swaps it whole
        if blob[core.H_N] == 0:  # nothing pooled yet: every row keeps its own draft (and its pool state)
            src[:] = 0
            return
        kx.pool_rows(self.slots.table, rp, acc, lens, mout, dout, src, bout, blob, base, self.slots.pool_state,
                     epoch, request_pool.sync_tokens)

    def _scratch_source(self, b: int) -> np.ndarray:
        """The int32 [b] ``source_out`` of a step with a pool whose caller gave none."""
        if self._source.shape[0] != b:
            self._source = np.zeros(b, dtype=np.int32)
        return self._source

    def _check_row_out(self, out: Any, name: str, b: int, others: tuple, pairs: tuple) -> np.ndarray:
        """An optional per-row output (``source_out``, ``branch_out``) as int32 [B], checked before the
        step against ``others`` (the step's arrays before it in ``extend``'s order, None where not
        given); a scratch array where it is None."""
        if out is None:
            return self._scratch_source(b)
        nd = np.ndarray
        firsts = others[:4]
        if (all(x is None for x in others[4:]) and type(out) is nd and out.dtype is _I32 and out.ndim == 1
                and out.flags.c_contiguous and out.flags.writeable
                and all(type(x) is nd and x.flags.c_contiguous for x in firsts)):
            code = kx.check_source(out, b, *firsts)  # the fast path: one jitted check
            if code == -1:
                return out
        arr = as_int32_array(out, name, 1, writable=True)
        if arr.shape != (b,):
            raise ValueError(f"{name} must have shape {(b,)} for batch {b}, got {arr.shape}")
        check_no_overlap((*others, arr), pairs)
        return arr

    def _rejection(self, code: int, batch: tuple[Hashable, ...], acc, lens, dout, mout, src, bout) -> Exception:
        """The exception for a negative ``check_step`` or ``step_all`` code."""
        b, k = len(batch), dout.shape[1]
        limit = int(self._ctl[kx.C_LIMIT])
        r, c = int(self._ctl[kx.C_ERR]), int(self._ctl[kx.C_ERR + 1])
        if code in (kx.BAD_SOURCE_SHAPE, kx.BAD_BRANCH_SHAPE):
            name, arr = ("source_out", src) if code == kx.BAD_SOURCE_SHAPE else ("branch_out", bout)
            return ValueError(f"{name} must have shape {(b,)} for batch {b}, got {arr.shape}")
        if code == kx.BAD_ROWS:
            return ValueError(f"draft_out must have {b} rows for the prepared batch, got {dout.shape[0]}")
        shapes = {
            kx.BAD_ACCEPTED_SHAPE: ("accepted", acc, (b, k + 1)),
            kx.BAD_LENS_SHAPE: ("accepted_lens", lens, (b,)),
            kx.BAD_MATCH_SHAPE: ("match_len_out", mout, (b,)),
        }
        if code in shapes:
            name, arr, shape = shapes[code]
            return ValueError(f"{name} must have shape {shape} for batch {b} and K={k}, got {arr.shape}")
        if code == kx.OVERLAP:
            return ValueError(overlap_message(r, c))
        if code == kx.BAD_LEN:
            return ValueError(f"accepted_lens[{r}] = {lens[r]} is outside [0, K+1 = {k + 1}]")
        if code == kx.BAD_TOKEN:
            return ValueError(f"accepted[{r}, {c}] = {acc[r, c]} is a negative token id")
        if code == kx.TOO_LONG:
            return ValueError(
                f"row {r} (request {batch[r]!r}) would hold {c} tokens, more than the limit of {limit} "
                "(build.MAX_REQUEST_TOKENS: blob offsets are int32)"
            )
        return AssertionError(f"unknown check_step code {code}")

    # -- inspection ------------------------------------------------------------------

    def tokens(self, request_id: Hashable, slot: int) -> int:
        parked = self.slots.parked.get(slot)
        return self.kind.tokens(self.slots.blobs[slot]) + (0 if parked is None else parked.shape[0])

    def overflowed(self, request_id: Hashable, slot: int) -> bool:
        return False  # host blobs grow

    def stats(self, slot_of: dict[Hashable, int]) -> dict[str, int]:
        blobs = [self.slots.blobs[s] for s in slot_of.values()]
        return {"requests": len(blobs), "tokens": sum(self.tokens(r, s) for r, s in slot_of.items()),
                "bytes": sum(blob_bytes(b) for b in blobs), "overflowed": 0, **self.growth.stats(slot_of.values()),
                "slow_steps": self.slow_steps, "slots": len(self.slots.blobs), "free_slots": self.slots.free_count}

    def blob_copies(self, slot_of: dict[Hashable, int]) -> dict[Hashable, np.ndarray]:
        return {r: self.slots.blobs[s].copy() for r, s in slot_of.items()}

    def close(self) -> None:
        """Nothing to stop on the host."""

