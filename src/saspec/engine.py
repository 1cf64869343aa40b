"""SpecEngine: the batch lifecycle an inference engine drives.

::

    engine = SpecEngine()
    engine.add_request("a", prompt_ids)          # while the model does prefill
    engine.prepare(["a", "b"])                   # this step's batch rows
    engine.extend(accepted, accepted_lens, match_len_out, draft_out)  # each decode step
    engine.remove_request("a")

Each request owns one growing blob (see ``core`` and ``build``). The CPU
backend keeps the blobs in slots and hands the kernels an address table of
them (see ``extend``), so the whole batch, checks included, is processed by one
jitted call with no Python loop over rows.

``SpecEngine(backend="cuda", max_slots=..., max_seq_len=...)`` keeps the
automata on the GPU instead (see ``device.prepare`` and ``device.extend``): requests are
still built on the host by ``add_request``; ``prepare`` moves the batch's new
requests into fixed-size device slots, after which the device copy is the only
one; ``extend`` is one kernel launch on torch's current stream, taking torch
CUDA tensors, with no host sync (it can be captured in a CUDA graph).
"""

from __future__ import annotations

import importlib.util
import threading
import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import int32, int64, njit

from . import build, core
from . import extend as kx
from .arena import BlobArena, address, blob_bytes
from .pool import RequestPool, check_source, pool_rows
from .validate import as_int32_array, as_tokens, check_int, is_torch, optional_int

_EMPTY_BLOB = build.new_blob(0)
_NEVER = 2**63 - 1  # a batch size no parallel_threshold of None reaches
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
        sig = int64(int64[:, ::1], a2, a2, a1, a1, a2, int64[::1])
        _STEP_EXACT = njit(sig, nogil=True, cache=True, **core.NO_NRT)(_step_exact_impl)
    return _STEP_EXACT


def _step_exact_impl(table, rp, accepted, lens, match_out, draft_out, ctl):
    return kx.step(table, rp, accepted, lens, match_out, draft_out, ctl)


def _span(x: Any) -> tuple[int, int] | None:
    """Byte range of a numpy array or torch tensor's elements (from metadata
    only: no sync), or None for anything else or an empty one."""
    if isinstance(x, np.ndarray):
        lo, n = x.__array_interface__["data"][0], x.nbytes
    elif is_torch(x) and hasattr(x, "data_ptr"):
        lo, n = x.data_ptr(), x.numel() * x.element_size()
    else:
        return None
    return (lo, lo + n) if n else None


_ARG_NAMES = (*kx.ARG_NAMES, "source_out")  # extend's arrays, in its order
_OUTPUT_PAIRS = ((0, 2), (0, 3), (1, 2), (1, 3), (2, 3))  # an output and an input, or both outputs
_SOURCE_PAIRS = ((4, 0), (4, 1), (4, 2), (4, 3))  # source_out and each of the others


def _check_no_overlap(args: Sequence[Any], pairs: Sequence[tuple[int, int]] = _OUTPUT_PAIRS) -> None:
    """Raise ``ValueError`` if an output shares memory with an input or with
    another output (``args`` in ``extend``'s order; ``pairs``: which of them to compare)."""
    spans = [_span(x) for x in args]
    for i, j in pairs:
        a, b = spans[i], spans[j]
        if a is not None and b is not None and a[0] < b[1] and b[0] < a[1]:
            raise ValueError(_overlap_message(i, j))


def _overlap_message(i: int, j: int) -> str:
    return (
        f"{_ARG_NAMES[i]} and {_ARG_NAMES[j]} share memory: "
        "the outputs must not overlap an input or each other"
    )


class SpecEngine:
    """Suffix-automaton drafts for a batch of requests.

    Args:
        policy: which earlier occurrence drafts copy from, one of
            ``build.POLICIES``. The default, ``"near-first"``, is the best
            SA-only policy on the code-edit workloads, by a small margin;
            ``"recent"``/``"near-recent"`` are better on HumanEval
            completions and chat (BENCHMARKS.md, "Draft quality").
        recent_depth: states refreshed per token by the ``*recent`` policies,
            an int in [0, ``build.MAX_RECENT_DEPTH``] (1024); each token costs
            O(recent_depth) more with them. Others raise ``TypeError`` or
            ``ValueError``.
        parallel_threshold: ``None`` (default): every step runs serially on
            the calling thread. An int >= 1: batches of at least this many
            rows run on all cores (numba ``prange``); CPU backend only. Opt in
            only on dedicated idle cores: on shared cores the parallel path
            is many times slower than serial (BENCHMARKS.md, "Host engine"),
            and serial is never slower there.
        backend: ``"cpu"`` (host memory, numpy arrays or CPU tensors) or
            ``"cuda"`` (device slots, torch CUDA tensors; needs numba-cuda:
            ``pip install -e '.[cuda]'`` in the checkout).
        max_slots: ``"cuda"`` only, required: requests resident on the device
            at once. Device memory is reserved for all of them at construction.
        max_seq_len: ``"cuda"`` only, required: tokens one request may hold
            (prompt plus generated); a slot takes at most
            ``73.4 * max_seq_len + 99`` bytes. A request that grows past it stops drafting (match 0).
        device: ``"cuda"`` only: the torch CUDA device; default the current one.
        pool_tokens: opt in to cross-request memory: a new ``RequestPool`` of
            at most this many tokens (see ``pool``). Removed requests join it,
            and each row drafts from it where its match there is strictly
            longer than in its own automaton (``extend``'s ``source_out`` says
            which). Off (None) by default: BENCHMARKS.md, "Cross-request pool".
        pool: a ``RequestPool`` to use instead (shared by several engines, or
            kept across them, e.g. across ``generate`` calls). Not with
            ``pool_tokens``.

    Threads: every method may be called from any thread; one engine
    serialises its calls with a lock, except that ``add_request`` builds
    without holding it (and without the GIL), so a build overlaps ``extend``
    on another thread. Several engines may be used from several threads at
    once: their serial steps run concurrently, and parallel steps (any
    engine's, any numba threading layer) take one process-wide lock
    (``extend.PARALLEL_LOCK``) because numba's workqueue layer aborts the
    process on concurrent parallel calls. ``remove_request`` of an id whose
    ``add_request`` is still building cancels that add.
    """

    _N_WORD = core.H_N  # the blob word that holds the token count (NgramDrafter: 0)
    _FUSED = True  # extend may use kx.step, the SA check and kernel in one call

    def __init__(
        self,
        *,
        policy: str = build.DEFAULT_POLICY,
        recent_depth: int = build.DEFAULT_RECENT_DEPTH,
        parallel_threshold: int | None = None,
        backend: str = "cpu",
        max_slots: int | None = None,
        max_seq_len: int | None = None,
        device: Any = None,
        pool_tokens: int | None = None,
        pool: RequestPool | None = None,
    ) -> None:
        if pool is not None and pool_tokens is not None:
            raise ValueError("give pool_tokens or pool, not both")
        if pool is not None and not isinstance(pool, RequestPool):
            raise TypeError(f"pool must be a saspec.RequestPool, got {type(pool).__name__}")
        if pool_tokens is not None:
            pool = RequestPool(pool_tokens)
        self.request_pool = pool
        self.policy = policy
        self._policy = build.policy_code(policy)
        self._depth = build.check_recent_depth(recent_depth)
        self.parallel_threshold = optional_int(parallel_threshold, "parallel_threshold", 1)
        self._parallel_from = _NEVER if self.parallel_threshold is None else self.parallel_threshold
        self.backend = backend
        pool_words = build.worst_case_words(pool.max_tokens) if pool is not None else 0
        self._pool = _device_pool(backend, max_slots, max_seq_len, device, self._policy, self._depth, pool_words)
        self._lock = threading.Lock()
        # Slot s holds _blobs[s]; the kernels see it through the address table
        # (_table[:, s]: address, words; see ``extend``), which is changed only
        # under the lock, always together with _blobs (which keeps the blob alive).
        self._blobs: list[np.ndarray] = []
        self._arena = BlobArena()  # packs mid-size blobs onto huge pages
        self._table = np.zeros((2, 16), dtype=np.int64)
        self._free: list[int] = []
        self._slot: dict[Hashable, int] = {}
        self._building: dict[Hashable, object] = {}  # id -> the token of the add building it
        self._batch: tuple[Hashable, ...] | None = None  # None: not prepared
        self._rp = np.zeros((2, 0), dtype=np.int32)  # the batch rows' slots, and their progress in a step
        self._parallel = False  # the prepared batch runs the parallel kernel
        self._ctl = np.zeros(kx.CTL_WORDS, dtype=np.int64)
        self._ctl[kx.C_LIMIT] = build.MAX_REQUEST_TOKENS
        self._ctl[kx.C_POLICY] = self._policy
        self._ctl[kx.C_DEPTH] = self._depth
        self._ctl[kx.C_LOOKAHEAD] = kx.LOOKAHEAD_MIN_BYTES
        self._warned_overflow: set[Hashable] = set()
        # Per slot: its request's prompt length, and its match in the pool (state, length,
        # the pool epoch they belong to: -1 until its first step; see ``pool.pool_rows``).
        self._prompt_len = np.zeros(16, dtype=np.int64)
        self._pool_state = np.full((3, 16), -1, dtype=np.int32)
        self._source = np.zeros(0, dtype=np.int32)  # source_out when the caller gives none

    # -- lifecycle -----------------------------------------------------------

    def add_request(self, request_id: Hashable, prompt: Any, expected_new_tokens: int | None = None) -> bool:
        """Build the automaton of ``prompt`` (1-D token ids in [0, 2**31),
        at most ``build.MAX_REQUEST_TOKENS`` of them).

        ``expected_new_tokens`` (CPU backend): how many tokens decoding will
        likely append, if the caller knows (e.g. its ``max_new_tokens``); the
        automaton is sized for them up front (``build.reserve``), so those
        steps do not stop to re-allocate it. It is a hint, not a limit: a
        longer request grows as usual. Without it (or beyond it) there is room
        for 1/8 of the prompt, at least 256 tokens, then geometric growth.
        Ignored by the CUDA backend, whose slots hold ``max_seq_len`` tokens.

        The build runs without the GIL, so calling this from a background
        thread overlaps with ``extend`` on another thread. On the CUDA backend
        the request stays on the host until a ``prepare`` that includes it.

        Returns ``True`` when the request was added, ``False`` when a
        ``remove_request`` of the same id cancelled it while it was being
        built (the build's result is discarded; the id is free again).

        Raises:
            KeyError: ``request_id`` is already added (or being added).
            TypeError, ValueError: ``prompt`` is not 1-D integer ids in range,
                has more than ``build.MAX_REQUEST_TOKENS`` tokens, or (CUDA)
                is longer than ``max_seq_len``; ``expected_new_tokens`` is not
                ``None`` or an int >= 0, or would take the request past
                ``build.MAX_REQUEST_TOKENS``.
        """
        tokens = as_tokens(prompt, "prompt")
        build.check_request_tokens(tokens.shape[0], "prompt")
        headroom = build.check_new_tokens(expected_new_tokens, tokens.shape[0])
        if self._pool is not None and tokens.shape[0] > self._pool.layout.max_seq_len:
            raise ValueError(
                f"prompt has {tokens.shape[0]} tokens, more than max_seq_len={self._pool.layout.max_seq_len} "
                "(the capacity of a device slot)"
            )
        me = object()
        with self._lock:
            if request_id in self._slot or request_id in self._building:
                raise KeyError(f"request {request_id!r} is already added")
            self._building[request_id] = me
        try:
            blob = self._build_blob(tokens, headroom)
        except BaseException:
            with self._lock:
                if self._building.get(request_id) is me:
                    del self._building[request_id]
            raise
        with self._lock:
            if self._building.get(request_id) is not me:
                return False  # cancelled by remove_request
            del self._building[request_id]
            if self._free:
                slot = self._free.pop()
            else:
                slot = len(self._blobs)
                self._blobs.append(_EMPTY_BLOB)
            self._install(slot, blob)
            self._prompt_len[slot] = tokens.shape[0]
            self._pool_state[:, slot] = (0, 0, -1)
            self._slot[request_id] = slot
        return True

    def _install(self, slot: int, blob: np.ndarray) -> None:
        """Make ``blob`` slot ``slot``'s (under the lock), in ``_blobs`` and the
        address table the kernels read."""
        table = self._table
        if slot >= table.shape[1]:
            slots = max(2 * table.shape[1], slot + 1)
            self._table = table = _grown(table, slots, 0)
            self._prompt_len = _grown(self._prompt_len, slots, 0)
            self._pool_state = _grown(self._pool_state, slots, -1)
        self._blobs[slot] = blob
        table[0, slot] = address(blob)
        table[1, slot] = blob.shape[0]

    def remove_request(self, request_id: Hashable) -> None:
        """Free a request's automaton. An id whose ``add_request`` is still
        building is cancelled: that call returns ``False`` and adds nothing.
        With a pool, the request's text joins it (built in the background;
        CUDA backend: reading the text from the device synchronizes, and the
        device sees the grown pool from the next ``prepare``).
        Raises ``KeyError`` for an id neither added nor being added."""
        with self._lock:
            slot = self._slot.pop(request_id, None)
            if slot is None:
                if self._building.pop(request_id, None) is None:
                    raise KeyError(f"unknown request {request_id!r}")
                return
            if self.request_pool is not None:
                self.request_pool.add(self._text_of(request_id, slot), int(self._prompt_len[slot]))
            self._install(slot, _EMPTY_BLOB)
            self._free.append(slot)
            self._warned_overflow.discard(request_id)
            if self._pool is not None:
                self._pool.release(request_id)
            if self._batch is not None and request_id in self._batch:
                self._batch = None

    def prepare(self, request_ids: Sequence[Hashable]) -> None:
        """Set the batch: row ``b`` of the following ``extend`` calls is
        ``request_ids[b]``. Raises ``KeyError`` for unknown ids and
        ``ValueError`` for a repeated id.

        CUDA backend: each request not on the device yet gets a free slot
        (held until ``remove_request``) and is uploaded, O(its size) bytes, and
        the row-to-slot map is written to the device; both async on torch's
        current stream. Raises ``RuntimeError`` when there are fewer free slots
        than new requests. A rejected call changes nothing.
        """
        ids = tuple(request_ids)
        with self._lock:
            if len(set(ids)) != len(ids):
                dup = next(r for i, r in enumerate(ids) if r in ids[:i])
                raise ValueError(f"request {dup!r} appears twice in the batch")
            missing = [r for r in ids if r not in self._slot]
            if missing:
                raise KeyError(f"unknown request {missing[0]!r}")
            if self._pool is not None:
                self._prepare_device(ids)
            else:
                rp = np.zeros((2, len(ids)), dtype=np.int32)
                rp[0] = [self._slot[r] for r in ids]
                self._rp = rp
                self._parallel = len(ids) >= self._parallel_from
            self._batch = ids

    def extend(self, accepted: Any, accepted_lens: Any, match_len_out: Any, draft_out: Any,
               source_out: Any = None) -> None:
        """Append accepted tokens, then write match lengths and drafts.

        Args:
            accepted: int32 [B, K+1], row ``b``'s newly accepted tokens first,
                padding after (ignored).
            accepted_lens: int32 [B], how many of ``accepted[b]`` are real,
                in [0, K+1].
            match_len_out: int32 [B], written: the length in tokens of the
                longest suffix of each row's text that also occurred earlier.
            draft_out: int32 [B, K], written: each row's next K draft tokens,
                -1 where it has none.
            source_out: int32 [B], written (optional, with a pool only): 1
                where the row's match and draft are the pool's, 0 where they
                are its own automaton's. Pool drafts end where the pooled text
                did (-1 after).

        Numpy arrays or CPU torch tensors; outputs are written in place. B must
        equal the batch given to ``prepare``. Raises ``TypeError`` or
        ``ValueError`` naming the problem for a wrong type, dtype, rank, shape,
        contiguity or read-only output, a length outside [0, K+1], a negative
        token, an output sharing memory with an input or with the other output
        (inputs may share), or a row that would exceed
        ``build.MAX_REQUEST_TOKENS``; a rejected call changes nothing. Writable
        C-contiguous int32 numpy arrays (native byte order) take the fast path:
        the checks and a serial step are one jitted call. Only a failure to
        allocate a larger blob for a full request (``MemoryError``) can leave
        a step half done: rows may have appended some of their tokens.

        CUDA backend: C-contiguous int32 torch tensors on the engine's device;
        one kernel launch on torch's current stream, no host sync, so the call
        can be captured in ``torch.cuda.graph``. Only dtype, shape, device and
        contiguity are checked, and overlap of outputs with inputs or each other
        (from data_ptr ranges); values would need a sync, so instead lengths
        are clamped to [0, K+1], a negative token ends its row's step (the
        tokens before it are appended; the row reports match 0 and drafts -1),
        and B may exceed the prepared batch (extra rows append nothing and
        report match 0 and drafts -1). The batch map is read on the device, so
        a captured graph follows later ``prepare`` calls of at most B requests.
        """
        if source_out is not None and self.request_pool is None:
            raise ValueError("source_out needs a pool (SpecEngine(pool_tokens=...) or pool=...)")
        if self._pool is not None:
            return self._extend_device(accepted, accepted_lens, match_len_out, draft_out, source_out)
        nd = np.ndarray
        with self._lock:
            if self._batch is None:
                raise RuntimeError("no batch is prepared (or a request in it was removed): call prepare() first")
            rp = self._rp
            parallel = self._parallel
            src = None
            if self.request_pool is not None:  # before anything runs: a rejected call changes nothing
                src = self._check_source(source_out, rp.shape[1], (accepted, accepted_lens, match_len_out, draft_out))
            code = None
            if (
                self._FUSED
                and not parallel
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
                    code = (_STEP_EXACT or _exact_step())(self._table, rp, accepted, accepted_lens, match_len_out, draft_out, self._ctl)
                except (TypeError, ValueError, NotImplementedError):
                    code = None  # numba rejected an argument's type: the checks below name it
                acc, lens, mout, dout = accepted, accepted_lens, match_len_out, draft_out
            if code is None:
                acc = as_int32_array(accepted, "accepted", 2)
                lens = as_int32_array(accepted_lens, "accepted_lens", 1)
                mout = as_int32_array(match_len_out, "match_len_out", 1, writable=True)
                dout = as_int32_array(draft_out, "draft_out", 2, writable=True)
                code = kx.check_step(self._table, rp, acc, lens, mout, dout, self._ctl, self._N_WORD)
                if code == kx.OK:
                    code = self._step(parallel, acc, lens, mout, dout)
            if code < 0:
                raise self._rejection(code, rp.shape[1], acc, lens, dout, mout)
            while code > 0:  # rows stopped for lack of room: grow their blobs and resume
                rows, progress = rp[0], rp[1]
                for r in np.flatnonzero(progress < lens).tolist():
                    slot = int(rows[r])
                    self._install(slot, self._grow_blob(self._blobs[slot], int(lens[r] - progress[r])))
                code = self._step(parallel, acc, lens, mout, dout)
            if self.request_pool is not None:
                self._draft_from_pool(rp, acc, lens, mout, dout, src)

    def _draft_from_pool(self, rp, acc, lens, mout, dout, src) -> None:
        """The pool's side of a step (under the lock): see ``pool.pool_rows``."""
        blob, epoch, base = self.request_pool.current  # one read: the builder swaps it whole
        if blob[core.H_N] == 0:  # nothing pooled yet: every row keeps its own draft (and its pool state)
            src[:] = 0
            return
        pool_rows(self._table, rp, acc, lens, mout, dout, src, blob, base, self._pool_state, epoch,
                  self.request_pool.sync_tokens)

    def _check_source(self, source_out: Any, b: int, others: tuple) -> np.ndarray:
        """``source_out`` as int32 [B] (a scratch array if None), checked before the step."""
        if source_out is None:
            if self._source.shape[0] != b:
                self._source = np.zeros(b, dtype=np.int32)
            return self._source
        nd = np.ndarray
        if (type(source_out) is nd and source_out.dtype is _I32 and source_out.ndim == 1
                and source_out.flags.c_contiguous and source_out.flags.writeable
                and all(type(x) is nd and x.flags.c_contiguous for x in others)):
            code = check_source(source_out, b, *others)  # the fast path: one jitted check
            if code == -1:
                return source_out
        src = as_int32_array(source_out, "source_out", 1, writable=True)
        if src.shape != (b,):
            raise ValueError(f"source_out must have shape {(b,)} for batch {b}, got {src.shape}")
        _check_no_overlap((*others, src), _SOURCE_PAIRS)
        return src

    def _step(self, parallel: bool, acc, lens, mout, dout) -> int:
        if not parallel:
            return self._run_step(False, acc, lens, mout, dout)
        with kx.PARALLEL_LOCK:
            return self._run_step(True, acc, lens, mout, dout)

    def _rejection(self, code: int, b: int, acc, lens, dout, mout) -> Exception:
        """The exception for a negative ``check_step`` code."""
        k = dout.shape[1]
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
            return ValueError(_overlap_message(r, c))
        if code == kx.BAD_LEN:
            return ValueError(f"accepted_lens[{r}] = {lens[r]} is outside [0, K+1 = {k + 1}]")
        if code == kx.BAD_TOKEN:
            return ValueError(f"accepted[{r}, {c}] = {acc[r, c]} is a negative token id")
        if code == kx.TOO_LONG:
            return ValueError(
                f"row {r} (request {self._batch[r]!r}) would hold {c} tokens, more than the limit of {limit} "
                "(build.MAX_REQUEST_TOKENS: blob offsets are int32)"
            )
        return AssertionError(f"unknown check_step code {code}")

    # -- what a drafter kind defines (NgramDrafter overrides these) -----------

    def _build_blob(self, tokens: np.ndarray, headroom: int | None = None) -> np.ndarray:
        if self._pool is not None:
            headroom = None  # the device slot, not this host blob, holds the decoded tokens
        blob = build.ingest(build.new_blob(tokens.shape[0], headroom, self._arena), tokens, self._policy, self._depth,
                            self._arena)
        return blob if headroom is None else build.reserve(blob, headroom, self._arena)

    def _grow_blob(self, blob: np.ndarray, more_tokens: int) -> np.ndarray:
        return build.grow(blob, more_tokens, self._arena)

    def _blob_tokens(self, blob: np.ndarray) -> int:
        return int(blob[core.H_N])

    def _text_of(self, request_id: Hashable, slot: int) -> np.ndarray:
        """A copy of a request's whole text (under the lock)."""
        if self._pool is not None and request_id in self._pool.slot_of:
            return self._pool.text(request_id)  # synchronizes: remove_request is off the decode path
        blob = self._blobs[slot]
        o = int(blob[core.H_O_TEXT])
        return blob[o : o + int(blob[core.H_N])].copy()

    def _run_step(self, parallel, acc, lens, mout, dout) -> int:
        """Run the step's kernel over the address table; return how many rows
        stopped for lack of room. ``parallel``: the caller holds ``PARALLEL_LOCK``."""
        run = kx.extend_rows_parallel if parallel else kx.extend_rows
        return run(self._table, self._rp, acc, lens, mout, dout, self._policy, self._depth, self._ctl[kx.C_LOOKAHEAD])

    # -- the CUDA backend (see ``prepare``) -------------------------------------

    def _prepare_device(self, ids: tuple[Hashable, ...]) -> None:
        pool = self._pool
        new = {r: self._blobs[self._slot[r]] for r in ids if r not in pool.slot_of}
        pool.prepare(ids, new)
        for r in new:  # the device copy is authoritative from now on
            self._install(self._slot[r], _EMPTY_BLOB)
        if self.request_pool is not None:  # a newer pool reaches the device here, never inside extend
            blob, epoch, _ = self.request_pool.current
            if blob is not pool.uploaded_pool:
                pool.set_request_pool(blob, epoch, self.request_pool.sync_tokens)

    def _extend_device(self, accepted: Any, accepted_lens: Any, match_len_out: Any, draft_out: Any,
                       source_out: Any = None) -> None:
        with self._lock:
            if self._batch is None:
                raise RuntimeError("no batch is prepared (or a request in it was removed): call prepare() first")
            _check_no_overlap((accepted, accepted_lens, match_len_out, draft_out))
            if source_out is not None:
                _check_no_overlap((accepted, accepted_lens, match_len_out, draft_out, source_out), _SOURCE_PAIRS)
            self._pool.extend(accepted, accepted_lens, match_len_out, draft_out, len(self._batch), source_out)

    # -- inspection ----------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Requests, tokens and host bytes held by the automata, and
        ``overflowed``: requests that outgrew their device slot (always 0 on
        the CPU backend, where blobs grow).

        CUDA backend (reading token counts and overflow flags synchronizes):
        ``bytes`` counts requests still on the host; also ``device_bytes``
        (reserved at construction), ``device_bytes_per_slot``, ``max_slots``,
        ``free_slots`` and ``max_seq_len``. Warns (``RuntimeWarning``) once
        per request the first time it is found overflowed.
        """
        with self._lock:
            if self._pool is not None:
                return self._device_stats()
            blobs = [self._blobs[s] for s in self._slot.values()]
        tokens = sum(self._blob_tokens(b) for b in blobs)
        nbytes = sum(blob_bytes(b) for b in blobs)
        return {"requests": len(blobs), "tokens": tokens, "bytes": nbytes, "overflowed": 0}

    def overflowed(self, request_id: Hashable) -> bool:
        """True once a CUDA-backend request has outgrown ``max_seq_len``: its
        slot stopped growing and it reports match 0 and drafts -1 from then
        on (remove it, or re-add it with a shorter text). Always False on the
        CPU backend. Synchronizes (``extend`` never does: it only sets a flag
        on the device). Warns once per request, like ``stats``. Raises
        ``KeyError`` for an unknown id."""
        with self._lock:
            if request_id not in self._slot:
                raise KeyError(f"unknown request {request_id!r}")
            if self._pool is None or request_id not in self._pool.slot_of:
                return False
            return bool(self._overflow_check([request_id]))

    def _overflow_check(self, resident: list[Hashable]) -> int:
        """How many of ``resident`` overflowed; warns for the ones not warned
        about yet (under the lock)."""
        flags = self._pool.overflowed(resident)
        for r, f in zip(resident, flags):
            if f and r not in self._warned_overflow:
                self._warned_overflow.add(r)
                warnings.warn(
                    f"saspec: request {r!r} outgrew max_seq_len={self._pool.layout.max_seq_len} and no longer "
                    "drafts (match 0); raise max_seq_len or remove it",
                    RuntimeWarning,
                    stacklevel=4,
                )
        return sum(flags)

    def _device_stats(self) -> dict[str, int]:
        pool = self._pool
        resident = [r for r in self._slot if r in pool.slot_of]
        host = [self._blobs[s] for r, s in self._slot.items() if r not in pool.slot_of]
        return {
            "requests": len(self._slot),
            "overflowed": self._overflow_check(resident),
            "tokens": sum(pool.tokens(resident)) + sum(self._blob_tokens(b) for b in host),
            "bytes": sum(blob_bytes(b) for b in host),
            "device_bytes": pool.device_bytes,
            "device_bytes_per_slot": pool.layout.nbytes,
            "max_slots": pool.max_slots,
            "free_slots": pool.free_slots,
            "max_seq_len": pool.layout.max_seq_len,
        }

    def automaton_len(self, request_id: Hashable) -> int:
        """Tokens in a request's text (CUDA backend: synchronizes)."""
        with self._lock:
            if self._pool is not None and request_id in self._pool.slot_of:
                return self._pool.tokens([request_id])[0]
            return self._blob_tokens(self._blobs[self._slot[request_id]])

    def _blob_copies(self) -> dict[Hashable, np.ndarray]:
        """A host copy of every request's blob, for tests and debugging
        (CUDA backend: synchronizes; device slots are int32 like host blobs)."""
        with self._lock:
            pool = self._pool
            if pool is None:
                return {r: self._blobs[s].copy() for r, s in self._slot.items()}
            return {r: pool.blob(r) if r in pool.slot_of else self._blobs[s].copy() for r, s in self._slot.items()}

    @property
    def batch(self) -> tuple[Hashable, ...] | None:
        """The request ids of the prepared batch in row order; None before
        ``prepare`` and after one of them was removed."""
        return self._batch

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._slot

    def __len__(self) -> int:
        return len(self._slot)


def _grown(a: np.ndarray, slots: int, fill: int) -> np.ndarray:
    """``a`` (per slot along its last axis) widened to ``slots`` slots, the new ones ``fill``."""
    out = np.full((*a.shape[:-1], slots), fill, dtype=a.dtype)
    out[..., : a.shape[-1]] = a
    return out


def _device_pool(backend: str, max_slots: Any, max_seq_len: Any, device: Any, policy: int, depth: int,
                 pool_words: int = 0) -> Any:
    """The ``prepare.DevicePool`` for ``backend="cuda"``; None for ``"cpu"``.
    Imports numba-cuda only here, so the CPU backend never loads it."""
    if backend == "cpu":
        for name, value in (("max_slots", max_slots), ("max_seq_len", max_seq_len), ("device", device)):
            if value is not None:
                raise ValueError(f"{name} applies to backend='cuda' only")
        return None
    if backend != "cuda":
        raise ValueError(f"unknown backend {backend!r}; expected 'cpu' or 'cuda'")
    if max_slots is None or max_seq_len is None:
        raise ValueError("backend='cuda' needs max_slots and max_seq_len (device memory is reserved up front)")
    check_int(max_slots, "max_slots", 1)
    check_int(max_seq_len, "max_seq_len", 1)
    if importlib.util.find_spec("numba_cuda") is None:
        raise ImportError(
            "backend='cuda' needs numba-cuda: pip install 'numba-cuda[cu13]' (or pip install -e '.[cuda]' in the checkout)"
        )
    from .device.prepare import DevicePool

    return DevicePool(max_slots, max_seq_len, policy, depth, device, pool_words)
