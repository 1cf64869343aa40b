"""Code edits done the way a coding agent's output does them: precise, through
``ast`` and ``tokenize``, so the untouched text stays byte-identical.

``apply_edit(kind, source, rng)`` applies one edit kind (rename an identifier,
add type hints, docstrings, try/except, logging, comments or input validation,
delete or reorder functions, change a constant, turn a loop into a
comprehension) and returns a ``CodeEdit`` with the instruction text, or None
when the kind does not apply to that source. The workloads in ``workloads``
turn these into (prompt, output) traces.
"""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import random
import re
import tokenize
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable, Iterator

# ==========================================================================
# Source positions and splicing
# ==========================================================================

_FuncNode = (ast.FunctionDef, ast.AsyncFunctionDef)


def _normalize_source(text: str) -> str:
    """Unix newlines, no trailing whitespace at the end, one final newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.rstrip() + "\n"


class _Source:
    """Python source with its AST, tokens and position helpers.

    ``ast`` columns are UTF-8 byte offsets and ``tokenize`` columns are
    characters; both are converted to absolute character offsets here.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tree = ast.parse(text)
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line(self, lineno: int) -> str:
        """Text of 1-based line ``lineno`` without its newline."""
        start = self.line_starts[lineno - 1]
        end = self.line_starts[lineno] - 1 if lineno < len(self.line_starts) else len(self.text)
        return self.text[start:end]

    def line_offset(self, lineno: int) -> int:
        """Offset where line ``lineno`` starts (``len(text)`` past the end)."""
        return self.line_starts[lineno - 1] if lineno <= len(self.line_starts) else len(self.text)

    def ast_offset(self, lineno: int, col_byte: int) -> int:
        """Absolute offset of an ``ast`` (line, byte column) position."""
        line = self.line(lineno)
        col = col_byte if line.isascii() else len(line.encode()[:col_byte].decode("utf-8", "replace"))
        return self.line_starts[lineno - 1] + col

    def tok_offset(self, pos: tuple[int, int]) -> int:
        """Absolute offset of a ``tokenize`` (row, char column) position."""
        return self.line_starts[pos[0] - 1] + pos[1]

    def node_span(self, node: ast.AST) -> tuple[int, int]:
        """Absolute ``[start, end)`` offsets of an AST node."""
        return (
            self.ast_offset(node.lineno, node.col_offset),
            self.ast_offset(node.end_lineno, node.end_col_offset),
        )

    @cached_property
    def tokens(self) -> list[tokenize.TokenInfo]:
        return list(tokenize.generate_tokens(io.StringIO(self.text).readline))

    @cached_property
    def identifiers(self) -> set[str]:
        """Every identifier-like word in the text (a superset of used names)."""
        return set(re.findall(r"[A-Za-z_]\w*", self.text))


def _split_lines(text: str) -> list[str]:
    """Lines of ``text`` with their ``\n`` (unlike ``str.splitlines``, form
    feeds and other Unicode line breaks do not split)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _splice(text: str, edits: Iterable[tuple[int, int, str]]) -> str:
    """Replace each ``[start, end)`` of ``text`` by its new string."""
    out = text
    last_start = len(text) + 1
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        if end > last_start:
            raise ValueError("overlapping edits")
        out = out[:start] + new + out[end:]
        last_start = start
    return out


# ==========================================================================
# AST queries
# ==========================================================================


@dataclass(frozen=True)
class _Fn:
    """A function with the class it belongs to (if a method) and its siblings."""

    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: ast.ClassDef | None
    siblings: list[ast.stmt]

    @property
    def qualname(self) -> str:
        return f"{self.cls.name}.{self.node.name}" if self.cls else self.node.name

    @property
    def kind(self) -> str:
        return "method" if self.cls else "function"


def _functions(tree: ast.Module) -> list[_Fn]:
    """Module-level functions and methods (classes searched recursively)."""
    found: list[_Fn] = []

    def visit(body: list[ast.stmt], cls: ast.ClassDef | None) -> None:
        for stmt in body:
            if isinstance(stmt, _FuncNode):
                found.append(_Fn(stmt, cls, body))
            elif isinstance(stmt, ast.ClassDef):
                visit(stmt.body, stmt)

    visit(tree.body, None)
    return found


def _has_docstring(node: ast.AST) -> bool:
    body = getattr(node, "body", [])
    return bool(body) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str)


def _stmt_start_line(stmt: ast.stmt) -> int:
    """First line of a statement including its decorators."""
    decorators = getattr(stmt, "decorator_list", [])
    return min([stmt.lineno] + [d.lineno for d in decorators])


def _all_args(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    extra = [x for x in (a.vararg, a.kwarg) if x is not None]
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *extra]


def _user_args(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    """Parameters other than ``self``/``cls``."""
    return [a for a in _all_args(fn) if a.arg not in ("self", "cls")]


def _walk_own(node: ast.AST) -> Iterator[ast.AST]:
    """Like ``ast.walk`` but does not enter nested functions, lambdas or classes."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        yield child
        if not isinstance(child, (*_FuncNode, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(child))


def _returns_value(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.Return) and n.value is not None for n in _walk_own(fn))


def _is_generator(fn: ast.AST) -> bool:
    return any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in _walk_own(fn))


def _words(name: str) -> list[str]:
    """``_parseHeaderLine`` -> ``["parse", "header", "line"]``."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name.strip("_"))
    return [w.lower() for w in re.split(r"[_\s]+", spaced) if w]


def _one_line(text: str, limit: int = 48) -> str:
    """Collapse whitespace and shorten ``text`` to at most ``limit`` chars."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _header_tokens(
    src: _Source, fn: ast.FunctionDef | ast.AsyncFunctionDef
) -> tuple[tokenize.TokenInfo, tokenize.TokenInfo] | None:
    """The ``)`` closing ``fn``'s parameters and the ``:`` ending its header."""
    start = (fn.lineno, len(src.line(fn.lineno).encode()[: fn.col_offset].decode("utf-8", "replace")))
    toks = src.tokens
    i = next((k for k, t in enumerate(toks) if t.start >= start and t.string == "("), None)
    if i is None:
        return None
    depth, close = 0, None
    for k in range(i, len(toks)):
        t = toks[k]
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
            if depth == 0 and close is None:
                close = t
        elif close is not None and depth == 0 and t.type == tokenize.OP and t.string == ":":
            return close, t
    return None


def _body_insert_line(src: _Source, fn: ast.FunctionDef | ast.AsyncFunctionDef, after_docstring: bool) -> int | None:
    """Line at which new statements can be inserted at the top of ``fn``'s body.

    With ``after_docstring`` the line after the docstring (if any).  None for
    one-line functions (body on the ``def`` line).
    """
    header = _header_tokens(src, fn)
    if header is None:
        return None
    colon_row = header[1].start[0]
    first = fn.body[0]
    if _stmt_start_line(first) <= colon_row:
        return None
    if after_docstring and _has_docstring(fn):
        if len(fn.body) > 1 and fn.body[1].lineno == first.end_lineno:
            return None
        return first.end_lineno + 1
    return colon_row + 1


def _indent_of(src: _Source, lineno: int) -> str:
    line = src.line(lineno)
    return line[: len(line) - len(line.lstrip())]


def _module_has_import(tree: ast.Module, module: str, name: str | None = None) -> bool:
    """Whether a top-level statement imports ``module`` (or ``name`` from it)."""
    for stmt in tree.body:
        if name is None and isinstance(stmt, ast.Import):
            if any(a.name == module and a.asname is None for a in stmt.names):
                return True
        if name is not None and isinstance(stmt, ast.ImportFrom) and stmt.module == module:
            if any(a.name == name and a.asname is None for a in stmt.names):
                return True
    return False


def _module_assigns(tree: ast.Module, name: str) -> bool:
    return any(
        isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
        for stmt in tree.body
    )


def _prelude_edit(src: _Source, imports: list[str], definitions: list[str]) -> tuple[int, int, str] | None:
    """Splice adding import lines and module-level definitions near the top.

    They go after the last top-level import before the first ``def``/``class``,
    else after the module docstring, else before the first statement.
    """
    if not imports and not definitions:
        return None
    body = src.tree.body
    last_doc = body[0] if _has_docstring(src.tree) else None
    last_import = None
    for stmt in body:
        if isinstance(stmt, (*_FuncNode, ast.ClassDef)):
            break
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            last_import = stmt
    defs = ("\n" + "".join(d + "\n" for d in definitions)) if definitions else ""
    block = "".join(i + "\n" for i in imports)
    if last_import is not None:
        at = src.line_offset(last_import.end_lineno + 1)
        return at, at, block + defs
    if last_doc is not None:
        at = src.line_offset(last_doc.end_lineno + 1)
        return at, at, "\n" + block + defs
    at = src.line_offset(_stmt_start_line(body[0])) if body else len(src.text)
    return at, at, (block + defs).lstrip("\n") + "\n\n"


def _logger_prelude(src: _Source) -> tuple[int, int, str] | None:
    """Splice defining ``logger = logging.getLogger(__name__)`` if missing."""
    if _module_assigns(src.tree, "logger"):
        return None
    imports = [] if _module_has_import(src.tree, "logging") else ["import logging"]
    return _prelude_edit(src, imports, ["logger = logging.getLogger(__name__)"])


# ==========================================================================
# Code edits
# ==========================================================================


@dataclass(frozen=True)
class CodeEdit:
    """One applied edit: its kind, the instruction an agent would get, the result."""

    kind: str
    instruction: str
    source: str
    details: dict = field(default_factory=dict)


_EditFn = Callable[[_Source, random.Random, "str | None"], "CodeEdit | None"]


def _pick_functions(fns: list[_Fn], rng: random.Random, max_all: int = 4) -> tuple[list[_Fn], str]:
    """One function, or all of them when few; with a phrase naming them."""
    if len(fns) > 1 and len(fns) <= max_all and rng.random() < 0.5:
        return fns, "every function" if all(f.cls is None for f in fns) else "every function and method"
    fn = rng.choice(fns)
    return [fn], f"the {fn.kind} `{fn.qualname}`"


def _targets(src: _Source, target: str | None) -> list[_Fn]:
    fns = _functions(src.tree)
    return [f for f in fns if f.node.name == target] if target else fns


# ---- rename --------------------------------------------------------------

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
    found: list[ast.AST] = [a for a in _all_args(fn) if a.arg == name]
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


def _def_name_offset(src: _Source, fn: ast.AST) -> int | None:
    """Offset of the function/class name after ``def``/``class``."""
    start = src.ast_offset(fn.lineno, fn.col_offset)
    m = re.compile(r"(?:async\s+)?(?:def|class)\s+").match(src.text, start)
    if m and src.text.startswith(fn.name, m.end()):
        return m.end()
    return None


def _rename_spans(src: _Source, kind: str, fn: ast.AST, name: str) -> list[tuple[int, int]] | None:
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


def _rename_candidates(src: _Source, target: str | None) -> list[tuple[str, ast.AST, str, str]]:
    """``(kind, function, name, owner)`` for parameters, locals and functions."""
    out = []
    attrs = {n.attr for n in ast.walk(src.tree) if isinstance(n, ast.Attribute)}
    strings = " ".join(n.value for n in ast.walk(src.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    module_banned = _positionless_bindings(src.tree)
    for f in _targets(src, target):
        banned = _positionless_bindings(f.node)
        params = [a.arg for a in _user_args(f.node)]
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


def _edit_rename(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Rename a parameter, local variable or function everywhere it is used."""
    cands = _rename_candidates(src, target)
    rng.shuffle(cands)
    for kind, fn, old, owner in cands[:12]:
        new = _new_name(old, kind, src.identifiers, rng)
        spans = _rename_spans(src, kind, fn, old) if new else None
        if not spans:
            continue
        text = _splice(src.text, [(a, b, new) for a, b in spans])
        if kind == "function":
            what = f"Rename the function `{old}` to `{new}` and update every reference to it."
        else:
            what = f"Rename the {kind} `{old}` in `{owner}` to `{new}` (update every use)."
        return CodeEdit("rename", what, text, {"kind": kind, "old": old, "new": new,
                                               "scope": owner, "occurrences": len(spans)})
    return None


# ---- type hints ----------------------------------------------------------


def _default_type(default: ast.AST | None) -> str:
    if isinstance(default, ast.Constant) and type(default.value) in (bool, int, float, str, bytes):
        return type(default.value).__name__
    return "Any"


def _return_type(fn: ast.AST) -> str | None:
    """Annotation to add for ``fn``'s return, or None to leave it alone."""
    if _is_generator(fn):
        return None
    if not _returns_value(fn):
        return "None"
    values = [n.value for n in _walk_own(fn) if isinstance(n, ast.Return) and n.value is not None]
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


def _arg_defaults(fn: ast.AST) -> dict[int, ast.AST]:
    """``id(arg) -> default expression`` for parameters that have one."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    out = {id(arg): d for arg, d in zip(positional[len(positional) - len(a.defaults):], a.defaults)}
    out.update({id(arg): d for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    return out


def _hint_splices(src: _Source, fn: ast.AST) -> tuple[list[tuple[int, int, str]], bool]:
    """Splices annotating ``fn``; also whether ``Any`` is used."""
    splices: list[tuple[int, int, str]] = []
    uses_any = False
    defaults = _arg_defaults(fn)
    for arg in _user_args(fn):
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
        header = _header_tokens(src, fn)
        ret = _return_type(fn)
        if header is not None and ret is not None:
            at = src.tok_offset(header[0].end)
            splices.append((at, at, f" -> {ret}"))
            uses_any |= ret == "Any"
    return splices, uses_any


def _edit_type_hints(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Annotate parameters (``: Any`` or the default's type) and returns."""
    fns = [f for f in _targets(src, target) if _hint_splices(src, f.node)[0]]
    if not fns:
        return None
    chosen, phrase = _pick_functions(fns, rng)
    splices, uses_any = [], False
    for f in chosen:
        s, a = _hint_splices(src, f.node)
        splices += s
        uses_any |= a
    if uses_any and not _module_has_import(src.tree, "typing", "Any") and not _module_assigns(src.tree, "Any"):
        splices.append(_prelude_edit(src, ["from typing import Any"], []))
    text = _splice(src.text, splices)
    return CodeEdit("type_hints", f"Add type hints to {phrase} (use `Any` where the type is unclear).",
                    text, {"functions": [f.qualname for f in chosen]})


# ---- docstrings ----------------------------------------------------------


def _docstring_for(fn: _Fn, indent: str, rng: random.Random) -> str:
    """A docstring (with its indentation and trailing newline) for ``fn``."""
    node = fn.node
    if node.name == "__init__":
        summary = f"Initialize the {fn.cls.name if fn.cls else 'object'} instance."
    elif node.name.startswith("__") and node.name.endswith("__"):
        summary = f"Implement `{node.name}` for {fn.cls.name if fn.cls else 'this object'}."
    else:
        words = _words(node.name) or ["run"]
        summary = " ".join([words[0].capitalize(), *words[1:]]) + "."
    params = [a.arg for a in _user_args(node)]
    if rng.random() < 0.4 or not (params or _returns_value(node)):
        return f'{indent}"""{summary}"""\n'
    lines = [f'{indent}"""{summary}', ""]
    if params:
        lines.append(f"{indent}Args:")
        lines += [f"{indent}    {p}: The {' '.join(_words(p)) or p} argument." for p in params]
    if _returns_value(node):
        if params:
            lines.append("")
        lines += [f"{indent}Returns:", f"{indent}    The result of {' '.join(_words(node.name)) or 'the call'}."]
    lines.append(f'{indent}"""')
    return "\n".join(lines) + "\n"


def _edit_docstring(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Add docstrings to functions that lack one."""
    fns = [f for f in _targets(src, target)
           if not _has_docstring(f.node) and _body_insert_line(src, f.node, False) is not None]
    if not fns:
        return None
    chosen, phrase = _pick_functions(fns, rng)
    splices = []
    for f in chosen:
        at = src.line_offset(_body_insert_line(src, f.node, False))
        indent = _indent_of(src, f.node.body[0].lineno)
        splices.append((at, at, _docstring_for(f, indent, rng)))
    text = _splice(src.text, splices)
    return CodeEdit("docstring", f"Add a Google-style docstring to {phrase}.", text,
                    {"functions": [f.qualname for f in chosen]})


# ---- try/except + logging ------------------------------------------------


def _has_multiline_string(src: _Source, first: int, last: int) -> bool:
    """Whether a string literal spanning several lines touches lines ``first..last``.

    Re-indenting such lines would change the string's value.
    """
    return any(
        isinstance(n, (ast.Constant, ast.JoinedStr)) and n.lineno != n.end_lineno
        and n.end_lineno >= first and n.lineno <= last
        for n in ast.walk(src.tree)
    )


def _wrap_splice(src: _Source, fn: _Fn) -> tuple[int, int, str] | None:
    """Splice wrapping ``fn``'s body (after its docstring) in try/except."""
    node = fn.node
    body = node.body[1:] if _has_docstring(node) else node.body
    insert = _body_insert_line(src, node, after_docstring=True)
    if not body or insert is None or (len(body) == 1 and isinstance(body[0], ast.Try)):
        return None
    first, last = _stmt_start_line(body[0]), body[-1].end_lineno
    if first < insert or _has_multiline_string(src, first, last):
        return None
    indent = _indent_of(src, body[0].lineno)
    unit = "\t" if "\t" in indent else "    "
    old = src.text[src.line_offset(first): src.line_offset(last + 1)]
    shifted = "".join(unit + ln if ln.strip() else ln for ln in _split_lines(old))
    new = (f"{indent}try:\n{shifted}{indent}except Exception:\n"
           f'{indent}{unit}logger.exception("{fn.qualname} failed")\n{indent}{unit}raise\n')
    return src.line_offset(first), src.line_offset(last + 1), new


def _edit_try_except(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Wrap a function body in try/except that logs and re-raises."""
    fns = [f for f in _targets(src, target) if _wrap_splice(src, f) is not None]
    if not fns:
        return None
    fn = rng.choice(fns)
    splices = [_wrap_splice(src, fn)]
    prelude = _logger_prelude(src)
    if prelude:
        splices.append(prelude)
    text = _splice(src.text, splices)
    return CodeEdit("try_except",
                    f"Wrap the body of the {fn.kind} `{fn.qualname}` in a try/except that logs the "
                    "exception with `logger.exception` and re-raises it.", text, {"functions": [fn.qualname]})


def _log_line(fn: _Fn, indent: str) -> str:
    params = [a.arg for a in _user_args(fn.node)]
    if not params:
        return f'{indent}logger.debug("Entering {fn.qualname}")\n'
    fmt = ", ".join(f"{p}=%r" for p in params)
    return f'{indent}logger.debug("{fn.qualname}({fmt})", {", ".join(params)})\n'


def _edit_log_entry(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Add a ``logger.debug`` call with the arguments at function entry."""
    fns = [f for f in _targets(src, target) if _body_insert_line(src, f.node, True) is not None
           and (len(f.node.body) > 1 or not _has_docstring(f.node))]
    if not fns:
        return None
    chosen, phrase = _pick_functions(fns, rng)
    splices = []
    for f in chosen:
        at = src.line_offset(_body_insert_line(src, f.node, True))
        body = f.node.body[1:] if _has_docstring(f.node) else f.node.body
        splices.append((at, at, _log_line(f, _indent_of(src, body[0].lineno))))
    prelude = _logger_prelude(src)
    if prelude:
        splices.append(prelude)
    text = _splice(src.text, splices)
    return CodeEdit("log_entry", f"Add a `logger.debug` call at the start of {phrase} that logs its arguments.",
                    text, {"functions": [f.qualname for f in chosen]})


# ---- delete / reorder ----------------------------------------------------


def _block_lines(src: _Source, stmt: ast.stmt) -> tuple[int, int]:
    """Lines of ``stmt`` incl. decorators and directly preceding comments."""
    first = _stmt_start_line(stmt)
    indent = _indent_of(src, first)
    while first > 1 and src.line(first - 1).startswith(indent + "#"):
        first -= 1
    return first, stmt.end_lineno


def _is_blank(src: _Source, lineno: int) -> bool:
    return not src.line(lineno).strip()


def _standalone(src: _Source, fn: _Fn) -> bool:
    """Whether ``fn`` occupies whole lines of its own (no ``;`` neighbours)."""
    i = next(k for k, s in enumerate(fn.siblings) if s is fn.node)
    before = fn.siblings[i - 1].end_lineno if i > 0 else 0
    after = fn.siblings[i + 1].lineno if i + 1 < len(fn.siblings) else 10**9
    return before < _stmt_start_line(fn.node) and after > fn.node.end_lineno


def _edit_delete_function(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Delete a function or method that has siblings (unused ones preferred)."""
    fns = [f for f in _targets(src, target) if _standalone(src, f) and any(
        isinstance(s, (*_FuncNode, ast.ClassDef)) and s is not f.node for s in f.siblings)]
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
    text = _splice(src.text, [(src.line_offset(first), src.line_offset(last + 1), "")])
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


def _edit_reorder_functions(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Swap two adjacent sibling functions (or methods)."""
    pairs = []
    for f in _targets(src, target):
        body = f.siblings
        i = next(k for k, s in enumerate(body) if s is f.node)
        if i + 1 < len(body) and isinstance(body[i + 1], _FuncNode):
            g = body[i + 1]
            if f.node.name != g.name and _movable(f.node) and _movable(g) and \
                    _standalone(src, f) and _standalone(src, _Fn(g, f.cls, body)):
                pairs.append((f, _Fn(g, f.cls, body)))
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    a1, a2 = _block_lines(src, a.node)
    b1, b2 = _block_lines(src, b.node)
    if b1 <= a2:
        return None
    block_a = src.text[src.line_offset(a1): src.line_offset(a2 + 1)]
    block_b = src.text[src.line_offset(b1): src.line_offset(b2 + 1)]
    text = _splice(src.text, [(src.line_offset(a1), src.line_offset(a2 + 1), block_b),
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


def _constant_candidates(src: _Source) -> tuple[list, list]:
    """``(named, inline)`` candidate constants: module/class-level ``NAME = lit``
    assignments, and literals inside functions (not docstrings or f-strings)."""
    in_fstring = {id(n) for j in ast.walk(src.tree) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}
    docstrings = {id(scope.body[0].value) for scope in ast.walk(src.tree)
                  if isinstance(scope, (ast.Module, ast.ClassDef, *_FuncNode)) and _has_docstring(scope)}
    named, inline = [], []
    for scope in [src.tree, *(n for n in ast.walk(src.tree) if isinstance(n, ast.ClassDef))]:
        for stmt in scope.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                    and isinstance(stmt.value, ast.Constant):
                named.append((stmt.targets[0].id, stmt.value))
    for f in _functions(src.tree):
        for n in ast.walk(f.node):
            if isinstance(n, ast.Constant) and id(n) not in in_fstring and id(n) not in docstrings \
                    and n.lineno == n.end_lineno:
                inline.append((f.qualname, n))
    return named, inline


def _edit_change_constant(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
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
            text = _splice(src.text, [(start, end, new)])
            if group is named:
                what = f"Change the value of `{owner}` from {segment} to {new}."
            else:
                line = _one_line(src.line(node.lineno), 70)
                what = f"In `{owner}`, change the literal {segment} to {new} on the line `{line}`."
            return CodeEdit("change_constant", what, text, {"old": segment, "new": new, "owner": owner})
    return None


# ---- comments, validation, comprehensions --------------------------------


def _describe(stmt: ast.stmt, src: _Source) -> str:
    """A short comment explaining ``stmt``."""
    seg = lambda n: _one_line(ast.get_source_segment(src.text, n) or "...")  # noqa: E731
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
    if isinstance(stmt, _FuncNode):
        return f"Helper function {stmt.name}"
    if isinstance(stmt, ast.Raise):
        return "Signal an error"
    return "Next step"


def _comment_splices(src: _Source, fn: ast.AST) -> list[tuple[int, int, str]]:
    body = fn.body[1:] if _has_docstring(fn) else fn.body
    if _body_insert_line(src, fn, False) is None:
        return []
    splices, prev_end = [], 0
    for stmt in body:
        start = _stmt_start_line(stmt)
        if start > prev_end and not src.line(start - 1).strip().startswith("#"):
            at = src.line_offset(start)
            splices.append((at, at, f"{_indent_of(src, start)}# {_describe(stmt, src)}\n"))
        prev_end = stmt.end_lineno
    return splices


def _edit_add_comments(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Add an explanatory comment above each statement of a function body."""
    fns = [f for f in _targets(src, target) if _comment_splices(src, f.node)]
    if not fns:
        return None
    fn = rng.choice(fns)
    text = _splice(src.text, _comment_splices(src, fn.node))
    return CodeEdit("add_comments", f"Add a short comment above each statement in `{fn.qualname}` "
                    "explaining what it does.", text, {"functions": [fn.qualname]})


_TYPE_CHECKS = {
    "int": "int", "float": "(int, float)", "str": "str", "bool": "bool", "bytes": "bytes",
    "list": "list", "List": "list", "dict": "dict", "Dict": "dict", "tuple": "tuple",
    "Tuple": "tuple", "set": "set", "Set": "set",
}


def _validation_lines(fn: ast.AST, indent: str) -> list[str]:
    """``if ...: raise ...`` checks for ``fn``'s parameters."""
    defaults = _arg_defaults(fn)
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


def _edit_add_validation(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Add argument type/None checks at the top of a function."""
    fns = [f for f in _targets(src, target) if _validation_lines(f.node, "")
           and _body_insert_line(src, f.node, True) is not None
           and (len(f.node.body) > 1 or not _has_docstring(f.node))]
    if not fns:
        return None
    fn = rng.choice(fns)
    body = fn.node.body[1:] if _has_docstring(fn.node) else fn.node.body
    lines = _validation_lines(fn.node, _indent_of(src, body[0].lineno))
    at = src.line_offset(_body_insert_line(src, fn.node, True))
    text = _splice(src.text, [(at, at, "\n".join(lines) + "\n")])
    return CodeEdit("add_validation", f"Add input validation to `{fn.qualname}` that raises TypeError/ValueError "
                    "for arguments of the wrong type or None.", text, {"functions": [fn.qualname]})


def _append_call(stmt: ast.stmt, name: str, method: str) -> ast.expr | None:
    """``x`` if ``stmt`` is ``name.method(x)``."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        if isinstance(call.func, ast.Attribute) and call.func.attr == method and \
                isinstance(call.func.value, ast.Name) and call.func.value.id == name and \
                len(call.args) == 1 and not call.keywords:
            return call.args[0]
    return None


def _comprehension_splice(src: _Source, init: ast.stmt, loop: ast.stmt) -> tuple[int, int, str] | None:
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
    indent = _indent_of(src, init.lineno)
    new = f"{indent}{name} = {brackets[0]}{comp}{brackets[1]}\n"
    return src.line_offset(init.lineno), src.line_offset(loop.end_lineno + 1), new


def _edit_loop_to_comprehension(src: _Source, rng: random.Random, target: str | None) -> CodeEdit | None:
    """Replace an accumulate-in-a-loop pattern with a list/set comprehension."""
    found = []
    for f in _targets(src, target):
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
    text = _splice(src.text, [splice])
    return CodeEdit("loop_to_comprehension", f"In `{fn.qualname}`, replace the loop that builds `{name}` "
                    "with a comprehension.", text, {"functions": [fn.qualname], "variable": name})


# ---- registry ------------------------------------------------------------

_EDITS: dict[str, _EditFn] = {
    "rename": _edit_rename,
    "type_hints": _edit_type_hints,
    "docstring": _edit_docstring,
    "try_except": _edit_try_except,
    "log_entry": _edit_log_entry,
    "delete_function": _edit_delete_function,
    "reorder_functions": _edit_reorder_functions,
    "change_constant": _edit_change_constant,
    "add_comments": _edit_add_comments,
    "add_validation": _edit_add_validation,
    "loop_to_comprehension": _edit_loop_to_comprehension,
}
#: Every edit kind :func:`apply_edit` knows.
EDIT_KINDS: tuple[str, ...] = tuple(_EDITS)
#: Edit kinds used by :func:`build_code_edits`.
CODE_EDIT_KINDS: tuple[str, ...] = (
    "rename", "type_hints", "docstring", "try_except", "log_entry",
    "delete_function", "reorder_functions", "change_constant",
)
#: Edit kinds used by the ``humaneval-edit`` workload.
HUMANEVAL_EDIT_KINDS: tuple[str, ...] = (
    "rename", "add_comments", "add_validation", "docstring", "type_hints",
    "loop_to_comprehension", "try_except", "log_entry",
)


def apply_edit(kind: str, source: str, rng: random.Random, target: str | None = None) -> CodeEdit | None:
    """Apply one edit of ``kind`` to Python ``source``.

    ``target`` restricts function-level edits to functions of that name.
    Returns None when the edit does not apply to this code; a returned edit
    always parses and differs from ``source``.  ``source`` must parse.
    """
    if kind not in _EDITS:
        raise ValueError(f"unknown edit kind {kind!r}; choose from {', '.join(EDIT_KINDS)}")
    src = _Source(source)
    edit = _EDITS[kind](src, rng, target)
    if edit is None or edit.source == source:
        return None
    try:
        ast.parse(edit.source)
    except SyntaxError:
        return None
    if kind == "rename" and not _rename_verified(edit):
        return None
    return edit


def _rename_verified(edit: CodeEdit) -> bool:
    """Whether the renamed code mentions the old name nowhere it was renamed."""
    d = edit.details
    tree = ast.parse(edit.source)
    if d["kind"] == "function":
        return not any(isinstance(n, ast.Name) and n.id == d["old"] for n in ast.walk(tree))
    owner = d["scope"].split(".")[-1]
    for f in _functions(tree):
        if f.node.name == owner and _scope_occurrences(f.node, d["new"]):
            return not _scope_occurrences(f.node, d["old"])
    return False


