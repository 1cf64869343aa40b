"""The repository's architecture holds: the library (``saspec``) never imports the bench
(``saspec_bench``), in each package every module imports only modules below it (no cycle)
and no other module's private names, the bench's commands sit on its shared layers and not
on each other, ``import saspec`` stays light, and importing it writes nothing into the
source tree."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import saspec
import saspec_bench

PACKAGE = Path(saspec.__file__).resolve().parent
BENCH = Path(saspec_bench.__file__).resolve().parent
HEAVY = ("torch", "transformers", "tiktoken", "numba_cuda", "matplotlib", "vllm")


def _library_modules() -> list[Path]:
    """The library: every module of ``saspec`` (``device`` and ``integrations`` included)."""
    return sorted(PACKAGE.rglob("*.py"))


# -- the import graph: one parser for every check below ------------------------------------


@dataclass(frozen=True)
class Imported:
    """One name an import statement takes: ``import module`` (``name`` None) or
    ``from module import name``, with ``module`` absolute (relative imports resolved)."""

    module: str
    name: str | None


def module_name(path: Path, root: Path) -> str:
    """``root/x/y.py`` -> ``"<root>.x.y"``; a package's ``__init__.py`` is the package."""
    rel = path.relative_to(root.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imports_of(path: Path, root: Path) -> list[Imported]:
    """Every import in ``path`` at any depth (lazy imports inside functions too)."""
    package = list(path.relative_to(root.parent).parent.parts)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [Imported(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out += [Imported(module, a.name) for a in node.names]
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports. ``from pkg import name`` counts as
    importing ``pkg.name`` when that is a module, else ``pkg``."""
    mods = modules(root)
    graph = {}
    for name, path in mods.items():
        deps = set()
        for imp in imports_of(path, root):
            sub = f"{imp.module}.{imp.name}" if imp.name else None
            target = sub if sub in mods else imp.module
            if target in mods and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle: each group of two or more modules that all reach each other, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_imports(root: Path) -> list[str]:
    """``"importer: module.name"`` for every import of a ``_``-prefixed name or module
    from the package (``from .x import _y``, ``from . import _mod``, ``import pkg._mod``)."""
    top = root.name
    out = []
    for name, path in modules(root).items():
        for imp in imports_of(path, root):
            if imp.module != top and not imp.module.startswith(top + "."):
                continue  # another package's, __future__ included
            dotted = imp.module + (f".{imp.name}" if imp.name else "")
            if any(_private(part) for part in dotted.split(".")):
                out.append(f"{name}: {dotted}")
    return out


# -- the layers: the library never imports the bench, no cycles, no private imports ----------


def test_library_never_imports_the_bench():
    offenders = {}
    for path in _library_modules():
        bad = sorted({imp.module for imp in imports_of(path, PACKAGE) if imp.module.split(".")[0] == "saspec_bench"})
        if bad:
            offenders[module_name(path, PACKAGE)] = bad
    assert offenders == {}


def test_the_import_graph_resolves_relative_imports():
    # The checks are only as good as the parser: `from ..core import x` is saspec.core.
    assert {"saspec.core", "saspec.device.automaton_kernels"} <= import_graph(PACKAGE)["saspec.device.slots"]


def test_device_kernels_live_in_kernel_modules():
    """``saspec.device``'s files are named for what they hold: its CUDA kernels only in ``*_kernel.py`` /
    ``*_kernels.py`` (which hold no classes), its host objects elsewhere."""
    from conftest import kernel_modules

    found = kernel_modules()
    assert found, "no CUDA kernel found in saspec.device: the scan is broken"
    assert [m for m in found if not m.endswith(("_kernel", "_kernels"))] == []
    for path in sorted((PACKAGE / "device").glob("*_kernel*.py")):
        classes = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)]
        assert classes == [], f"{path.name} defines {classes}: kernel modules hold kernels only"
        assert f"saspec.device.{path.stem}" in found, f"{path.name} defines no kernel"


@pytest.mark.parametrize("root", [PACKAGE, BENCH], ids=["saspec", "saspec_bench"])
def test_no_import_cycle(root):
    """Every module imports only modules below it: lazy imports inside functions count too."""
    assert cycles(import_graph(root)) == []


@pytest.mark.parametrize("root", [PACKAGE, BENCH], ids=["saspec", "saspec_bench"])
def test_no_module_imports_another_modules_private_name(root):
    assert private_imports(root) == []


def test_the_command_line_is_the_top_of_the_bench():
    """``cli`` imports the commands; nothing imports ``cli``."""
    graph = import_graph(BENCH)
    assert sorted(m for m, deps in graph.items() if "saspec_bench.cli" in deps) == []


def test_bench_commands_sit_on_shared_layers_not_on_each_other():
    """A command (``saspec_bench.commands.*``) imports the bench's shared layers (data, workloads,
    models, measurement) and never another command; the shared layers never import a command."""
    graph = import_graph(BENCH)
    commands = {m for m in graph if m.startswith("saspec_bench.commands.")}
    assert commands, "the bench's commands moved: update this test"
    between = {m: sorted(d for d in deps if d in commands) for m, deps in graph.items() if m in commands}
    assert {m: d for m, d in between.items() if d} == {}
    upward = {m: sorted(d for d in deps if d in commands) for m, deps in graph.items()
              if m not in commands and m != "saspec_bench.cli"}
    assert {m: d for m, d in upward.items() if d} == {}


def test_installing_the_library_pulls_only_numpy_and_numba():
    """The library's own dependencies; everything else is an extra (torch, transformers, numba-cuda, vLLM)."""
    import tomllib

    project = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["project"]
    assert sorted(d.split(">")[0].split("=")[0].split("<")[0] for d in project["dependencies"]) == ["numba", "numpy"]
    assert "scripts" not in project, "the saspec command belongs to the bench distribution"


def test_the_checks_report_exactly_a_cycle_and_the_private_imports(tmp_path):
    files = {
        "__init__.py": "from .a import VALUE\n",
        "a.py": "from __future__ import annotations\n\nfrom . import b\n\nVALUE = 1\n",
        "b.py": "import os\n\n\ndef f():\n    from .a import VALUE  # lazy, and still a cycle\n    return VALUE\n",
        "c.py": "from .b import _helper, f\nfrom .a import __doc__\n",
        "sub/__init__.py": "",
        "sub/d.py": "from ..b import f\nfrom .. import c\nimport fake.a\n",
        "sub/e.py": "from . import _impl\n",
        "sub/_impl.py": "",
    }
    root = tmp_path / "fake"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    graph = import_graph(root)
    assert graph["fake.sub.d"] == {"fake.a", "fake.b", "fake.c"}
    assert cycles(graph) == [["fake.a", "fake.b"]]
    assert private_imports(root) == ["fake.c: fake.b._helper", "fake.sub.e: fake.sub._impl"]


# -- import saspec stays light ---------------------------------------------------------------


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
        "from saspec import SpecEngine, SuffixAutomaton, NgramDrafter, DraftPolicy, SequencePolicy\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy"
        " or m.startswith(('saspec_bench', 'saspec.device'))))"
    )
    assert out.strip() == "[]"


def test_no_deprecated_names_are_left():
    """The shims of earlier names are gone: the old name is an AttributeError naming saspec."""
    out = _run(
        "import saspec\n"
        "try:\n"
        "    saspec.select_drafts\n"
        "except AttributeError as e:\n"
        "    print('gone', e)\n"
    )
    assert out.startswith("gone") and "select_drafts" in out


def test_cpu_engine_loads_nothing_heavy():
    out = _run(
        "import sys\n"
        "import numpy as np\n"
        "from saspec import SpecEngine\n"
        "e = SpecEngine(); e.add_request('a', [1, 2, 3, 1, 2]); e.prepare(['a'])\n"
        "z = np.zeros\n"
        "e.extend(z((1, 3), np.int32), z(1, np.int32), z(1, np.int32), z((1, 2), np.int32))\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith('saspec_bench')))"
    )
    assert out.strip() == "[]"


# -- compiled kernels are cached outside the source tree, keyed on the sources ---------------


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
