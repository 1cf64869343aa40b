"""Every CUDA kernel of ``saspec.device`` compiles to PTX for sm_80 and sm_90, without a GPU
(``conftest.ptx_reports`` says how): one entry each, the core's and the policy's functions inlined (no
calls), no local memory.
"""

from __future__ import annotations

import pytest

from conftest import PTX_TARGETS, kernel_modules, ptx_reports

pytest.importorskip("numba_cuda")


def test_the_kernel_modules_are_found():
    """The scan ``ptx_reports`` is fed from finds every kernel module (a renamed one would escape the checks)."""
    assert set(kernel_modules()) >= {"saspec.device.automaton_kernels", "saspec.device.policy_kernel",
                                     "saspec.device.drafter_kernels"}
    assert "link_kernel" in kernel_modules()["saspec.device.automaton_kernels"]


@pytest.mark.parametrize("cc", PTX_TARGETS, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
def test_every_kernel_compiles_to_ptx(cc):
    modules = kernel_modules()
    reports = ptx_reports(PTX_TARGETS, list(modules))[cc]
    for module, kernels in modules.items():
        report = reports[module]
        assert sorted(report) == sorted(kernels), f"{module}: KERNELS must list every kernel it defines"
        for name, r in report.items():
            assert r["target"] == f"sm_{cc[0]}{cc[1]}", name
            assert len(r["entries"]) == 1 and name in r["entries"][0], (name, r["entries"])
            assert r["restype"] == "none", name
            assert r["calls"] == 0, f"{name}: the device functions should be inlined, found {r['calls']} calls"
            assert r["local_bytes"] == 0, f"{name}: uses {r['local_bytes']} bytes of local memory"
    link = reports["saspec.device.automaton_kernels"]["link_kernel"]
    assert link["atomics"] == ["atom.global.cas.b32", "atom.global.exch.b32"]
