"""Edit kinds that document code without changing what it does:
``type_hints``, ``docstring``, ``add_comments``."""

from __future__ import annotations

import ast
import random
import re

from .registry import edit_kind
from .source import (
    CodeEdit,
    FuncNode,
    Function,
    Source,
    arg_defaults,
    body_insert_line,
    body_top_splices,
    has_docstring,
    header_tokens,
    indent_of,
    is_generator,
    module_assigns,
    module_has_import,
    name_words,
    one_line,
    pick_functions,
    prelude_edit,
    returns_value,
    splice_text,
    stmt_start_line,
    target_functions,
    user_args,
    walk_own,
)

# ---- type hints ----------------------------------------------------------


def _default_type(default: ast.AST | None) -> str:
    if isinstance(default, ast.Constant) and type(default.value) in (bool, int, float, str, bytes):
        return type(default.value).__name__
    return "Any"


def _return_type(fn: ast.AST) -> str | None:
    """Annotation to add for ``fn``'s return, or None to leave it alone."""
    if is_generator(fn):
        return None
    if not returns_value(fn):
        return "None"
    values = [n.value for n in walk_own(fn) if isinstance(n, ast.Return) and n.value is not None]
    if all(isinstance(v, ast.Compare) or isinstance(v, ast.Constant) and isinstance(v.value, bool)
           or isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not) for v in values):
        return "bool"
    if all(isinstance(v, ast.JoinedStr) or isinstance(v, ast.Constant) and isinstance(v.value, str) for v in values):
        return "str"
    for name, kinds in _RETURN_NODE_TYPES.items():
        if all(isinstance(v, kinds) for v in values):
            return name
    if all(isinstance(v, ast.Constant) for v in values) and len({type(v.value) for v in values}) == 1:
        if type(values[0].value) in (int, float, bytes):
            return type(values[0].value).__name__
    return "Any"


_RETURN_NODE_TYPES = {
    "list": (ast.List, ast.ListComp), "dict": (ast.Dict, ast.DictComp),
    "set": (ast.Set, ast.SetComp), "tuple": (ast.Tuple,),
}


def _hint_splices(src: Source, fn: ast.AST) -> tuple[list[tuple[int, int, str]], bool]:
    """Splices annotating ``fn``; also whether ``Any`` is used."""
    splices: list[tuple[int, int, str]] = []
    uses_any = False
    defaults = arg_defaults(fn)
    for arg in user_args(fn):
        if arg.annotation is not None:
            continue
        end = src.ast_offset(arg.end_lineno, arg.end_col_offset)
        default = defaults.get(id(arg))
        hint = _default_type(default)
        if default is None:
            splices.append((end, end, f": {hint}"))
        else:
            gap_end = src.ast_offset(default.lineno, default.col_offset)
            if not re.fullmatch(r"[ \t]*=[ \t]*", src.text[end:gap_end]):
                continue
            splices.append((end, gap_end, f": {hint} = "))
        uses_any |= hint == "Any"
    if fn.returns is None:
        header = header_tokens(src, fn)
        ret = _return_type(fn)
        if header is not None and ret is not None:
            at = src.tok_offset(header[0].end)
            splices.append((at, at, f" -> {ret}"))
            uses_any |= ret == "Any"
    return splices, uses_any


@edit_kind("type_hints")
def _edit_type_hints(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Annotate parameters (``: Any`` or the default's type) and returns."""
    fns = [f for f in target_functions(src, target) if _hint_splices(src, f.node)[0]]
    if not fns:
        return None
    chosen, phrase = pick_functions(fns, rng)
    splices, uses_any = [], False
    for f in chosen:
        s, a = _hint_splices(src, f.node)
        splices += s
        uses_any |= a
    if uses_any and not module_has_import(src.tree, "typing", "Any") and not module_assigns(src.tree, "Any"):
        splices.append(prelude_edit(src, ["from typing import Any"], []))
    text = splice_text(src.text, splices)
    return CodeEdit("type_hints", f"Add type hints to {phrase} (use `Any` where the type is unclear).",
                    text, {"functions": [f.qualname for f in chosen]})


# ---- docstrings ----------------------------------------------------------


def _docstring_for(fn: Function, indent: str, rng: random.Random) -> str:
    """A docstring (with its indentation and trailing newline) for ``fn``."""
    node = fn.node
    if node.name == "__init__":
        summary = f"Initialize the {fn.cls.name if fn.cls else 'object'} instance."
    elif node.name.startswith("__") and node.name.endswith("__"):
        summary = f"Implement `{node.name}` for {fn.cls.name if fn.cls else 'this object'}."
    else:
        words = name_words(node.name) or ["run"]
        summary = " ".join([words[0].capitalize(), *words[1:]]) + "."
    params = [a.arg for a in user_args(node)]
    if rng.random() < 0.4 or not (params or returns_value(node)):
        return f'{indent}"""{summary}"""\n'
    lines = [f'{indent}"""{summary}', ""]
    if params:
        lines.append(f"{indent}Args:")
        lines += [f"{indent}    {p}: The {' '.join(name_words(p)) or p} argument." for p in params]
    if returns_value(node):
        if params:
            lines.append("")
        lines += [f"{indent}Returns:", f"{indent}    The result of {' '.join(name_words(node.name)) or 'the call'}."]
    lines.append(f'{indent}"""')
    return "\n".join(lines) + "\n"


@edit_kind("docstring")
def _edit_docstring(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Add docstrings to functions that lack one."""
    fns = [f for f in target_functions(src, target)
           if not has_docstring(f.node) and body_insert_line(src, f.node, False) is not None]
    if not fns:
        return None
    chosen, phrase = pick_functions(fns, rng)
    splices = body_top_splices(src, chosen, False, lambda f, indent: _docstring_for(f, indent, rng))
    text = splice_text(src.text, splices)
    return CodeEdit("docstring", f"Add a Google-style docstring to {phrase}.", text,
                    {"functions": [f.qualname for f in chosen]})


# ---- comments ------------------------------------------------------------


def _describe(stmt: ast.stmt, src: Source) -> str:
    """A short comment explaining ``stmt``."""
    seg = lambda n: one_line(ast.get_source_segment(src.text, n) or "...")  # noqa: E731
    if isinstance(stmt, ast.Assign):
        targets = ", ".join(seg(t) for t in stmt.targets)
        if isinstance(stmt.value, (ast.Constant, ast.List, ast.Dict, ast.Set, ast.Tuple)) and \
                not getattr(stmt.value, "elts", getattr(stmt.value, "keys", [1])):
            return f"Initialize {targets}"
        return f"Compute {targets}"
    if isinstance(stmt, ast.AugAssign):
        return f"Update {seg(stmt.target)}"
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return f"Iterate over {seg(stmt.iter)}"
    if isinstance(stmt, ast.While):
        return f"Loop while {seg(stmt.test)}"
    if isinstance(stmt, ast.If):
        return f"Handle the case where {seg(stmt.test)}"
    if isinstance(stmt, ast.Return):
        return f"Return {seg(stmt.value)}" if stmt.value is not None else "Nothing to return"
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return f"Call {seg(stmt.value.func)}"
    if isinstance(stmt, ast.Try):
        return "Guard against errors in the following block"
    if isinstance(stmt, FuncNode):
        return f"Helper function {stmt.name}"
    if isinstance(stmt, ast.Raise):
        return "Signal an error"
    return "Next step"


def _comment_splices(src: Source, fn: ast.AST) -> list[tuple[int, int, str]]:
    body = fn.body[1:] if has_docstring(fn) else fn.body
    if body_insert_line(src, fn, False) is None:
        return []
    splices, prev_end = [], 0
    for stmt in body:
        start = stmt_start_line(stmt)
        if start > prev_end and not src.line(start - 1).strip().startswith("#"):
            at = src.line_offset(start)
            splices.append((at, at, f"{indent_of(src, start)}# {_describe(stmt, src)}\n"))
        prev_end = stmt.end_lineno
    return splices


@edit_kind("add_comments")
def _edit_add_comments(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Add an explanatory comment above each statement of a function body."""
    fns = [f for f in target_functions(src, target) if _comment_splices(src, f.node)]
    if not fns:
        return None
    fn = rng.choice(fns)
    text = splice_text(src.text, _comment_splices(src, fn.node))
    return CodeEdit("add_comments", f"Add a short comment above each statement in `{fn.qualname}` "
                    "explaining what it does.", text, {"functions": [fn.qualname]})
