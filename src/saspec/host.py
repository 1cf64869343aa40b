"""The host backend of ``SpecEngine``: request blobs in host memory, stepped by ``extend``'s kernels.

Three small pieces, composed:

* a *blob kind* says how one request's blob is built, grown, read and stepped:
  ``SABlobs`` (the suffix automaton, ``core``/``build``), or ``ngram.NgramBlobs``
  (the prompt-lookup baseline);
* ``HostSlots`` holds the blobs in numbered slots, with the address table the
  kernels read (see ``extend``) and the per-slot arrays (prompt length, pool match);
* ``HostBackend`` runs the steps over them: the prepared batch's rows, the fused
  fast path, growth of full blobs, and the cross-request pool's side of a step.

The engine keeps the request ids, validation order and threading rules and calls
these under its lock (``build`` excepted: it runs without the lock and the GIL).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import int32, int64, njit

from . import build, core
from . import extend as kx
from .arena import Allocator, BlobArena, address, blob_bytes
from .faults import inject
from .validate import BRANCH_PAIRS, SOURCE_PAIRS, as_int32_array, check_no_overlap, overlap_message

_log = logging.getLogger(__name__)
EMPTY_BLOB = build.new_blob(0)  # what a free slot holds
_I32 = np.dtype(np.int32)  # native byte order
_STEP_EXACT = None  # kx.step compiled for exactly the argument types of the fast path (see _exact_step)


def _exact_step():
    """``kx.step`` as a dispatcher that accepts only what a valid call passes:
    writable C-contiguous int32 numpy arrays of the right ranks (and the int64
    address table). Anything else fails numba's dispatch with ``TypeError``
    before any code runs, and ``extend`` then re-checks the arguments one by
    one to say what is wrong. ``extend`` also sends only native-byte-order
    int32 arrays here: numba types a byte-swapped array like a native one once
    its type cache has seen an unaligned array of that rank. Built on first
    use (it compiles eagerly)."""
    global _STEP_EXACT
    if _STEP_EXACT is None:
        a1, a2 = int32[::1], int32[:, ::1]
        sig = int64(int64[:, ::1], a2, a2, a1, a1, a2, a1, int64[::1])
        _STEP_EXACT = njit(sig, nogil=True, cache=True, **core.NO_NRT)(_step_exact_impl)
    return _STEP_EXACT


def _step_exact_impl(table, rp, accepted, lens, match_out, draft_out, branch_out, ctl):
    return kx.step(table, rp, accepted, lens, match_out, draft_out, branch_out, ctl)


class BlobKind(Protocol):
    """What ``HostBackend`` needs of a drafter's blobs (``SABlobs``, ``ngram.NgramBlobs``)."""

    n_word: int  # the blob word that holds the token count (``check_step``)
    fused: bool  # steps may take ``extend.step``, the check and the SA kernel in one call
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
        policy: an occurrence policy code (``build.policy_code``).
        depth: the recency depth (``build.check_recent_depth``).
    """

    n_word = core.H_N
    fused = True
    grows_ahead = True

    def __init__(self, policy: int, depth: int) -> None:
        self.policy, self.depth = policy, depth

    def build(self, tokens: np.ndarray, headroom: int | None, alloc: Allocator) -> np.ndarray:
        """The automaton of validated int32 ``tokens``, with room for ``headroom`` more (None: the default)."""
        blob = build.ingest(build.new_blob(tokens.shape[0], headroom, alloc), tokens, self.policy, self.depth, alloc)
        return blob if headroom is None else build.reserve(blob, headroom, alloc)

    def grow(self, blob: np.ndarray, more_tokens: int, alloc: Allocator) -> np.ndarray:
        return build.grow(blob, more_tokens, alloc)

    def append_fitting(self, blob: np.ndarray, tokens: np.ndarray) -> int:
        """Append int32 ``tokens`` to ``blob`` as a step would, while they fit; how many did."""
        return build.append_fitting(blob, tokens, self.policy, self.depth)

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
        return run(table, rp, acc, lens, mout, dout, bout, self.policy, self.depth, ctl[kx.C_LOOKAHEAD])


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
    (see ``HostBackend``), the tokens it could not take yet, in order.
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


_GROWER: ThreadPoolExecutor | None = None  # the process's one growth-ahead thread (started on first use)


def _grower() -> ThreadPoolExecutor:
    global _GROWER
    if _GROWER is None:
        _GROWER = ThreadPoolExecutor(1, thread_name_prefix="saspec-grow")
    return _GROWER


def _grow_ahead(ref: weakref.ref, slots: list[int]) -> None:
    """Grow each marked slot of the backend ``ref()`` (the thread holds the backend
    only while it grows one: an engine dropped meanwhile is collected)."""
    for slot in slots:
        backend = ref()
        if backend is None:
            return
        backend.grow_slot(slot)
        del backend


def _report_growth_failure(exc: Exception, tokens: int, where: str) -> None:
    """Log one failed growth (``HostBackend``): a warning, since the row is retried; the traceback
    only for what is not a plain ``MemoryError``."""
    _log.warning("saspec: growing a request's automaton of %d tokens %s failed (%s: %s); it is retried at a "
                 "later step, its row drafting nothing while its blob is full", tokens, where,
                 type(exc).__name__, str(exc),  # a string: a kept record keeps no frame (and no blob) alive
                 exc_info=None if isinstance(exc, MemoryError) else exc)


# The most int32 words of blobs one step copies to grow full rows (1 MiB, a few
# hundred microseconds of copying); other full rows are parked (see HostBackend).
STEP_GROWTH_WORDS = 1 << 18


def _grown(a: np.ndarray, slots: int, fill: int) -> np.ndarray:
    """``a`` (per slot along its last axis) widened to ``slots`` slots, the new ones ``fill``."""
    out = np.full((*a.shape[:-1], slots), fill, dtype=a.dtype)
    out[..., : a.shape[-1]] = a
    return out


class HostBackend:
    """``SpecEngine``'s CPU backend: host blobs of ``kind``, one jitted call per step.

    Growth ahead of need: a blob that must grow mid-step is copied inside that
    ``extend`` call, and rows of one prompt length fill up in the same step, so
    one step would pay every row's copy at once. Instead, after each step the
    rows whose blobs passed their fill mark (``extend.rows_past_mark``) are
    handed to one process-wide background thread, which rebuilds each from its
    text into a larger blob without the engine's lock (and without the GIL), then
    takes the lock only to append the tokens the row gained meanwhile (no more
    than the new blob has room for) and swap it in. The automaton is the same
    (the same tokens through the same ``core.extend``), so drafts are too.

    A row that fills up before its turn is grown inside the step while the
    step's copies stay within ``step_growth_words`` (a small blob's copy costs
    less than waiting for it). Past that budget the row is *parked*: its blob is
    sealed (token capacity set to its count, so the kernels append nothing to it),
    the tokens it cannot take wait in ``slots.parked``, it reports match 0 and no
    draft, and the background thread appends them when it swaps the grown blob
    in; each step also grows parked rows itself, earliest first, with what is
    left of its budget. So no step copies more than ``step_growth_words`` words,
    however many rows fill up at once and however close the steps come, and a
    parked row drafts again within a few steps.

    A growth that fails (``MemoryError``, on the thread or inside a step) is
    reported, never raised: logged once on the ``saspec.host`` logger and counted
    (``growth_failures``). A row whose growth ahead failed is unmarked, so the next
    step that sees it nearly full hands it to the thread again, and a parked one
    goes back to the thread at the next step (``_unpark``), which also grows it
    itself within its budget; a full row whose growth inside a step failed is
    parked. So one failure costs a row a few undrafted steps, never the rest of its
    life, and once no row is parked every step takes the fast path again.

    Args:
        kind: the blobs' kind (``SABlobs`` or ``ngram.NgramBlobs``).
        policy, depth: the occurrence policy code and recency depth the step's
            control words carry (``extend.step``).
        parallel_from: batch size from which steps run ``prange`` kernels.

    ``step_growth_words`` (default ``STEP_GROWTH_WORDS``) may be set per backend.
    ``lock`` is the engine's lock (set by the engine); growth ahead takes it.
    ``faults`` is the engine's fault-injection hook (``saspec.faults``; set by the
    engine, None: off), asked before each growth: ``"grow_ahead"`` on the thread,
    without the lock, and ``"grow_in_step"``.
    """

    device = False

    def __init__(self, kind: BlobKind, policy: int, depth: int, parallel_from: int) -> None:
        self.kind = kind
        self.slots = HostSlots()
        self._parallel_from = parallel_from
        self._rp = np.zeros((2, 0), dtype=np.int32)  # the batch rows' slots, and their progress in a step
        self._parallel = False  # the prepared batch runs the parallel kernel
        self._ctl = np.zeros(kx.CTL_WORDS, dtype=np.int64)
        self._ctl[kx.C_LIMIT] = build.MAX_REQUEST_TOKENS
        self._ctl[kx.C_POLICY] = policy
        self._ctl[kx.C_DEPTH] = depth
        self._ctl[kx.C_LOOKAHEAD] = kx.LOOKAHEAD_MIN_BYTES
        self._source = np.zeros(0, dtype=np.int32)  # source_out when the caller gives none
        self._no_branch = np.zeros(0, dtype=np.int32)  # branch_out when the caller gives none (never written)
        self.lock: Any = None
        self.faults: Any = None
        self._marked = np.zeros(0, dtype=np.int32)  # slots rows_past_mark marked this step
        self._growth: list[Future] = []  # growth ahead handed to the background thread, not yet seen done
        self.step_growth_words = STEP_GROWTH_WORDS
        self.grown_ahead = 0  # blobs grown ahead of need
        self.grown_in_step = 0  # blobs grown inside a step (full before their turn)
        self.parked_rows = 0  # rows parked (full before their turn, past the step's budget)
        self.slow_steps = 0  # steps run on the checked path rather than the fused fast path
        self.growth_failures = 0  # growths that failed (each logged), ahead or inside a step

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
        if self._marked.shape[0] < len(ids):
            self._marked = np.zeros(len(ids), dtype=np.int32)

    # -- the step --------------------------------------------------------------------

    def extend(self, accepted: Any, accepted_lens: Any, match_len_out: Any, draft_out: Any, source_out: Any,
               request_pool: Any, batch: tuple[Hashable, ...], branch_out: Any = None) -> None:
        """``SpecEngine.extend`` on the host (under the engine's lock; the batch is prepared)."""
        nd = np.ndarray
        rp, parallel, table = self._rp, self._parallel, self.slots.table
        b = rp.shape[1]
        src = None
        outs = (accepted, accepted_lens, match_len_out, draft_out)
        if request_pool is not None:  # before anything runs: a rejected call changes nothing
            src = self._check_row_out(source_out, "source_out", b, outs, SOURCE_PAIRS)
        bout = self._no_branch
        if branch_out is not None:
            bout = self._check_row_out(branch_out, "branch_out", b, (*outs, source_out), BRANCH_PAIRS)
        parked = self.slots.parked
        budget = self.step_growth_words  # words this step may copy to grow blobs
        code = None
        if (
            self.kind.fused
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
        ):
            # The fast path: one jitted call checks and runs the step.
            try:
                code = (_STEP_EXACT or _exact_step())(table, rp, accepted, accepted_lens, match_len_out, draft_out,
                                                      bout, self._ctl)
            except (TypeError, ValueError, NotImplementedError):
                code = None  # numba rejected an argument's type: the checks below name it
            acc, lens, mout, dout = accepted, accepted_lens, match_len_out, draft_out
        if code is None:
            acc = as_int32_array(accepted, "accepted", 2)
            lens = as_int32_array(accepted_lens, "accepted_lens", 1)
            mout = as_int32_array(match_len_out, "match_len_out", 1, writable=True)
            dout = as_int32_array(draft_out, "draft_out", 2, writable=True)
            code = kx.check_step(table, rp, acc, lens, mout, dout, self._ctl, self.kind.n_word)
            if code == kx.OK and parked:
                code = self._check_parked(lens)
            if code == kx.OK:
                self.slow_steps += 1
                if parked:
                    budget = self._unpark(budget)
                code = self._step(parallel, acc, lens, mout, dout, bout)
        if code < 0:
            raise self._rejection(code, batch, acc, lens, dout, mout)
        if code > 0:
            self._grow_full_rows(parallel, acc, lens, mout, dout, bout, budget)
        if self.kind.grows_ahead:
            n = kx.rows_past_mark(self.slots.table, rp, self.slots.ahead, self._marked)
            if n:
                self._grow_later(self._marked[:n].tolist())
        if request_pool is not None:
            self._draft_from_pool(request_pool, rp, acc, lens, mout, dout, src, bout)
        if parked:
            self._park(acc, lens, mout, dout, src, bout)

    # -- full rows: grown inside the step within its budget, else parked (see the class docstring) --

    def _grow_full_rows(self, parallel: bool, acc, lens, mout, dout, bout, budget: int) -> None:
        """Grow the blobs of the rows that stopped for lack of room and resume them,
        while the step's copies fit ``budget`` words; park the others."""
        s, rows, progress = self.slots, self._rp[0], self._rp[1]
        while True:
            grew = False
            for r in np.flatnonzero(progress < lens).tolist():
                slot = int(rows[r])
                if slot in s.parked:
                    continue
                blob = s.blobs[slot]
                if blob.shape[0] <= budget or not self.kind.grows_ahead:
                    try:
                        inject(self.faults, "grow_in_step")
                        new = self.kind.grow(blob, int(lens[r] - progress[r]), s.arena)
                    except MemoryError as exc:
                        if not self.kind.grows_ahead:
                            raise  # nothing else would ever grow it
                        self._growth_failed(exc, blob, "inside a step")
                    else:
                        budget -= blob.shape[0]
                        s.put(slot, new)
                        self.grown_in_step += 1
                        grew = True
                        continue
                self._seal(slot)
                self.parked_rows += 1
            if not grew:
                return
            self._step(parallel, acc, lens, mout, dout, bout)

    def _unpark(self, budget: int) -> int:
        """Before a step: grow parked rows (the earliest parked first) while their copies fit ``budget``
        words, appending their parked tokens, so that the steps themselves drain what the background
        thread has not reached; returns the budget left. A parked row whose growth failed (no longer
        marked) goes to the background thread again."""
        s = self.slots
        again = []
        for slot in list(s.parked):
            blob = s.blobs[slot]
            if blob.shape[0] <= budget:
                waiting = s.parked[slot]
                try:
                    inject(self.faults, "grow_in_step")
                    new = self.kind.grow(blob, waiting.shape[0], s.arena)
                except MemoryError as exc:
                    self._growth_failed(exc, blob, "inside a step")
                else:
                    budget -= blob.shape[0]
                    del s.parked[slot]
                    took = self.kind.append_fitting(new, waiting)
                    s.put(slot, new)
                    s.pool_state[2, slot] = -1  # its pool match may have been synced from the sealed text
                    self.grown_in_step += 1
                    if took < waiting.shape[0]:
                        self._seal(slot)
                        s.parked[slot] = waiting[took:].copy()
                    continue
            if not s.ahead[0, slot]:
                s.ahead[0, slot] = 1
                again.append(slot)
        if again:
            self._grow_later(again)
        return budget

    def _growth_failed(self, exc: Exception, blob: np.ndarray, where: str) -> None:
        """A growth inside a step failed (under the engine's lock): counted and reported."""
        self.growth_failures += 1
        _report_growth_failure(exc, self.kind.tokens(blob), where)

    def _seal(self, slot: int) -> None:
        """Park slot ``slot``: its blob takes no more tokens (they wait in ``slots.parked``)
        until the background thread swaps in a grown one."""
        s = self.slots
        blob = s.blobs[slot]
        blob[core.H_CAP_TOK] = blob[core.H_N]  # core.extend finds no room, and writes nothing
        s.parked[slot] = np.zeros(0, dtype=np.int32)
        if not s.ahead[0, slot]:
            s.ahead[0, slot] = 1
            self._grow_later([slot])

    def _parked_rows(self) -> np.ndarray:
        """The batch rows whose slots are parked."""
        parked = self.slots.parked
        return np.flatnonzero(np.isin(self._rp[0], np.fromiter(parked, np.int32, len(parked))))

    def _check_parked(self, lens: np.ndarray) -> int:
        """``check_step``'s token limit for parked rows, counting their parked tokens."""
        s, limit = self.slots, self._ctl[kx.C_LIMIT]
        for r in self._parked_rows().tolist():
            slot = int(self._rp[0, r])
            total = self.kind.tokens(s.blobs[slot]) + s.parked[slot].shape[0] + int(lens[r])
            if total > limit:
                self._ctl[kx.C_ERR], self._ctl[kx.C_ERR + 1] = r, total
                return kx.TOO_LONG
        return kx.OK

    def _park(self, acc, lens, mout, dout, src, bout) -> None:
        """After the step: parked rows keep the tokens their blobs did not take and draft nothing."""
        s, rows, progress = self.slots, self._rp[0], self._rp[1]
        for r in self._parked_rows().tolist():
            slot = int(rows[r])
            if progress[r] < lens[r]:
                s.parked[slot] = np.concatenate((s.parked[slot], acc[r, progress[r]: lens[r]]))
            mout[r] = 0
            dout[r] = -1
            if src is not None:
                src[r] = 0
            if bout.shape[0] > r:
                bout[r] = 0

    # -- growth ahead of need (see the class docstring) --------------------------------

    def _grow_later(self, slots: list[int]) -> None:
        self._growth = [f for f in self._growth if not f.done()]
        self._growth.append(_grower().submit(_grow_ahead, weakref.ref(self), slots))

    def wait_growth(self) -> None:
        """Wait until the growth handed to the background thread is done, including
        what it hands on to itself (for tests)."""
        while self._growth:
            self._growth.pop(0).result()

    def grow_slot(self, slot: int) -> None:
        """Grow slot ``slot``'s blob if it is still marked: rebuilt from its text without
        the lock, then caught up and swapped in under it (the engine's lock is not held)."""
        s = self.slots
        with self.lock:
            if slot >= s.ahead.shape[1] or not s.ahead[0, slot]:
                return  # freed or grown since it was marked
            blob = s.blobs[slot]
            text = self.kind.text(blob)
            waiting = s.parked[slot].shape[0] if slot in s.parked else 0
        n = text.shape[0]
        try:
            inject(self.faults, "grow_ahead")
            new = self.kind.build(text, max(1, int((build.GROWTH - 1) * n), 2 * waiting), s.arena)
        except Exception as exc:  # reported, not raised (nobody would see it): the row is retried
            with self.lock:
                if s.blobs[slot] is blob:  # unmarked: the next step that sees it marks it again
                    s.ahead[0, slot] = 0
                self.growth_failures += 1
            _report_growth_failure(exc, n, "on the growth thread")  # not under the engine's lock
            return
        with self.lock:
            if s.blobs[slot] is not blob:
                return  # grown inside a step, or freed, meanwhile
            o = int(blob[core.H_O_TEXT])
            late = blob[o + n: o + int(blob[core.H_N])]  # appended since the copy
            parked = s.parked.pop(slot, None)
            if parked is not None:
                late = np.concatenate((late, parked))
                s.pool_state[2, slot] = -1  # its pool match may have been synced from the sealed text
            took = self.kind.append_fitting(new, late)  # only what fits: no copy under the lock
            s.put(slot, new)
            self.grown_ahead += 1
            if took < late.shape[0]:  # more came than the grown blob holds: park the rest, grow again
                self._seal(slot)
                s.parked[slot] = late[took:].copy()

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

    def _check_row_out(self, out: Any, name: str, b: int, others: tuple, pairs: tuple) -> np.ndarray:
        """An optional per-row output (``source_out``, ``branch_out``) as int32 [B], checked before the
        step against ``others`` (the step's arrays before it in ``extend``'s order, None where not
        given); a scratch array where it is None."""
        if out is None:
            if self._source.shape[0] != b:
                self._source = np.zeros(b, dtype=np.int32)
            return self._source
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

    def _rejection(self, code: int, batch: tuple[Hashable, ...], acc, lens, dout, mout) -> Exception:
        """The exception for a negative ``check_step`` code."""
        b, k = len(batch), dout.shape[1]
        limit = int(self._ctl[kx.C_LIMIT])
        r, c = int(self._ctl[kx.C_ERR]), int(self._ctl[kx.C_ERR + 1])
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
                "bytes": sum(blob_bytes(b) for b in blobs), "overflowed": 0,
                "grown_ahead": self.grown_ahead, "grown_in_step": self.grown_in_step,
                "parked": self.parked_rows, "parked_now": sum(s in self.slots.parked for s in slot_of.values()),
                "growth_failures": self.growth_failures, "slow_steps": self.slow_steps,
                "slots": len(self.slots.blobs), "free_slots": self.slots.free_count}

    def blob_copies(self, slot_of: dict[Hashable, int]) -> dict[Hashable, np.ndarray]:
        return {r: self.slots.blobs[s].copy() for r, s in slot_of.items()}

    def close(self) -> None:
        """Nothing to stop on the host."""

