"""Edit kind ``rename``: a parameter, local variable or function, renamed
at every occurrence (the result is checked to mention the old name nowhere)."""

from __future__ import annotations

import ast
import builtins
import keyword
import random
import re

from .registry import edit_kind
from .source import CodeEdit, Source, all_args, functions_in, splice_text, target_functions, user_args

_SYNONYMS: dict[str, tuple[str, ...]] = {
    "data": ("payload", "raw_data"), "result": ("output", "outcome"), "res": ("result",),
    "value": ("val", "current_value"), "val": ("value",), "name": ("label", "identifier"),
    "items": ("entries", "elements"), "item": ("entry", "element"), "line": ("row", "text_line"),
    "lines": ("rows", "text_lines"), "text": ("content", "body_text"), "s": ("string", "text"),
    "i": ("idx", "index"), "j": ("inner_idx", "col"), "n": ("count", "num"), "x": ("value", "elem"),
    "key": ("dict_key", "lookup_key"), "obj": ("instance", "target"), "path": ("file_path", "location"),
    "f": ("fh", "stream"), "fp": ("file_obj", "stream"), "msg": ("message",), "e": ("exc", "error"),
    "err": ("error",), "buf": ("buffer",), "size": ("length", "nbytes"), "count": ("total", "num_items"),
    "idx": ("index", "position"), "index": ("idx", "position"), "tmp": ("temp", "scratch"),
    "node": ("current_node",), "args": ("arguments",), "l": ("lst", "items_list"), "c": ("ch", "char"),
    "k": ("key",), "v": ("value",), "d": ("mapping",), "m": ("match",), "p": ("part",), "t": ("tok",),
}
_RESERVED = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins))


def _new_name(old: str, kind: str, taken: set[str], rng: random.Random) -> str | None:
    """A fresh identifier for ``old`` that does not clash with ``taken``."""
    lead = old[: len(old) - len(old.lstrip("_"))]
    core = old.lstrip("_")
    options = list(_SYNONYMS.get(core.lower(), ()))
    if kind == "function":
        options += [f"{core}_impl", f"{core}_helper", f"do_{core}"]
    else:
        options += [f"{core}_value", f"{core}_obj", f"local_{core}", f"{core}_var"]
    rng.shuffle(options)
    for opt in options:
        new = lead + opt
        if new != old and new.isidentifier() and new not in taken and new not in _RESERVED:
            return new
    return None


def _positionless_bindings(node: ast.AST) -> set[str]:
    """Names bound by constructs whose AST has no position for the name."""
    names: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            names.update(n.names)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            names.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names.add(n.rest)
    return names


def _scope_occurrences(fn: ast.AST, name: str) -> list[ast.AST]:
    """``Name``/``arg`` nodes spelling ``name`` in ``fn``'s parameters and body.

    Defaults, annotations and decorators (evaluated outside ``fn``) are left out.
    """
    found: list[ast.AST] = [a for a in all_args(fn) if a.arg == name]
    for stmt in fn.body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and n.id == name or isinstance(n, ast.arg) and n.arg == name:
                found.append(n)
    return found


def _keyword_occurrences(tree: ast.Module, func: str, name: str) -> list[ast.keyword]:
    """Keyword arguments ``name=`` in calls to ``func(...)`` / ``x.func(...)``."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            callee = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
            if callee == func:
                found.extend(k for k in n.keywords if k.arg == name)
    return found


def _def_name_offset(src: Source, fn: ast.AST) -> int | None:
    """Offset of the function/class name after ``def``/``class``."""
    start = src.ast_offset(fn.lineno, fn.col_offset)
    m = re.compile(r"(?:async\s+)?(?:def|class)\s+").match(src.text, start)
    if m and src.text.startswith(fn.name, m.end()):
        return m.end()
    return None


def _rename_spans(src: Source, kind: str, fn: ast.AST, name: str) -> list[tuple[int, int]] | None:
    """Offsets of every occurrence of ``name`` that a rename must change."""
    spans: list[tuple[int, int]] = []
    if kind == "function":
        at = _def_name_offset(src, fn)
        if at is None:
            return None
        spans.append((at, at + len(name)))
        nodes = [n for n in ast.walk(src.tree) if isinstance(n, ast.Name) and n.id == name]
    else:
        nodes = _scope_occurrences(fn, name)
        if kind == "parameter":
            nodes += _keyword_occurrences(src.tree, fn.name, name)
    for n in nodes:
        start = src.ast_offset(n.lineno, n.col_offset)
        spans.append((start, start + len(name)))
    if any(src.text[a:b] != name for a, b in spans) or len(set(spans)) != len(spans):
        return None
    return spans


def _rename_candidates(src: Source, target: str | None) -> list[tuple[str, ast.AST, str, str]]:
    """``(kind, function, name, owner)`` for parameters, locals and functions."""
    out = []
    attrs = {n.attr for n in ast.walk(src.tree) if isinstance(n, ast.Attribute)}
    strings = " ".join(n.value for n in ast.walk(src.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    module_banned = _positionless_bindings(src.tree)
    for f in target_functions(src, target):
        banned = _positionless_bindings(f.node)
        params = [a.arg for a in user_args(f.node)]
        local_names = sorted({
            n.id for stmt in f.node.body for n in ast.walk(stmt)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        } - set(params))
        for kind, names in (("parameter", params), ("variable", local_names)):
            for name in names:
                if name not in banned and name != "_" and not name.startswith("__"):
                    out.append((kind, f.node, name, f.qualname))
        if f.cls is None and not f.node.name.startswith("__") and f.node.name not in attrs \
                and f.node.name not in module_banned and f.node.name not in strings:
            out.append(("function", f.node, f.node.name, f.qualname))
    return out


def _rename_verified(edit: CodeEdit) -> bool:
    """Whether the renamed code mentions the old name nowhere it was renamed."""
    d = edit.details
    tree = ast.parse(edit.source)
    if d["kind"] == "function":
        return not any(isinstance(n, ast.Name) and n.id == d["old"] for n in ast.walk(tree))
    owner = d["scope"].split(".")[-1]
    for f in functions_in(tree):
        if f.node.name == owner and _scope_occurrences(f.node, d["new"]):
            return not _scope_occurrences(f.node, d["old"])
    return False


@edit_kind("rename", verify=_rename_verified)
def _edit_rename(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Rename a parameter, local variable or function everywhere it is used."""
    cands = _rename_candidates(src, target)
    rng.shuffle(cands)
    for kind, fn, old, owner in cands[:12]:
        new = _new_name(old, kind, src.identifiers, rng)
        spans = _rename_spans(src, kind, fn, old) if new else None
        if not spans:
            continue
        text = splice_text(src.text, [(a, b, new) for a, b in spans])
        if kind == "function":
            what = f"Rename the function `{old}` to `{new}` and update every reference to it."
        else:
            what = f"Rename the {kind} `{old}` in `{owner}` to `{new}` (update every use)."
        return CodeEdit("rename", what, text, {"kind": kind, "old": old, "new": new,
                                               "scope": owner, "occurrences": len(spans)})
    return None
