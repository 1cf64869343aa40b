"""SpecEngine: the batch lifecycle an inference engine drives.

::

    engine = SpecEngine()
    engine.add_request("a", prompt_ids)          # while the model does prefill
    engine.prepare(["a", "b"])                   # this step's batch rows
    engine.extend(accepted, accepted_lens, match_len_out, draft_out)  # each decode step
    engine.remove_request("a")

Each request owns one growing blob (see ``core`` and ``build``). The CPU
backend keeps the blobs in a ``numba.typed.List`` indexed by slot, so the whole
batch is processed by one jitted call with no Python loop over rows.

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
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
from numba import typed, types

from . import build, core
from .build import as_int32_array
from .extend import BAD_LEN, BAD_TOKEN, check_step, extend_rows, extend_rows_parallel

_EMPTY_BLOB = build.new_blob(0)


class SpecEngine:
    """Suffix-automaton drafts for a batch of requests.

    Args:
        policy: which earlier occurrence drafts copy from, one of
            ``build.POLICIES``. The default, ``"near-first"``, is the best
            SA-only policy on the code-edit workloads, by 0.2-0.7% over
            ``"first"``; ``"recent"``/``"near-recent"`` are about 2% better on
            HumanEval completions and chat (README, ``BENCHMARKS.md``).
        recent_depth: states refreshed per token by the ``*recent`` policies;
            negative means unbounded (exact recency, O(depth) per token).
        parallel_threshold: batches of at least this many rows run on all
            cores (numba ``prange``); CPU backend only. Parallel steps only
            pay off on idle cores: with OpenMP's default spin-waiting, a
            machine whose cores are shared made them 10-100x slower than
            serial (BENCHMARKS.md); ``OMP_WAIT_POLICY=passive`` avoids that.
        backend: ``"cpu"`` (host memory, numpy arrays or CPU tensors) or
            ``"cuda"`` (device slots, torch CUDA tensors; needs numba-cuda:
            ``pip install 'saspec[cuda]'``).
        max_slots: ``"cuda"`` only, required: requests resident on the device
            at once. Device memory is reserved for all of them at construction.
        max_seq_len: ``"cuda"`` only, required: tokens one request may hold
            (prompt plus generated); a slot takes at most
            ``73.4 * max_seq_len + 99`` bytes. A request that grows past it stops drafting (match 0).
        device: ``"cuda"`` only: the torch CUDA device; default the current one.
    """

    def __init__(
        self,
        *,
        policy: str = build.DEFAULT_POLICY,
        recent_depth: int = build.DEFAULT_RECENT_DEPTH,
        parallel_threshold: int = 256,
        backend: str = "cpu",
        max_slots: int | None = None,
        max_seq_len: int | None = None,
        device: Any = None,
    ) -> None:
        self.policy = policy
        self._policy = build.policy_code(policy)
        self._depth = int(recent_depth)
        self.parallel_threshold = int(parallel_threshold)
        self.backend = backend
        self._pool = _device_pool(backend, max_slots, max_seq_len, device, self._policy, self._depth)
        self._lock = threading.Lock()
        self._blobs = typed.List.empty_list(types.int32[::1])
        self._free: list[int] = []
        self._slot: dict[Hashable, int] = {}
        self._building: set[Hashable] = set()
        self._batch: tuple[Hashable, ...] | None = None  # None: not prepared
        self._rows = np.empty(0, dtype=np.int32)
        self._progress = np.empty(0, dtype=np.int32)

    # -- lifecycle -----------------------------------------------------------

    def add_request(self, request_id: Hashable, prompt: Any) -> None:
        """Build the automaton of ``prompt`` (1-D token ids in [0, 2**31)).

        The build runs without the GIL, so calling this from a background
        thread overlaps with ``extend`` on another thread. On the CUDA backend
        the request stays on the host until a ``prepare`` that includes it.

        Raises:
            KeyError: ``request_id`` is already added (or being added).
            TypeError, ValueError: ``prompt`` is not 1-D integer ids in range,
                or (CUDA) longer than ``max_seq_len``.
        """
        tokens = build.as_tokens(prompt, "prompt")
        if self._pool is not None and tokens.shape[0] > self._pool.layout.max_seq_len:
            raise ValueError(
                f"prompt has {tokens.shape[0]} tokens, more than max_seq_len={self._pool.layout.max_seq_len} "
                "(the capacity of a device slot)"
            )
        with self._lock:
            if request_id in self._slot or request_id in self._building:
                raise KeyError(f"request {request_id!r} is already added")
            self._building.add(request_id)
        try:
            blob = self._build_blob(tokens)
        except BaseException:
            with self._lock:
                self._building.discard(request_id)
            raise
        with self._lock:
            self._building.discard(request_id)
            if self._free:
                slot = self._free.pop()
                self._blobs[slot] = blob
            else:
                slot = len(self._blobs)
                self._blobs.append(blob)
            self._slot[request_id] = slot

    def remove_request(self, request_id: Hashable) -> None:
        """Free a request's automaton. Raises ``KeyError`` for an unknown id."""
        with self._lock:
            slot = self._slot.pop(request_id, None)
            if slot is None:
                raise KeyError(f"unknown request {request_id!r}")
            self._blobs[slot] = _EMPTY_BLOB
            self._free.append(slot)
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
                self._rows = np.array([self._slot[r] for r in ids], dtype=np.int32)
                self._progress = np.zeros(len(ids), dtype=np.int32)
            self._batch = ids

    def extend(self, accepted: Any, accepted_lens: Any, match_len_out: Any, draft_out: Any) -> None:
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

        Numpy arrays or CPU torch tensors; outputs are written in place. B must
        equal the batch given to ``prepare``. A rejected call changes nothing.

        CUDA backend: C-contiguous int32 torch tensors on the engine's device;
        one kernel launch on torch's current stream, no host sync, so the call
        can be captured in ``torch.cuda.graph``. Only dtype, shape, device and
        contiguity are checked (values would need a sync); instead, lengths
        are clamped to [0, K+1], a negative token ends its row's step (the
        tokens before it are appended; the row reports match 0 and drafts -1),
        and B may exceed the prepared batch (extra rows append nothing and
        report match 0 and drafts -1). The batch map is read on the device, so
        a captured graph follows later ``prepare`` calls of at most B requests.
        """
        if self._pool is not None:
            return self._extend_device(accepted, accepted_lens, match_len_out, draft_out)
        acc = as_int32_array(accepted, "accepted", 2)
        lens = as_int32_array(accepted_lens, "accepted_lens", 1)
        mout = as_int32_array(match_len_out, "match_len_out", 1, writable=True)
        dout = as_int32_array(draft_out, "draft_out", 2, writable=True)
        with self._lock:
            if self._batch is None:
                raise RuntimeError("no batch is prepared (or a request in it was removed): call prepare() first")
            rows, progress = self._rows, self._progress
            b = rows.shape[0]
            k = dout.shape[1]
            for name, arr, shape in (
                ("accepted", acc, (b, k + 1)),
                ("accepted_lens", lens, (b,)),
                ("match_len_out", mout, (b,)),
            ):
                if arr.shape != shape:
                    raise ValueError(f"{name} must have shape {shape} for batch {b} and K={k}, got {arr.shape}")
            if dout.shape[0] != b:
                raise ValueError(f"draft_out must have {b} rows for the prepared batch, got {dout.shape[0]}")
            code, row, col = check_step(acc, lens, progress)
            if code == BAD_LEN:
                raise ValueError(f"accepted_lens[{row}] = {lens[row]} is outside [0, K+1 = {k + 1}]")
            if code == BAD_TOKEN:
                raise ValueError(f"accepted[{row}, {col}] = {acc[row, col]} is a negative token id")
            parallel = b >= self.parallel_threshold
            while self._run_step(parallel, rows, acc, lens, progress, mout, dout):
                for r in np.flatnonzero(progress < lens):
                    slot = rows[r]
                    self._blobs[slot] = self._grow_blob(self._blobs[slot], int(lens[r] - progress[r]))

    # -- what a drafter kind defines (NgramDrafter overrides these) -----------

    def _build_blob(self, tokens: np.ndarray) -> np.ndarray:
        return build.ingest(build.new_blob(tokens.shape[0]), tokens, self._policy, self._depth)

    def _grow_blob(self, blob: np.ndarray, more_tokens: int) -> np.ndarray:
        return build.grow(blob, more_tokens)

    def _blob_tokens(self, blob: np.ndarray) -> int:
        return int(blob[core.H_N])

    def _run_step(self, parallel, rows, acc, lens, progress, mout, dout) -> int:
        """Run the step's kernel; return how many rows stopped for lack of room."""
        run = extend_rows_parallel if parallel else extend_rows
        return run(self._blobs, rows, acc, lens, progress, mout, dout, self._policy, self._depth)

    # -- the CUDA backend (see ``prepare``) -------------------------------------

    def _prepare_device(self, ids: tuple[Hashable, ...]) -> None:
        pool = self._pool
        new = {r: self._blobs[self._slot[r]] for r in ids if r not in pool.slot_of}
        pool.prepare(ids, new)
        for r in new:  # the device copy is authoritative from now on
            self._blobs[self._slot[r]] = _EMPTY_BLOB

    def _extend_device(self, accepted: Any, accepted_lens: Any, match_len_out: Any, draft_out: Any) -> None:
        with self._lock:
            if self._batch is None:
                raise RuntimeError("no batch is prepared (or a request in it was removed): call prepare() first")
            self._pool.extend(accepted, accepted_lens, match_len_out, draft_out, len(self._batch))

    # -- inspection ----------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Requests, tokens and host bytes held by the automata.

        CUDA backend (reading token counts synchronizes): ``bytes`` counts
        requests still on the host; also ``device_bytes`` (reserved at
        construction), ``device_bytes_per_slot``, ``max_slots``,
        ``free_slots`` and ``max_seq_len``.
        """
        with self._lock:
            if self._pool is not None:
                return self._device_stats()
            blobs = [self._blobs[s] for s in self._slot.values()]
        tokens = sum(self._blob_tokens(b) for b in blobs)
        nbytes = sum(int(b.nbytes) for b in blobs)
        return {"requests": len(blobs), "tokens": tokens, "bytes": nbytes}

    def _device_stats(self) -> dict[str, int]:
        pool = self._pool
        resident = [r for r in self._slot if r in pool.slot_of]
        host = [self._blobs[s] for r, s in self._slot.items() if r not in pool.slot_of]
        return {
            "requests": len(self._slot),
            "tokens": sum(pool.tokens(resident)) + sum(self._blob_tokens(b) for b in host),
            "bytes": sum(int(b.nbytes) for b in host),
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

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._slot

    def __len__(self) -> int:
        return len(self._slot)


def _device_pool(backend: str, max_slots: Any, max_seq_len: Any, device: Any, policy: int, depth: int) -> Any:
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
    if importlib.util.find_spec("numba_cuda") is None:
        raise ImportError("backend='cuda' needs numba-cuda: pip install 'saspec[cuda]'")
    from .device.prepare import DevicePool

    return DevicePool(max_slots, max_seq_len, policy, depth, device)
