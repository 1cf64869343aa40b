"""Extend on the GPU: the CUDA kernels, and the device adapter they run through.

Kernels (``numba.cuda.jit``, over the same ``core`` functions as the host loops
in ``extend``):

* ``extend_kernel``: the per-decode-step call. One thread per batch row
  appends the row's accepted tokens to its slot with ``core.extend_fixed``,
  then writes ``core.match_len`` and ``core.draft``. It is safe for any input
  values (it never writes out of bounds) because the GPU path validates only
  what the host sees without a sync (dtype, shape, device, contiguity):

  - ``accepted_lens[b]`` is clamped to ``[0, accepted.shape[1]]``;
  - a negative token stops the row: the tokens before it are appended, the
    rest are dropped, and the row reports match 0 and drafts -1 for the step;
  - rows at or beyond the prepared batch size (read on the device, so a
    captured CUDA graph follows later ``prepare`` calls) append nothing and
    report match 0 and drafts -1. A graph replays the B rows it was captured
    with: prepare at most B requests before replaying it;
  - a slot that reaches its capacity stops growing and reports match 0 from
    then on (``core.extend_fixed``).

* ``unpack_kernel`` and ``link_kernel``: rebuild uploaded automata in their
  slots (see ``prepare``). ``unpack_kernel`` clears a reused slot's edge table
  and copies the header, text and states; ``link_kernel`` then inserts every
  table edge in parallel, claiming a table slot with ``atomic.cas`` on its SRC
  word (open addressing with the probe sequence of ``core.find_slot``) and
  chaining it to its state with ``atomic.exch`` on the state's MORE word.
  (First edges travel inside the state records.)

Device adapters: ``TorchDevice`` (a real GPU: memory from torch's caching
allocator, work on torch's current stream) and ``SimDevice`` (numba's CUDA
simulator, ``NUMBA_ENABLE_CUDASIM=1``: numpy storage). The engine code is the
same for both; ``new_device`` picks one. One adapter belongs to one engine,
and so do its caches.

Importing this module imports ``numba.cuda`` (numba-cuda); ``saspec`` imports
it only for ``SpecEngine(backend="cuda")``.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
from numba import cuda, int32, int64

from .. import core, kernel_cache
from ..validate import as_int32_array

try:  # numba-cuda keeps its own copy of numba's cache locators; the simulator has none
    from numba.cuda.core import caching as _cuda_caching
except ImportError:
    _cuda_caching = None
if _cuda_caching is not None:
    kernel_cache.install(_cuda_caching)

# Upload descriptors, one per uploaded request, at the start of the device
# staging buffer: DESC_WORDS int32 words each.
D_SLOT = 0  # destination slot
D_OFFSET = 1  # payload offset in the staging buffer (words)
D_EDGES = 2  # edges in the payload
D_CLEAR = 3  # 1: the slot was used before, clear its edge table first
DESC_WORDS = 4
EDGE_WORDS = 3  # payload edge records: (SRC, TOK, DST)

# Kernel signatures as launched (see ``extend_kernel_args``); ``tests/test_ptx``
# compiles each kernel to PTX with these.
_ARR1 = int32[::1]
_ARR2 = int32[:, ::1]
SIGNATURES: dict[str, tuple] = {
    "extend_kernel": (_ARR2, _ARR1, _ARR2, _ARR1, _ARR1, _ARR2, int32, int32, _ARR1, _ARR2, _ARR1, _ARR1, _ARR1),
    "unpack_kernel": (_ARR2, _ARR1, int32, int32, int32, int32, int32, int32, _ARR2),
    "link_kernel": (_ARR2, _ARR1, int32, int32, int32, int32, int32, int32),
}


@cuda.jit(device=True)
def _no_draft(match_out, out, b, k, source_out, branch_out):
    match_out[b] = 0
    for j in range(k):
        out[j] = -1
    if b < source_out.shape[0]:
        source_out[b] = 0
    if b < branch_out.shape[0]:
        branch_out[b] = 0


@cuda.jit(device=True)
def _pool_row(buf, accepted, b, n, slot, match_out, out, k, source_out, branch_out, pool_automaton, pstate, pctl):
    """The cross-request pool's side of row ``b`` (``extend.pool_rows`` on the host):
    follow its new tokens in the pool (re-matching its last ``pctl[2]`` tokens when
    its state belongs to another pool epoch than ``pctl[1]``), and draft from the pool
    where its match there is strictly longer than its own."""
    if pstate[2, slot] != pctl[1]:
        text = buf[core.H_O_TEXT]
        nt = buf[core.H_N]
        s = int64(0)
        m = int64(0)
        for i in range(max(0, nt - pctl[2]), nt):
            t = int64(buf[text + i])
            s, m = (int64(0), int64(0)) if t == core.SEPARATOR else core.follow(pool_automaton, s, m, t)
        pstate[2, slot] = pctl[1]
    else:
        s = int64(pstate[0, slot])
        m = int64(pstate[1, slot])
        for j in range(n):
            t = int64(accepted[b, j])  # the separator's id breaks the match (as on the host)
            s, m = (int64(0), int64(0)) if t == core.SEPARATOR else core.follow(pool_automaton, s, m, t)
    pstate[0, slot] = s
    pstate[1, slot] = m
    src = 0
    if m > match_out[b]:
        start = core.continuation(pool_automaton, s, core.SEPARATOR)
        if start >= 0:
            core.draft_from(pool_automaton, start, out, k, core.SEPARATOR)
            match_out[b] = m
            src = 1
            if b < branch_out.shape[0]:
                branch_out[b] = core.state_branches(pool_automaton, s)
    if b < source_out.shape[0]:
        source_out[b] = src


@cuda.jit(cache=True)
def extend_kernel(slots, rows, accepted, lens, match_out, draft_out, occurrence, depth, pool_automaton, pstate, pctl,
                  source_out, branch_out):
    """One decode step; thread ``b`` handles batch row ``b``.

    slots: int32 [max_slots, words], one automaton per slot. rows: int32
    [1 + max_slots], ``rows[0]`` the prepared batch size, ``rows[1 + b]`` row
    b's slot. accepted: int32 [B, K+1]; lens: int32 [B]; match_out: int32 [B];
    draft_out: int32 [B, K]. The cross-request pool (used where ``pctl[0]`` is
    1): pool_automaton, its automaton; pstate: int32 [3, max_slots], each slot's
    state, match length and epoch there; pctl: int32 [3], (in use, epoch, sync tokens);
    source_out: int32 [>= 1], 1 where row b drafted from the pool (written for
    the rows it has room for); branch_out: int32 [>= 1], likewise, 1 where row
    b's match went on with several tokens earlier (``core.branched``).
    """
    b = cuda.grid(1)
    nb = min(accepted.shape[0], lens.shape[0], match_out.shape[0], draft_out.shape[0])
    if b >= nb:
        return
    k = draft_out.shape[1]
    out = draft_out[b]
    slot = -1
    if b < rows[0] and b + 1 < rows.shape[0]:
        slot = rows[1 + b]
    if slot < 0 or slot >= slots.shape[0]:
        _no_draft(match_out, out, b, k, source_out, branch_out)
        return
    buf = slots[slot]
    n = min(max(lens[b], 0), accepted.shape[1])
    for j in range(n):
        token = accepted[b, j]
        if token < 0:
            _no_draft(match_out, out, b, k, source_out, branch_out)
            return
        # int64: the simulator runs the core on numpy scalars, where an int32
        # token would overflow the hash (compiled code widens anyway).
        core.extend_fixed(buf, int64(token), occurrence, depth)
    match_out[b] = core.match_len(buf)
    core.draft(buf, out, k)
    if b < branch_out.shape[0]:
        branch_out[b] = core.branched(buf)
    if pctl[0] != 0 and slot < pstate.shape[1]:
        _pool_row(buf, accepted, b, n, slot, match_out, out, k, source_out, branch_out, pool_automaton, pstate,
                  pctl)


@cuda.jit(cache=True)
def unpack_kernel(slots, stage, n_req, o_states, o_aux, o_slots, o_text, ht_size, pstate):
    """Copy each uploaded request's header, text, hot and cold state records
    into its slot, clearing the slot's edge table first when ``D_CLEAR`` is set,
    and mark its cross-request pool state stale (``pstate[2, slot] = -1``).

    Grid: x strides over a request's words, y over the requests. stage:
    int32, ``n_req`` descriptors then the payloads (see ``prepare.pack``).
    """
    x0 = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    xs = cuda.gridDim.x * cuda.blockDim.x
    for r in range(cuda.blockIdx.y, n_req, cuda.gridDim.y):
        d = DESC_WORDS * r
        buf = slots[stage[d + D_SLOT]]
        if x0 == 0:
            pstate[2, stage[d + D_SLOT]] = -1
        off = stage[d + D_OFFSET]
        n_clear = ht_size if stage[d + D_CLEAR] != 0 else 0
        head = core.HEADER + stage[off + core.H_N]  # header, then text
        n_hot = core.STATE_WORDS * stage[off + core.H_NSTATES]
        n_st = (core.STATE_WORDS + core.AUX_WORDS) * stage[off + core.H_NSTATES]
        for i in range(x0, n_clear + head + n_st, xs):
            if i < n_clear:
                buf[o_slots + core.SLOT_WORDS * i + core.SRC] = -1
            elif i < n_clear + core.HEADER:
                j = i - n_clear
                buf[j] = stage[off + j]
            elif i < n_clear + head:
                j = i - n_clear
                buf[o_text + j - core.HEADER] = stage[off + j]
            else:
                j = i - n_clear - head
                if j < n_hot:
                    buf[o_states + j] = stage[off + head + j]
                else:
                    buf[o_aux + j - n_hot] = stage[off + head + j]


@cuda.jit(cache=True)
def link_kernel(slots, stage, n_req, o_states, o_aux, o_slots, o_text, ht_size):
    """Insert each uploaded request's table edges into its slot's table and chains.

    Runs after ``unpack_kernel`` (the table is clear, every MORE is -1). One
    thread per edge; the edges of an automaton are distinct (SRC, TOK) pairs,
    so a claimed slot never needs its TOK compared.
    """
    x0 = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    xs = cuda.gridDim.x * cuda.blockDim.x
    for r in range(cuda.blockIdx.y, n_req, cuda.gridDim.y):
        d = DESC_WORDS * r
        buf = slots[stage[d + D_SLOT]]
        off = stage[d + D_OFFSET]
        n_st = (core.STATE_WORDS + core.AUX_WORDS) * stage[off + core.H_NSTATES]
        edges = off + core.HEADER + stage[off + core.H_N] + n_st
        for e in range(x0, stage[d + D_EDGES], xs):
            w = edges + EDGE_WORDS * e
            src = stage[w]
            token = stage[w + 1]
            # core.find_slot's probe sequence, claiming the first empty slot.
            i = core.probe_start(int64(src), int64(token), ht_size)
            while cuda.atomic.cas(buf, o_slots + core.SLOT_WORDS * i + core.SRC, -1, src) != -1:
                i = core.probe_next(i, ht_size)
            s = o_slots + core.SLOT_WORDS * i
            buf[s + core.S_TOK] = token
            buf[s + core.S_DST] = stage[w + 2]
            more = o_aux + core.AUX_WORDS * src + core.MORE
            buf[s + core.NEXT] = cuda.atomic.exch(buf, more, int32(i))


KERNELS = {"extend_kernel": extend_kernel, "unpack_kernel": unpack_kernel, "link_kernel": link_kernel}


def simulated() -> bool:
    """True when ``numba.cuda`` is numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``
    when it was first imported)."""
    config = getattr(cuda, "config", None)
    if config is None:  # numba-cuda versions without numba.cuda.config
        from numba.core import config
    return bool(config.ENABLE_CUDASIM)


def new_device(device: Any = None) -> TorchDevice | SimDevice:
    """The adapter for this process: ``SimDevice`` under the CUDA simulator,
    else ``TorchDevice`` on ``device`` (default: torch's current CUDA device)."""
    if simulated():
        return SimDevice()
    return TorchDevice(device)


def _grid(work: int, threads: int, max_blocks: int) -> int:
    return max(1, min(max_blocks, math.ceil(work / threads)))


class _LRU(OrderedDict):
    """A small least-recently-used cache (one per adapter, never global)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def lookup(self, key, make):
        try:
            value = self[key]
            self.move_to_end(key)
        except KeyError:
            value = self[key] = make()
            if len(self) > self.size:
                self.popitem(last=False)
        return value


class TorchDevice:
    """A real GPU: int32 storage from torch's CUDA caching allocator, every
    copy and kernel on torch's current stream (so inside ``torch.cuda.graph``
    capture they are captured).

    Kernel arguments are numba views of torch tensors. A view is made once per
    (address, shape, dtype) and cached here; cached views do not own their
    tensor (no leak), which is safe because a view is only used while the
    caller passes a live tensor with exactly that address and layout.
    """

    simulated = False
    # One row per block, so one per warp: rows take different branches through
    # the automaton, and rows sharing a warp wait for each other's branches
    # (BENCHMARKS.md, "GPU backend", compares the two).
    extend_threads = 1
    upload_threads = 256
    max_upload_blocks = 256

    def __init__(self, device: Any = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                "backend='cuda' needs a CUDA GPU visible to torch (torch.cuda.is_available() is False); "
                "set NUMBA_ENABLE_CUDASIM=1 to run it on numba's CUDA simulator instead"
            )
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"device must be a CUDA device for backend='cuda', got {dev}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self._torch = torch
        self.device = dev
        self._views = _LRU(64)
        self._streams = _LRU(16)
        self._launchers = _LRU(64)
        self._ring = [_PinnedStage(self), _PinnedStage(self)]
        self._next = 0

    def __repr__(self) -> str:
        return f"TorchDevice({self.device})"

    # -- memory --------------------------------------------------------------

    def full(self, shape: tuple[int, ...], value: int):
        """A new int32 device tensor filled with ``value`` (on the current stream)."""
        return self._torch.full(shape, value, dtype=self._torch.int32, device=self.device)

    def nbytes(self, x) -> int:
        return int(x.numel() * x.element_size())

    def to_numpy(self, x) -> np.ndarray:
        """An int32 host copy of device tensor ``x``; synchronizes (inspection only)."""
        return x.cpu().numpy().astype(np.int32, copy=False)

    def staging(self, words: int) -> _PinnedStage:
        """A staging buffer pair (pinned host, device) of at least ``words``
        int32 words. Two pairs alternate; this waits (host) until the copies and
        kernels that last read the returned pair have finished."""
        stage = self._ring[self._next]
        self._next ^= 1
        stage.acquire(words)
        return stage

    def copy_from_stage(self, dst, dst_start: int, stage: _PinnedStage, src_start: int, words: int) -> None:
        """Async host-to-device copy of ``stage.host[src_start:+words]`` into
        ``dst[dst_start:+words]`` (a 1-D device tensor), on the current stream."""
        dst[dst_start : dst_start + words].copy_(stage.pinned[src_start : src_start + words], non_blocking=True)

    # -- kernels -------------------------------------------------------------

    def view(self, x):
        """The cached numba device-array view of tensor ``x`` (no sync, no copy)."""
        key = (x.data_ptr(), tuple(x.shape), x.dtype)
        return self._views.lookup(
            key, lambda: cuda.from_cuda_array_interface(x.__cuda_array_interface__, owner=None, sync=False)
        )

    def launch(self, kernel, grid, block: int, *args) -> None:
        """Launch ``kernel`` on torch's current stream of this device."""
        torch = self._torch
        with torch.cuda.device(self.device):
            ptr = torch.cuda.current_stream(self.device).cuda_stream
            stream = self._streams.lookup(ptr, lambda: cuda.external_stream(ptr))
            run = self._launchers.lookup(
                (id(kernel), grid, block, ptr), lambda: _configure(kernel, grid, block, stream)
            )
            run(*args)

    # -- arguments -------------------------------------------------------------

    def check(self, x: Any, name: str, ndim: int, writable: bool = False):
        """``x`` if it is a C-contiguous int32 tensor with ``ndim`` dims on this
        device; else raise ``TypeError``/``ValueError`` naming the problem.
        Reads only host-visible metadata (never values: that would sync)."""
        torch = self._torch
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch CUDA tensor for backend 'cuda', got {type(x).__name__}")
        if x.device != self.device:
            raise ValueError(f"{name} must be on {self.device} for this engine, got device {x.device}")
        if x.dtype != torch.int32:
            raise TypeError(f"{name} must have dtype int32, got {x.dtype}")
        if x.dim() != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be C-contiguous")
        if x.requires_grad:
            raise ValueError(f"{name} must not require grad")
        return x


def _configure(kernel, grid, block, stream):
    """``kernel[grid, block, stream]``, without numba's low-occupancy warning
    (a one-thread-per-row kernel at a small batch is small on purpose)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Grid size .* low occupancy")  # numba may prefix ANSI bold
        return kernel[grid, block, stream]


class _PinnedStage:
    """One staging pair: pinned host memory written by the CPU, device memory
    the upload kernels read, and an event marking when both are free again."""

    def __init__(self, dev: TorchDevice) -> None:
        self._dev = dev
        self.words = 0
        self.pinned = None
        self.host: np.ndarray = np.empty(0, np.int32)
        self.device = None
        self._event = None

    def acquire(self, words: int) -> None:
        torch = self._dev._torch
        if self._event is not None:
            self._event.synchronize()
        if words > self.words:
            self.words = max(words, int(self.words * 1.5), 4096)
            self.pinned = torch.empty(self.words, dtype=torch.int32, pin_memory=True)
            self.host = self.pinned.numpy()
            self.device = torch.empty(self.words, dtype=torch.int32, device=self._dev.device)

    def release(self) -> None:
        """Mark the buffers busy until the work enqueued so far has run."""
        torch = self._dev._torch
        if self._event is None:
            self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(self._dev.device))


class SimDevice:
    """numba's CUDA simulator: "device" arrays are numpy arrays and kernels
    run as Python threads, so the CUDA engine path can be tested without a GPU.

    Storage is int64, not int32: the simulator runs the core on numpy scalars,
    whose int32 arithmetic would overflow the core's hash (compiled code widens
    those expressions to int64). Every stored value fits in int32, so the
    automaton is the same. User arrays are numpy int32 arrays or CPU torch
    tensors (their numpy views), as on the CPU backend.
    """

    simulated = True
    extend_threads = 8
    upload_threads = 8
    max_upload_blocks = 1

    def __init__(self) -> None:
        self.device = "cudasim"
        self._ring = [_HostStage(), _HostStage()]
        self._next = 0

    def __repr__(self) -> str:
        return "SimDevice()"

    def full(self, shape: tuple[int, ...], value: int):
        arr = cuda.device_array(shape, dtype=np.int64)
        np.asarray(arr)[...] = value
        return arr

    def nbytes(self, x) -> int:
        # Report what the int32 storage of a real device would hold.
        return int(np.asarray(x).size * 4)

    def to_numpy(self, x) -> np.ndarray:
        return np.asarray(x).astype(np.int32)

    def staging(self, words: int) -> _HostStage:
        stage = self._ring[self._next]
        self._next ^= 1
        stage.acquire(words, self)
        return stage

    def copy_from_stage(self, dst, dst_start: int, stage: _HostStage, src_start: int, words: int) -> None:
        np.asarray(dst)[dst_start : dst_start + words] = stage.host[src_start : src_start + words]

    def view(self, x):
        return x

    def launch(self, kernel, grid, block: int, *args) -> None:
        kernel[grid, block](*args)

    def check(self, x: Any, name: str, ndim: int, writable: bool = False) -> np.ndarray:
        return as_int32_array(x, name, ndim, writable=writable, where="under the CUDA simulator")


class _HostStage:
    """``SimDevice``'s staging pair: a host array and a simulated device array."""

    def __init__(self) -> None:
        self.words = 0
        self.host: np.ndarray = np.empty(0, np.int32)
        self.device = None

    def acquire(self, words: int, dev: SimDevice) -> None:
        if words > self.words:
            self.words = max(words, int(self.words * 1.5), 256)
            self.host = np.empty(self.words, np.int32)
            self.device = dev.full((self.words,), 0)

    def release(self) -> None:
        pass
