"""Edit kinds that remove, move or rewrite existing code:
``delete_function``, ``reorder_functions``, ``change_constant``,
``loop_to_comprehension``."""

from __future__ import annotations

import ast
import random
import tokenize

from .registry import edit_kind
from .source import (
    CodeEdit,
    FuncNode,
    Function,
    Source,
    functions_in,
    has_docstring,
    indent_of,
    one_line,
    splice_text,
    stmt_start_line,
    target_functions,
)

# ---- delete / reorder ----------------------------------------------------


def _block_lines(src: Source, stmt: ast.stmt) -> tuple[int, int]:
    """Lines of ``stmt`` incl. decorators and directly preceding comments."""
    first = stmt_start_line(stmt)
    indent = indent_of(src, first)
    while first > 1 and src.line(first - 1).startswith(indent + "#"):
        first -= 1
    return first, stmt.end_lineno


def _is_blank(src: Source, lineno: int) -> bool:
    return not src.line(lineno).strip()


def _standalone(src: Source, fn: Function) -> bool:
    """Whether ``fn`` occupies whole lines of its own (no ``;`` neighbours)."""
    i = next(k for k, s in enumerate(fn.siblings) if s is fn.node)
    before = fn.siblings[i - 1].end_lineno if i > 0 else 0
    after = fn.siblings[i + 1].lineno if i + 1 < len(fn.siblings) else 10**9
    return before < stmt_start_line(fn.node) and after > fn.node.end_lineno


@edit_kind("delete_function")
def _edit_delete_function(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Delete a function or method that has siblings (unused ones preferred)."""
    fns = [f for f in target_functions(src, target) if _standalone(src, f) and any(
        isinstance(s, (*FuncNode, ast.ClassDef)) and s is not f.node for s in f.siblings)]
    if not fns:
        return None
    used = {n.id for n in ast.walk(src.tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(src.tree) if isinstance(n, ast.Attribute)}
    unused = [f for f in fns if f.node.name not in used]
    fn = rng.choice(unused or fns)
    first, last = _block_lines(src, fn.node)
    index = next(k for k, s in enumerate(fn.siblings) if s is fn.node)
    if index > 0:  # take the blank lines above it, keep those below
        while first > 1 and _is_blank(src, first - 1):
            first -= 1
    else:
        n_lines = len(src.line_starts)
        while last < n_lines and _is_blank(src, last + 1):
            last += 1
    text = splice_text(src.text, [(src.line_offset(first), src.line_offset(last + 1), "")])
    return CodeEdit("delete_function", f"Delete the {fn.kind} `{fn.qualname}`; it is no longer needed.",
                    text, {"functions": [fn.qualname]})


_ORDER_SENSITIVE_DECORATORS = {"setter", "getter", "deleter", "overload", "register"}


def _movable(fn: ast.AST) -> bool:
    for d in fn.decorator_list:
        names = {n.attr for n in ast.walk(d) if isinstance(n, ast.Attribute)}
        names |= {n.id for n in ast.walk(d) if isinstance(n, ast.Name)}
        if names & _ORDER_SENSITIVE_DECORATORS:
            return False
    return True


@edit_kind("reorder_functions")
def _edit_reorder_functions(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Swap two adjacent sibling functions (or methods)."""
    pairs = []
    for f in target_functions(src, target):
        body = f.siblings
        i = next(k for k, s in enumerate(body) if s is f.node)
        if i + 1 < len(body) and isinstance(body[i + 1], FuncNode):
            g = body[i + 1]
            if f.node.name != g.name and _movable(f.node) and _movable(g) and \
                    _standalone(src, f) and _standalone(src, Function(g, f.cls, body)):
                pairs.append((f, Function(g, f.cls, body)))
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    a1, a2 = _block_lines(src, a.node)
    b1, b2 = _block_lines(src, b.node)
    if b1 <= a2:
        return None
    block_a = src.text[src.line_offset(a1): src.line_offset(a2 + 1)]
    block_b = src.text[src.line_offset(b1): src.line_offset(b2 + 1)]
    text = splice_text(src.text, [(src.line_offset(a1), src.line_offset(a2 + 1), block_b),
                              (src.line_offset(b1), src.line_offset(b2 + 1), block_a)])
    kind = "methods" if a.cls else "functions"
    return CodeEdit("reorder_functions",
                    f"Swap the order of the {kind} `{a.qualname}` and `{b.qualname}` so that "
                    f"`{b.node.name}` is defined first.", text, {"functions": [a.qualname, b.qualname]})


# ---- constants -----------------------------------------------------------


def _new_constant(node: ast.Constant, segment: str, rng: random.Random) -> str | None:
    """New literal text for a numeric or simple string constant."""
    v = node.value
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        new = rng.choice([v * 2, v + 1, v * 10, v // 2 if v > 3 else v + 2])
        if new == v:
            new = v + 1
        return hex(new) if segment.lower().startswith("0x") else str(new)
    if isinstance(v, float):
        return repr(v * rng.choice([2.0, 0.5, 10.0]) if v else 1.0)
    if isinstance(v, str):
        quote = segment[:1]
        if quote not in "'\"" or segment != quote + v + quote or not v or len(v) > 60 or "\\" in v:
            return None
        new = v.upper() if v != v.upper() else v.lower()
        if new == v:
            new = v + v
        return quote + new + quote
    return None


def _constant_candidates(src: Source) -> tuple[list, list]:
    """``(named, inline)`` candidate constants: module/class-level ``NAME = lit``
    assignments, and literals inside functions (not docstrings or f-strings)."""
    in_fstring = {id(n) for j in ast.walk(src.tree) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}
    docstrings = {id(scope.body[0].value) for scope in ast.walk(src.tree)
                  if isinstance(scope, (ast.Module, ast.ClassDef, *FuncNode)) and has_docstring(scope)}
    named, inline = [], []
    for scope in [src.tree, *(n for n in ast.walk(src.tree) if isinstance(n, ast.ClassDef))]:
        for stmt in scope.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                    and isinstance(stmt.value, ast.Constant):
                named.append((stmt.targets[0].id, stmt.value))
    for f in functions_in(src.tree):
        for n in ast.walk(f.node):
            if isinstance(n, ast.Constant) and id(n) not in in_fstring and id(n) not in docstrings \
                    and n.lineno == n.end_lineno:
                inline.append((f.qualname, n))
    return named, inline


@edit_kind("change_constant")
def _edit_change_constant(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Change one number or short string literal."""
    named, inline = _constant_candidates(src)
    if target:
        named, inline = [], [(q, n) for q, n in inline if q.split(".")[-1] == target]
    groups = [g for g in ([named, inline] if rng.random() < 0.7 else [inline, named]) if g]
    for group in groups:
        for owner, node in rng.sample(group, min(len(group), 8)):
            start, end = src.node_span(node)
            segment = src.text[start:end]
            new = _new_constant(node, segment, rng)
            if new is None:
                continue
            text = splice_text(src.text, [(start, end, new)])
            if group is named:
                what = f"Change the value of `{owner}` from {segment} to {new}."
            else:
                line = one_line(src.line(node.lineno), 70)
                what = f"In `{owner}`, change the literal {segment} to {new} on the line `{line}`."
            return CodeEdit("change_constant", what, text, {"old": segment, "new": new, "owner": owner})
    return None


# ---- comprehensions ------------------------------------------------------


def _append_call(stmt: ast.stmt, name: str, method: str) -> ast.expr | None:
    """``x`` if ``stmt`` is ``name.method(x)``."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        if isinstance(call.func, ast.Attribute) and call.func.attr == method and \
                isinstance(call.func.value, ast.Name) and call.func.value.id == name and \
                len(call.args) == 1 and not call.keywords:
            return call.args[0]
    return None


def _comprehension_splice(src: Source, init: ast.stmt, loop: ast.stmt) -> tuple[int, int, str] | None:
    """Splice turning ``r = []; for ...: r.append(x)`` into a comprehension."""
    if not (isinstance(init, ast.Assign) and len(init.targets) == 1 and isinstance(init.targets[0], ast.Name)):
        return None
    name = init.targets[0].id
    value = init.value
    if isinstance(value, ast.List) and not value.elts:
        method, brackets = "append", "[]"
    elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "set" \
            and not value.args and not value.keywords:
        method, brackets = "add", "{}"
    else:
        return None
    if not isinstance(loop, ast.For) or loop.orelse or len(loop.body) != 1:
        return None
    cond, inner = None, loop.body[0]
    if isinstance(inner, ast.If) and not inner.orelse and len(inner.body) == 1:
        cond, inner = inner.test, inner.body[0]
    elem = _append_call(inner, name, method)
    if elem is None:
        return None
    parts = [ast.get_source_segment(src.text, n) for n in (elem, loop.target, loop.iter)]
    if cond is not None:
        parts.append(ast.get_source_segment(src.text, cond))
    if any(p is None or "\n" in p for p in parts) or \
            any(isinstance(n, ast.Name) and n.id == name for p in (elem, loop.iter, cond) if p for n in ast.walk(p)):
        return None
    if any(t.type == tokenize.COMMENT and init.lineno <= t.start[0] <= loop.end_lineno for t in src.tokens):
        return None
    comp = f"{parts[0]} for {parts[1]} in {parts[2]}" + (f" if {parts[3]}" if cond is not None else "")
    indent = indent_of(src, init.lineno)
    new = f"{indent}{name} = {brackets[0]}{comp}{brackets[1]}\n"
    return src.line_offset(init.lineno), src.line_offset(loop.end_lineno + 1), new


@edit_kind("loop_to_comprehension")
def _edit_loop_to_comprehension(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Replace an accumulate-in-a-loop pattern with a list/set comprehension."""
    found = []
    for f in target_functions(src, target):
        for node in ast.walk(f.node):
            for body_name in ("body", "orelse", "finalbody"):
                body = getattr(node, body_name, None)
                if not isinstance(body, list):
                    continue
                for i in range(len(body) - 1):
                    init, loop = body[i], body[i + 1]
                    prev_end = body[i - 1].end_lineno if i > 0 else 0
                    next_start = body[i + 2].lineno if i + 2 < len(body) else 10**9
                    if not prev_end < init.lineno <= init.end_lineno < loop.lineno <= loop.end_lineno < next_start:
                        continue
                    splice = _comprehension_splice(src, init, loop)
                    if splice:
                        found.append((f, init.targets[0].id, splice))
    if not found:
        return None
    fn, name, splice = rng.choice(found)
    text = splice_text(src.text, [splice])
    return CodeEdit("loop_to_comprehension", f"In `{fn.qualname}`, replace the loop that builds `{name}` "
                    "with a comprehension.", text, {"functions": [fn.qualname], "variable": name})
