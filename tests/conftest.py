"""Which CUDA mode the CUDA-backend tests run in, and the ``backend`` fixture.

``SASPEC_TEST_CUDA`` selects the mode:

* ``sim`` (default): numba's CUDA simulator. ``NUMBA_ENABLE_CUDASIM=1`` is set
  here, before anything imports ``numba.cuda`` (it does not affect ``njit``
  code); numpy arrays play the device arrays.
* ``device``: a real GPU, with torch CUDA tensors (``benchmarks/gpu_check.py``).
* ``off``: CUDA-backend tests are skipped.

CUDA-backend tests are also skipped when numba-cuda is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

MODE = os.environ.get("SASPEC_TEST_CUDA", "sim")
if MODE not in ("sim", "device", "off"):
    raise pytest.UsageError(f"SASPEC_TEST_CUDA must be sim, device or off, got {MODE!r}")
HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
if MODE == "sim" and HAVE_NUMBA_CUDA:
    if "numba.cuda" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise pytest.UsageError("numba.cuda was imported before tests/conftest.py could enable the CUDA simulator")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
elif MODE == "device" and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    raise pytest.UsageError("SASPEC_TEST_CUDA=device conflicts with NUMBA_ENABLE_CUDASIM=1")

CUDA_SKIP = "numba-cuda is not installed" if not HAVE_NUMBA_CUDA else "SASPEC_TEST_CUDA=off" if MODE == "off" else None

# Small enough for the simulator, large enough that the lifecycle tests never
# reach the capacity (they compare with the unbounded CPU backend).
SIM_SLOTS = 64
SIM_SEQ_LEN = 2048


class Backend:
    """Drives one backend from numpy test data.

    ``array`` gives an engine input for numpy data: the same array on the CPU
    backend and under the simulator; a torch CUDA tensor with the same dtype,
    shape and strides on a real device. ``extend`` converts the four step
    arrays, runs the engine and, on a device, copies the outputs back into the
    numpy arrays, so tests read results the same way everywhere.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.cuda = name == "cuda"
        self.on_device = self.cuda and MODE == "device"

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, mode={MODE if self.cuda else 'host'!r})"

    def engine(self, *, max_slots: int = SIM_SLOTS, max_seq_len: int = SIM_SEQ_LEN, **kwargs):
        from saspec import SpecEngine

        if not self.cuda:
            return SpecEngine(**kwargs)
        return SpecEngine(backend="cuda", max_slots=max_slots, max_seq_len=max_seq_len, **kwargs)

    def array(self, a):
        if not self.on_device or not isinstance(a, np.ndarray):
            return a
        import torch

        t = torch.empty_strided(
            a.shape, [s // a.itemsize for s in a.strides], dtype=torch.from_numpy(a[:0]).dtype, device="cuda"
        )
        t.copy_(torch.from_numpy(np.ascontiguousarray(a)))
        return t

    def host(self, x) -> np.ndarray:
        if type(x).__module__.startswith("torch"):
            return x.detach().cpu().numpy()
        return x

    def extend(self, eng, *arrays) -> None:
        inputs = [self.array(a) for a in arrays]
        eng.extend(*inputs)
        if self.on_device:
            for a, t in zip(arrays[2:], inputs[2:]):
                if isinstance(a, np.ndarray):
                    a[...] = self.host(t)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(bool(CUDA_SKIP), reason=str(CUDA_SKIP)))])
def backend(request) -> Backend:
    """Each engine test runs on the CPU backend and on the CUDA backend."""
    return Backend(request.param)


@pytest.fixture
def cuda_backend() -> Backend:
    """The CUDA backend only (simulator or device)."""
    if CUDA_SKIP:
        pytest.skip(CUDA_SKIP)
    return Backend("cuda")
