"""SpecEngine: the batch lifecycle an inference engine drives.

::

    engine = SpecEngine()
    engine.add_request("a", prompt_ids)          # while the model does prefill
    engine.prepare(["a", "b"])                   # this step's batch rows
    engine.extend(accepted, accepted_lens, match_len_out, draft_out)  # each decode step
    engine.remove_request("a")                   # when it finishes (or is aborted)
    engine.close()                               # when the engine is done: closes a pool it made

The engine keeps the request ids, the prepared batch, the order of its argument
checks and the threading rules; a backend object keeps the automata. Each
request owns one growing blob (see ``core`` and ``build``). The CPU backend
(``host.HostBackend``) keeps the blobs in slots and hands the kernels an
address table of them (see ``extend``), so the whole batch, checks included,
is processed by one jitted call with no Python loop over rows.

``SpecEngine(backend="cuda", max_slots=..., max_seq_len=...)`` keeps the
automata on the GPU instead (``device.backend.DeviceBackend``; see
``device.slots`` and ``device.automaton_kernels``): requests are
still built on the host by ``add_request``; ``prepare`` moves the batch's new
requests into fixed-size device slots, after which the device copy is the only
one; ``extend`` is one kernel launch on torch's current stream, taking torch
CUDA tensors, with no host sync (it can be captured in a CUDA graph).
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from . import build
from .faults import Faults, check_faults, inject
from .host import HostBackend, SABlobs
from .pool import RequestPool
from .validate import as_tokens, check_int, optional_int

_NEVER = 2**63 - 1  # a batch size no parallel_threshold of None reaches


class SpecEngine:
    """Suffix-automaton drafts for a batch of requests.

    Args:
        occurrence: which earlier occurrence drafts copy from, one of
            ``build.OCCURRENCES``. The default, ``"near-first"``, is the best
            SA-only occurrence rule on the code-edit workloads, by a small margin;
            ``"recent"``/``"near-recent"`` are better on HumanEval
            completions and chat (BENCHMARKS.md, "Draft quality").
        recent_depth: states refreshed per token by the ``*recent`` rules,
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
            ``pool_tokens``. The caller closes it; ``close()`` closes only a
            pool the engine made for ``pool_tokens``.
        faults: a test hook for fault injection (``saspec.faults``): ``None``
            (the default, costing nothing) or an object whose
            ``should_fail(kind)`` is asked before each build (``"build"``)
            and, CPU backend, each growth of a blob (``"grow_ahead"``,
            ``"grow_in_step"``); where it answers True that allocation raises
            ``MemoryError`` as if memory had run out. ``TypeError`` for an
            object without ``should_fail``.

    Threads: every method may be called from any thread; one engine
    serialises its calls with a lock, except that ``add_request`` builds
    without holding it (and without the GIL), so a build overlaps ``extend``
    on another thread. ``prepare`` and ``extend`` are separate calls: threads
    sharing an engine, each with its own requests, use ``step`` (both under one
    hold of the lock). Several engines may be used from several threads at
    once: their serial steps run concurrently, and parallel steps (any
    engine's, any numba threading layer) take one process-wide lock
    (``extend.PARALLEL_LOCK``) because numba's workqueue layer aborts the
    process on concurrent parallel calls. ``remove_request`` of an id whose
    ``add_request`` is still building cancels that add.
    """

    def __init__(
        self,
        *,
        occurrence: str = build.DEFAULT_OCCURRENCE,
        recent_depth: int = build.DEFAULT_RECENT_DEPTH,
        parallel_threshold: int | None = None,
        backend: str = "cpu",
        max_slots: int | None = None,
        max_seq_len: int | None = None,
        device: Any = None,
        pool_tokens: int | None = None,
        pool: RequestPool | None = None,
        faults: Faults | None = None,
    ) -> None:
        self._faults = check_faults(faults)
        if pool is not None and pool_tokens is not None:
            raise ValueError("give pool_tokens or pool, not both")
        if pool is not None and not isinstance(pool, RequestPool):
            raise TypeError(f"pool must be a saspec.RequestPool, got {type(pool).__name__}")
        self._owns_pool = pool_tokens is not None  # close() closes a pool this engine made
        if pool_tokens is not None:
            pool = RequestPool(pool_tokens)
        self.request_pool = pool
        self.occurrence = occurrence
        self._occurrence = build.occurrence_code(occurrence)
        self._depth = build.check_recent_depth(recent_depth)
        self.parallel_threshold = optional_int(parallel_threshold, "parallel_threshold", 1)
        self._parallel_from = _NEVER if self.parallel_threshold is None else self.parallel_threshold
        self.backend = backend
        pool_words = build.worst_case_words(pool.max_tokens) if pool is not None else 0
        kind = SABlobs(self._occurrence, self._depth)
        self._attach(_new_backend(backend, kind, self._parallel_from, max_slots, max_seq_len, device, pool_words))

    def _attach(self, backend: Any) -> None:
        """Take ``backend`` (``host.HostBackend`` or ``device.backend.DeviceBackend``), with
        no request yet. The engine keeps the ids, the batch and the lock; the backend the blobs."""
        self._backend = backend
        self._lock = threading.Lock()
        backend.lock = self._lock  # the host backend's growth ahead takes it
        backend.faults = self._faults
        self._slot: dict[Hashable, int] = {}  # id -> its slot in the backend
        self._building: dict[Hashable, object] = {}  # id -> the token of the add building it
        self._batch: tuple[Hashable, ...] | None = None  # None: not prepared

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
        self._backend.check_prompt(tokens.shape[0])
        me = object()
        with self._lock:
            if request_id in self._slot or request_id in self._building:
                raise KeyError(f"request {request_id!r} is already added")
            self._building[request_id] = me
        try:
            inject(self._faults, "build")
            blob = self._backend.build(tokens, headroom)
        except BaseException:
            with self._lock:
                if self._building.get(request_id) is me:
                    del self._building[request_id]
            raise
        with self._lock:
            if self._building.get(request_id) is not me:
                return False  # cancelled by remove_request
            del self._building[request_id]
            expected = tokens.shape[0] + headroom if headroom else 0
            self._slot[request_id] = self._backend.install(blob, tokens.shape[0], expected)
        return True

    def remove_request(self, request_id: Hashable, *, to_pool: bool = True) -> None:
        """Free a request's automaton (call it when the request finished or was
        aborted). An id whose ``add_request`` is still building is cancelled:
        that call returns ``False`` and adds nothing. With a pool, the
        request's text joins it (built in the background; CUDA backend:
        reading the text from the device synchronizes, and the device sees the
        grown pool from the next ``prepare``), unless ``to_pool`` is False (the
        request is not finished, e.g. it is removed to be rebuilt). Removal
        always completes: the slot is freed whatever the pool does (a closed
        pool takes no text).
        Raises ``KeyError`` for an id neither added nor being added."""
        with self._lock:
            slot = self._slot.pop(request_id, None)
            if slot is None:
                if self._building.pop(request_id, None) is None:
                    raise KeyError(f"unknown request {request_id!r}")
                return
            pool = self.request_pool if to_pool else None
            text = None
            if pool is not None and not pool.closed:
                text = self._backend.text(request_id, slot), int(self._backend.prompt_len(slot))
            self._backend.release(request_id, slot)
            if self._batch is not None and request_id in self._batch:
                self._batch = None
        if text is not None:
            try:
                pool.add(*text)
            except RuntimeError:
                if not pool.closed:  # closed meanwhile: it takes no text
                    raise

    def close(self) -> None:
        """Release what the engine holds beyond its memory: the ``RequestPool``
        it created for ``pool_tokens`` is closed (its builder thread stops); a
        pool passed in as ``pool`` is the caller's to close. Requests stay
        readable; call it when the engine will not step again (or use the
        engine as a context manager). Idempotent."""
        if self._owns_pool and self.request_pool is not None:
            self.request_pool.close()
        self._backend.close()

    def __enter__(self) -> SpecEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            self._prepare(ids)

    def _prepare(self, ids: tuple[Hashable, ...]) -> None:
        """``prepare``'s work, under the lock."""
        if len(set(ids)) != len(ids):
            dup = next(r for i, r in enumerate(ids) if r in ids[:i])
            raise ValueError(f"request {dup!r} appears twice in the batch")
        missing = [r for r in ids if r not in self._slot]
        if missing:
            raise KeyError(f"unknown request {missing[0]!r}")
        self._backend.prepare(ids, [self._slot[r] for r in ids], self.request_pool)
        self._batch = ids

    def extend(self, accepted: Any, accepted_lens: Any, match_len_out: Any, draft_out: Any,
               source_out: Any = None, branch_out: Any = None) -> None:
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
            branch_out: int32 [B], written (optional): 1 where the earlier
                occurrences of the row's match went on with more than one
                distinct token (its draft is one continuation of several seen,
                and is accepted far less often at the same match length), 0
                where they all went on alike or there is no match.

        Numpy arrays or CPU torch tensors; outputs are written in place. B must
        equal the batch given to ``prepare``. Raises ``TypeError`` or
        ``ValueError`` naming the problem for a wrong type, dtype, rank, shape,
        contiguity or read-only output, a length outside [0, K+1], a negative
        token, an output sharing memory with an input or with the other output
        (inputs may share), or a row that would exceed
        ``build.MAX_REQUEST_TOKENS``; a rejected call changes nothing. Writable
        C-contiguous int32 numpy arrays (native byte order) take the fast path:
        the checks and a serial step are one jitted call. A full request whose
        larger blob cannot be allocated (``MemoryError``) does not fail the
        step: its tokens are kept, it drafts nothing until a later step grows
        it, and the failure is logged and counted (``stats``).

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
        with self._lock:
            if self._batch is None:
                raise RuntimeError("no batch is prepared (or a request in it was removed): call prepare() first")
            self._backend.extend(accepted, accepted_lens, match_len_out, draft_out, source_out, self.request_pool,
                                 self._batch, branch_out)

    def step(self, request_ids: Sequence[Hashable], accepted: Any, accepted_lens: Any, match_len_out: Any,
             draft_out: Any, source_out: Any = None, branch_out: Any = None) -> None:
        """``prepare(request_ids)`` then ``extend(...)`` as one call, under the
        engine's lock: no other thread's ``prepare`` can come between them, so
        the tokens go to ``request_ids``' rows whoever else uses the engine.
        Callers that share an engine across threads, each stepping its own
        requests, use this (``single.SingleSequence`` does). The batch stays
        prepared afterwards, as after ``prepare``; it is set again only when it
        differs. Arguments and errors: those of ``prepare`` and ``extend``; a
        rejected ``prepare`` changes nothing, a rejected ``extend`` leaves the
        new batch prepared.
        """
        if source_out is not None and self.request_pool is None:
            raise ValueError("source_out needs a pool (SpecEngine(pool_tokens=...) or pool=...)")
        ids = tuple(request_ids)
        with self._lock:
            if self._batch != ids:
                self._prepare(ids)
            self._backend.extend(accepted, accepted_lens, match_len_out, draft_out, source_out, self.request_pool,
                                 self._batch, branch_out)

    # -- inspection ----------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Requests, tokens and host bytes held by the automata, and
        ``overflowed``: requests that outgrew their device slot (always 0 on
        the CPU backend, where blobs grow). CPU backend: ``grown_ahead`` and
        ``grown_in_step`` count the blobs grown on the background thread before
        they filled up, and those a step had to grow itself; ``parked`` the
        rows parked so far (full, and not grown within their step's copy
        budget: they draft nothing until grown), ``parked_now`` the requests
        parked now; ``growth_failures`` the growths that failed (each logged on
        the ``saspec`` logger, the row retried at a later step);
        ``slow_steps`` the steps that ran on the checked path instead of the
        fused fast path (while a row is parked, parallel batches, inputs other
        than native int32 numpy arrays); ``slots`` and ``free_slots`` the host
        slots made and free to reuse.

        CUDA backend (reading token counts and overflow flags synchronizes):
        ``bytes`` counts requests still on the host; also ``device_bytes``
        (reserved at construction), ``device_bytes_per_slot``, ``max_slots``,
        ``free_slots`` and ``max_seq_len``. Warns (``RuntimeWarning``) once
        per request the first time it is found overflowed.
        """
        with self._lock:
            return self._backend.stats(self._slot)

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
            return self._backend.overflowed(request_id, self._slot[request_id])

    def automaton_len(self, request_id: Hashable) -> int:
        """Tokens in a request's text (CUDA backend: synchronizes)."""
        with self._lock:
            return self._backend.tokens(request_id, self._slot[request_id])

    def _blob_copies(self) -> dict[Hashable, np.ndarray]:
        """A host copy of every request's blob, for tests and debugging
        (CUDA backend: synchronizes; device slots are int32 like host blobs)."""
        with self._lock:
            return self._backend.blob_copies(self._slot)

    @property
    def batch(self) -> tuple[Hashable, ...] | None:
        """The request ids of the prepared batch in row order; None before
        ``prepare`` and after one of them was removed."""
        return self._batch

    @property
    def device_slots(self) -> Any:
        """The CUDA backend's ``device.slots.DeviceSlots`` (its ``rows`` map and ``slots``, which kernels
        enqueued after ``extend`` on the same stream may read); None on the CPU backend."""
        return self._backend.slots if self._backend.device else None

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._slot

    def __len__(self) -> int:
        return len(self._slot)


def _new_backend(backend: str, kind: SABlobs, parallel_from: int, max_slots: Any, max_seq_len: Any, device: Any,
                 pool_words: int = 0) -> Any:
    """The backend object for ``backend``: a ``host.HostBackend`` for ``"cpu"``, a
    ``device.backend.DeviceBackend`` for ``"cuda"`` (numba-cuda is imported only then,
    so the CPU backend never loads it)."""
    if backend == "cpu":
        for name, value in (("max_slots", max_slots), ("max_seq_len", max_seq_len), ("device", device)):
            if value is not None:
                raise ValueError(f"{name} applies to backend='cuda' only")
        return HostBackend(kind, kind.occurrence, kind.depth, parallel_from)
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
    from .device.backend import DeviceBackend

    return DeviceBackend(kind, max_slots, max_seq_len, device, pool_words)
