"""The package's architecture holds: the library never reaches into the evidence,
``import saspec`` stays light, and importing it writes nothing into the source tree."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import saspec

PACKAGE = Path(saspec.__file__).resolve().parent
HEAVY = ("torch", "transformers", "tiktoken", "numba_cuda", "matplotlib", "vllm")


def _library_modules() -> list[Path]:
    """The library: every module outside ``evidence`` (``device`` and ``integrations`` included)."""
    return [p for p in PACKAGE.rglob("*.py") if "evidence" not in p.relative_to(PACKAGE).parts]


def _imports(path: Path) -> list[str]:
    """Absolute names of every module ``path`` imports, at any depth (lazy imports too)."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names += [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                names.append(node.module)
    return names


def test_library_never_imports_the_evidence():
    offenders = {
        str(p.relative_to(PACKAGE)): [n for n in _imports(p) if n.startswith("saspec.evidence")] for p in _library_modules()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_import_check_sees_relative_imports():
    # The check above is only as good as the parser: it must resolve `from ..evidence import x`.
    sample = PACKAGE / "device" / "prepare.py"
    assert "saspec.core" in _imports(sample)
    assert "saspec.device.extend" in _imports(sample)


def test_library_imports_no_heavy_package_at_module_level():
    """Lazy imports of torch etc. inside functions are allowed; module-level ones are not
    (``device`` imports numba-cuda at module level, and is itself only imported lazily)."""
    offenders = {}
    for p in _library_modules():
        if "device" in p.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(p.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        mods = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        mods += [n.module for n in top if isinstance(n, ast.ImportFrom) and not n.level and n.module]
        bad = [m for m in mods if m.split(".")[0] in HEAVY]
        if bad:
            offenders[str(p.relative_to(PACKAGE))] = bad
    assert offenders == {}


def _run(code: str, **env: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, **env}
    ).stdout


def test_import_saspec_is_light():
    out = _run(
        "import sys, saspec\n"
        "from saspec import SpecEngine, SuffixAutomaton, NgramDrafter, select_drafts\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy"
        " or m.startswith(('saspec.evidence', 'saspec.device'))))"
    )
    assert out.strip() == "[]"


def test_cpu_engine_loads_nothing_heavy():
    out = _run(
        "import sys\n"
        "import numpy as np\n"
        "from saspec import SpecEngine\n"
        "e = SpecEngine(); e.add_request('a', [1, 2, 3, 1, 2]); e.prepare(['a'])\n"
        "z = np.zeros\n"
        "e.extend(z((1, 3), np.int32), z(1, np.int32), z(1, np.int32), z((1, 2), np.int32))\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith('saspec.evidence')))"
    )
    assert out.strip() == "[]"


def _tree_snapshot() -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in PACKAGE.rglob("*") if "__pycache__" not in p.parts or p.suffix != ".pyc"}


def test_import_and_compile_write_nothing_into_the_source_tree(tmp_path):
    before = _tree_snapshot()
    _run(
        "import numpy as np, saspec\n"
        "sa = saspec.SuffixAutomaton([1, 2, 3, 1, 2]); assert sa.match()[0] == 2\n",
        SASPEC_CACHE_DIR=str(tmp_path),
        PYTHONDONTWRITEBYTECODE="1",
    )
    assert _tree_snapshot() == before
    assert list(tmp_path.rglob("*.nbi")), "kernels should be cached under SASPEC_CACHE_DIR"


def test_cache_is_keyed_on_the_sources(tmp_path, monkeypatch):
    from saspec import kernel_cache

    monkeypatch.setenv("SASPEC_CACHE_DIR", str(tmp_path))
    kernel_cache.cache_dir.cache_clear()
    try:
        first = kernel_cache.cache_dir()
        assert first.parent == tmp_path
        monkeypatch.setattr(kernel_cache, "PACKAGE_DIR", tmp_path / "pkg")
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "core.py").write_text("A = 1\n")
        kernel_cache.cache_dir.cache_clear()
        a = kernel_cache.cache_dir()
        (tmp_path / "pkg" / "core.py").write_text("A = 2\n")
        kernel_cache.cache_dir.cache_clear()
        b = kernel_cache.cache_dir()
        assert a != b and a.name.split("-")[0] == b.name.split("-")[0]
    finally:
        kernel_cache.cache_dir.cache_clear()


def test_prune_keeps_caches_in_use_and_drops_idle_ones(tmp_path):
    from saspec import kernel_cache

    current, busy, idle, other = (tmp_path / n for n in ("abc-1", "abc-2", "abc-3", "xyz-4"))
    for d in (current, busy, idle, other):
        (d / "device").mkdir(parents=True)
        (d / "device" / "k.nbi").write_text("x")
    old = 1_000_000.0
    for f in [idle, idle / "device", idle / "device" / "k.nbi", other, other / "device", other / "device" / "k.nbi"]:
        os.utime(f, (old, old))
    kernel_cache._prune_siblings(current)
    assert current.exists() and busy.exists(), "a cache written to recently may belong to a running process"
    assert not idle.exists(), "an idle cache of the same checkout is dropped"
    assert other.exists(), "another checkout's cache is never touched"
