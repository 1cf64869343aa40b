"""Which CUDA mode the CUDA-backend tests run in, and the ``backend`` fixture.

``SASPEC_TEST_CUDA`` selects the mode:

* ``sim`` (default): numba's CUDA simulator. ``NUMBA_ENABLE_CUDASIM=1`` is set
  here, before anything imports ``numba.cuda`` (it does not affect ``njit``
  code); numpy arrays play the device arrays.
* ``device``: a real GPU, with torch CUDA tensors (``benchmarks/gpu_check.py``).
* ``off``: CUDA-backend tests are skipped.

CUDA-backend tests are also skipped when numba-cuda is not installed.

The helpers of the device tests live here too: ``to_device`` / ``to_host`` (the
step's arrays in the mode in use), the ``fast_thread_switching`` fixture (for
kernels with barriers under the simulator), ``kernel_modules`` (every kernel of
``saspec.device``, found in the sources) and ``ptx_reports`` (kernels compiled to
PTX without a GPU).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


# -- the device tests' helpers ---------------------------------------------------------------


def to_device(a: np.ndarray):
    """A kernel argument for numpy ``a``: itself under the simulator, a CUDA tensor (same dtype and shape,
    C-contiguous) on a real device."""
    if MODE != "device":
        return a
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def to_host(x) -> np.ndarray:
    """A numpy view or copy of what ``to_device`` made (or a kernel wrote)."""
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()


@pytest.fixture
def fast_thread_switching():
    """The simulator runs a block's threads as Python threads and polls them; a short switch interval keeps
    its barriers (``syncthreads``) from waiting out the default 5 ms each."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


PTX_TARGETS = ((8, 0), (9, 0))


def kernel_modules() -> dict[str, list[str]]:
    """Every module of ``saspec.device`` that defines CUDA kernels, with their names: the functions decorated
    ``cuda.jit(...)`` without ``device=True`` (read from the sources: nothing is imported)."""
    spec = importlib.util.find_spec("saspec")
    device = Path(spec.submodule_search_locations[0]) / "device"
    out = {}
    for path in sorted(device.glob("*.py")):
        names = []
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for d in node.decorator_list:
                call = d if isinstance(d, ast.Call) else None
                func = call.func if call is not None else d
                if ast.unparse(func) != "cuda.jit":
                    continue
                device_fn = call is not None and any(
                    k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value for k in call.keywords)
                if not device_fn:
                    names.append(node.name)
        if names:
            out[f"saspec.device.{path.stem}"] = names
    return out


_PTX_SCRIPT = r"""
import importlib, json, re, sys
from types import SimpleNamespace

import numba.cuda.dispatcher as dispatcher

cc = (int(sys.argv[1]), int(sys.argv[2]))
dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)

from numba import cuda

assert not cuda.config.ENABLE_CUDASIM
out = {}
for module in sys.argv[3:]:
    mod = importlib.import_module(module)
    out[module] = {}
    for name, kernel in mod.KERNELS.items():
        ptx, restype = cuda.compile_ptx(kernel.py_func, mod.SIGNATURES[name], cc=cc)
        out[module][name] = {
            "target": re.search(r"^\.target (\S+)", ptx, re.M).group(1),
            "entries": re.findall(r"\.entry\s+(\S+?)\(", ptx),
            "atomics": sorted(set(re.findall(r"atom\.[\w.]+", ptx))),
            "calls": len(re.findall(r"\bcall(?:\.uni)?\b", ptx)),
            "local_bytes": sum(int(n) for n in re.findall(r"\.local\s+\.align\s+\d+\s+\.b8\s+\S+\[(\d+)\]", ptx)),
            "fma_f64": len(re.findall(r"\bfma\.rn\.f64\b", ptx)),
            "mul_rn_f64": len(re.findall(r"\bmul\.rn\.f64\b", ptx)),
            "restype": str(restype),
        }
print(json.dumps(out))
"""
_ptx_done: dict[tuple[tuple[int, int], str], dict] = {}


def ptx_reports(targets, modules) -> dict[tuple[int, int], dict[str, dict[str, dict]]]:
    """``{target: {module: {kernel: report}}}``: each module's ``KERNELS``, compiled with its ``SIGNATURES``
    by ``numba.cuda.compile_ptx`` for each compute capability in ``targets``, and what the PTX holds (its
    target, entries, atomics, calls, local memory, f64 FMAs and unfused products, return type).

    ``compile_ptx`` needs no driver, but device functions (the ``register_jitable`` functions) are compiled
    for the current device's compute capability, so a fake current device stands in for the target, in a
    fresh interpreter per target: without the CUDA simulator (which the test process may have enabled) and
    with no device functions cached from another target. The targets compile in parallel; each (target,
    module) once per test session."""
    targets = [tuple(cc) for cc in targets]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    procs = {}
    for cc in targets:
        todo = [m for m in modules if (cc, m) not in _ptx_done]
        if todo:
            procs[cc] = subprocess.Popen([sys.executable, "-c", _PTX_SCRIPT, str(cc[0]), str(cc[1]), *todo],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                         cwd=Path(__file__).parent)
    for cc, proc in procs.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"PTX compilation for sm_{cc[0]}{cc[1]} failed:\n{err[-4000:]}"
        for module, report in json.loads(out.strip().splitlines()[-1]).items():
            _ptx_done[cc, module] = report
    return {cc: {m: _ptx_done[cc, m] for m in modules} for cc in targets}


def slow_selected(config) -> bool:
    """Whether the slow tests were asked for: ``-m slow`` (not ``not slow``) or ``SASPEC_SLOW=1``."""
    expr = config.getoption("markexpr") or ""
    by_marker = re.search(r"\bslow\b", expr) is not None and re.search(r"\bnot\s+slow\b", expr) is None
    return os.environ.get("SASPEC_SLOW") == "1" or by_marker
