"""The CUDA runtime under ``saspec.device``: where its memory, copies and kernel launches go.

Device adapters: ``TorchDevice`` (a real GPU: memory from torch's caching
allocator, every copy and kernel on torch's current stream, so that a CUDA
graph captures them) and ``SimDevice`` (numba's CUDA simulator,
``NUMBA_ENABLE_CUDASIM=1``: numpy storage). The engine code is the same for
both; ``new_device`` picks one for the process (``simulated``). One adapter
belongs to one engine, and so do its caches (kernel views, streams,
configured launches, the two staging buffers an upload alternates between).

Importing this module imports ``numba.cuda`` (numba-cuda) and installs
saspec's cache locator for the ``cuda.jit(cache=True)`` kernels of the
``*_kernel*`` modules, which import it before they define their kernels.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
from numba import cuda

from .. import kernel_cache
from ..validate import as_int32_array

try:  # numba-cuda keeps its own copy of numba's cache locators; the simulator has none
    from numba.cuda.core import caching as _cuda_caching
except ImportError:
    _cuda_caching = None
if _cuda_caching is not None:
    kernel_cache.install(_cuda_caching)


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


def grid_blocks(work: int, threads: int, max_blocks: int) -> int:
    """Blocks of ``threads`` for ``work`` items, at least 1 and at most ``max_blocks`` (the kernel strides)."""
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
