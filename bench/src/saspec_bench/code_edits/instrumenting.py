"""Edit kinds that add runtime code around a function's body:
``try_except``, ``log_entry``, ``add_validation``."""

from __future__ import annotations

import ast
import random

from .registry import edit_kind
from .source import (
    CodeEdit,
    Function,
    Source,
    arg_defaults,
    body_insert_line,
    body_top_splices,
    has_docstring,
    indent_of,
    module_assigns,
    module_has_import,
    pick_functions,
    prelude_edit,
    splice_text,
    split_lines,
    stmt_start_line,
    target_functions,
    user_args,
)

# ---- try/except and logging ----------------------------------------------


def _logger_prelude(src: Source) -> tuple[int, int, str] | None:
    """Splice defining ``logger = logging.getLogger(__name__)`` if missing."""
    if module_assigns(src.tree, "logger"):
        return None
    imports = [] if module_has_import(src.tree, "logging") else ["import logging"]
    return prelude_edit(src, imports, ["logger = logging.getLogger(__name__)"])


def _has_multiline_string(src: Source, first: int, last: int) -> bool:
    """Whether a string literal spanning several lines touches lines ``first..last``.

    Re-indenting such lines would change the string's value.
    """
    return any(
        isinstance(n, (ast.Constant, ast.JoinedStr)) and n.lineno != n.end_lineno
        and n.end_lineno >= first and n.lineno <= last
        for n in ast.walk(src.tree)
    )


def _wrap_splice(src: Source, fn: Function) -> tuple[int, int, str] | None:
    """Splice wrapping ``fn``'s body (after its docstring) in try/except."""
    node = fn.node
    body = node.body[1:] if has_docstring(node) else node.body
    insert = body_insert_line(src, node, after_docstring=True)
    if not body or insert is None or (len(body) == 1 and isinstance(body[0], ast.Try)):
        return None
    first, last = stmt_start_line(body[0]), body[-1].end_lineno
    if first < insert or _has_multiline_string(src, first, last):
        return None
    indent = indent_of(src, body[0].lineno)
    unit = "\t" if "\t" in indent else "    "
    old = src.text[src.line_offset(first): src.line_offset(last + 1)]
    shifted = "".join(unit + ln if ln.strip() else ln for ln in split_lines(old))
    new = (f"{indent}try:\n{shifted}{indent}except Exception:\n"
           f'{indent}{unit}logger.exception("{fn.qualname} failed")\n{indent}{unit}raise\n')
    return src.line_offset(first), src.line_offset(last + 1), new


@edit_kind("try_except")
def _edit_try_except(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Wrap a function body in try/except that logs and re-raises."""
    fns = [f for f in target_functions(src, target) if _wrap_splice(src, f) is not None]
    if not fns:
        return None
    fn = rng.choice(fns)
    splices = [_wrap_splice(src, fn)]
    prelude = _logger_prelude(src)
    if prelude:
        splices.append(prelude)
    text = splice_text(src.text, splices)
    return CodeEdit("try_except",
                    f"Wrap the body of the {fn.kind} `{fn.qualname}` in a try/except that logs the "
                    "exception with `logger.exception` and re-raises it.", text, {"functions": [fn.qualname]})


def _log_line(fn: Function, indent: str) -> str:
    params = [a.arg for a in user_args(fn.node)]
    if not params:
        return f'{indent}logger.debug("Entering {fn.qualname}")\n'
    fmt = ", ".join(f"{p}=%r" for p in params)
    return f'{indent}logger.debug("{fn.qualname}({fmt})", {", ".join(params)})\n'


@edit_kind("log_entry")
def _edit_log_entry(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Add a ``logger.debug`` call with the arguments at function entry."""
    fns = [f for f in target_functions(src, target) if body_insert_line(src, f.node, True) is not None
           and (len(f.node.body) > 1 or not has_docstring(f.node))]
    if not fns:
        return None
    chosen, phrase = pick_functions(fns, rng)
    splices = body_top_splices(src, chosen, True, _log_line)
    prelude = _logger_prelude(src)
    if prelude:
        splices.append(prelude)
    text = splice_text(src.text, splices)
    return CodeEdit("log_entry", f"Add a `logger.debug` call at the start of {phrase} that logs its arguments.",
                    text, {"functions": [f.qualname for f in chosen]})


# ---- validation ----------------------------------------------------------


_TYPE_CHECKS = {
    "int": "int", "float": "(int, float)", "str": "str", "bool": "bool", "bytes": "bytes",
    "list": "list", "List": "list", "dict": "dict", "Dict": "dict", "tuple": "tuple",
    "Tuple": "tuple", "set": "set", "Set": "set",
}


def _validation_lines(fn: ast.AST, indent: str) -> list[str]:
    """``if ...: raise ...`` checks for ``fn``'s parameters."""
    defaults = arg_defaults(fn)
    a = fn.args
    lines = []
    for arg in [x for x in [*a.posonlyargs, *a.args, *a.kwonlyargs] if x.arg not in ("self", "cls")]:
        ann = arg.annotation
        base = ann.value if isinstance(ann, ast.Subscript) else ann
        tname = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        default = defaults.get(id(arg))
        if default is not None and isinstance(default, ast.Constant) and default.value is None:
            continue
        if tname in _TYPE_CHECKS:
            lines += [f"{indent}if not isinstance({arg.arg}, {_TYPE_CHECKS[tname]}):",
                      f'{indent}    raise TypeError(f"{arg.arg} must be {tname}, got {{type({arg.arg}).__name__}}")']
        elif ann is None:
            lines += [f"{indent}if {arg.arg} is None:",
                      f'{indent}    raise ValueError("{arg.arg} must not be None")']
    return lines


@edit_kind("add_validation")
def _edit_add_validation(src: Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Add argument type/None checks at the top of a function."""
    fns = [f for f in target_functions(src, target) if _validation_lines(f.node, "")
           and body_insert_line(src, f.node, True) is not None
           and (len(f.node.body) > 1 or not has_docstring(f.node))]
    if not fns:
        return None
    fn = rng.choice(fns)
    body = fn.node.body[1:] if has_docstring(fn.node) else fn.node.body
    lines = _validation_lines(fn.node, indent_of(src, body[0].lineno))
    at = src.line_offset(body_insert_line(src, fn.node, True))
    text = splice_text(src.text, [(at, at, "\n".join(lines) + "\n")])
    return CodeEdit("add_validation", f"Add input validation to `{fn.qualname}` that raises TypeError/ValueError "
                    "for arguments of the wrong type or None.", text, {"functions": [fn.qualname]})
