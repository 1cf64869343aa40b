"""Every CUDA kernel compiles to PTX for sm_80 and sm_90, without a GPU.

``numba.cuda.compile_ptx`` needs no driver, but device functions (the core's
``register_jitable`` functions) are compiled for the current device's compute
capability, so the script below stands a fake current device in for the
target. It runs in a fresh interpreter per target: without the CUDA simulator
(which the test process may have enabled) and with no device functions cached
from another target.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba_cuda")

TARGETS = [(8, 0), (9, 0)]

SCRIPT = r"""
import json, re, sys
from types import SimpleNamespace

import numba.cuda.dispatcher as dispatcher

cc = (int(sys.argv[1]), int(sys.argv[2]))
dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)

from numba import cuda
from saspec.device import automaton_kernels

assert not cuda.config.ENABLE_CUDASIM
out = {}
for name, kernel in automaton_kernels.KERNELS.items():
    ptx, restype = cuda.compile_ptx(kernel.py_func, automaton_kernels.SIGNATURES[name], cc=cc)
    out[name] = {
        "target": re.search(r"^\.target (\S+)", ptx, re.M).group(1),
        "entries": re.findall(r"\.entry\s+(\S+?)\(", ptx),
        "atomics": sorted(set(re.findall(r"atom\.[\w.]+", ptx))),
        "calls": len(re.findall(r"\bcall(?:\.uni)?\b", ptx)),
        "local_bytes": sum(int(n) for n in re.findall(r"\.local\s+\.align\s+\d+\s+\.b8\s+\S+\[(\d+)\]", ptx)),
        "restype": str(restype),
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ptx_reports() -> dict[tuple[int, int], dict]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    cwd = Path(__file__).parent
    procs = {
        cc: subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(cc[0]), str(cc[1])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        for cc in TARGETS
    }
    reports = {}
    for cc, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"PTX compilation for sm_{cc[0]}{cc[1]} failed:\n{err[-4000:]}"
        reports[cc] = json.loads(out.strip().splitlines()[-1])
    return reports


@pytest.mark.parametrize("cc", TARGETS, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
def test_every_kernel_compiles_to_ptx(ptx_reports, cc):
    from saspec.device import automaton_kernels

    report = ptx_reports[cc]
    assert set(report) == set(automaton_kernels.KERNELS)
    for name, r in report.items():
        assert r["target"] == f"sm_{cc[0]}{cc[1]}", name
        assert len(r["entries"]) == 1 and name in r["entries"][0], (name, r["entries"])
        assert r["restype"] == "none", name
        assert r["calls"] == 0, f"{name}: the core should be inlined, found {r['calls']} calls"
        assert r["local_bytes"] == 0, f"{name}: uses {r['local_bytes']} bytes of local memory"
    assert report["link_kernel"]["atomics"] == ["atom.global.cas.b32", "atom.global.exch.b32"]
