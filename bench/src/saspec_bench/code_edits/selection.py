"""Which real Python code the edits are applied to: the non-test CPython
standard-library files, their code units (a short module whole, else its larger
top-level functions and classes), and a unit's edits applied one after another."""

from __future__ import annotations

import ast
import os
import random
import sysconfig
from functools import lru_cache
from typing import Iterator, Sequence

from .registry import apply_edit
from .source import CodeEdit, FuncNode, normalize_source, split_lines, stmt_start_line

_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
              "encodings", "pydoc_data", "ensurepip", "turtledemo", "__phello__"}
_MAX_FILE_BYTES = 200_000


@lru_cache(maxsize=4)
def stdlib_python_files(root: str | None = None) -> tuple[str, ...]:
    """Sorted paths (relative to ``root``) of non-test stdlib ``.py`` files.

    ``root`` defaults to ``sysconfig.get_paths()["stdlib"]``.
    """
    root = root or sysconfig.get_paths()["stdlib"]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(("test", "config-")))
        rel_dir = os.path.relpath(dirpath, root)
        for fn in sorted(filenames):
            if fn.endswith(".py") and not fn.startswith("test_") and fn != "__main__.py":
                full = os.path.join(dirpath, fn)
                if os.path.getsize(full) <= _MAX_FILE_BYTES:
                    found.append(os.path.normpath(os.path.join(rel_dir, fn)))
    return tuple(sorted(found))


def read_python(path: str) -> tuple[str, ast.Module] | None:
    try:
        with open(path, encoding="utf-8") as f:
            text = normalize_source(f.read())
        return text, ast.parse(text)
    except (UnicodeDecodeError, SyntaxError, ValueError, OSError):
        return None


def code_units(text: str, tree: ast.Module, rng: random.Random) -> Iterator[tuple[str, str]]:
    """Candidate ``(unit_label, code)`` pieces of a module, best first.

    The whole module when it has at most 400 lines, otherwise top-level
    functions/classes of 20-300 lines in random order.
    """
    if text.count("\n") <= 400:
        yield "module", text
        return
    lines = split_lines(text)
    defs = [s for s in tree.body if isinstance(s, (*FuncNode, ast.ClassDef))
            and 20 <= s.end_lineno - stmt_start_line(s) + 1 <= 300]
    rng.shuffle(defs)
    for node in defs:
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        code = "".join(lines[stmt_start_line(node) - 1: node.end_lineno])
        try:
            ast.parse(code)
        except SyntaxError:  # e.g. a backslash-continued last line
            continue
        yield f"{kind}:{node.name}", code


def edit_unit(code: str, kinds: Sequence[str], rng: random.Random, n_edits: int) -> list[CodeEdit]:
    """Apply up to ``n_edits`` edits (tried in ``kinds`` order) one after another."""
    edits: list[CodeEdit] = []
    for kind in kinds:
        edit = apply_edit(kind, edits[-1].source if edits else code, rng)
        if edit is not None:
            edits.append(edit)
            if len(edits) == n_edits:
                break
    return edits
