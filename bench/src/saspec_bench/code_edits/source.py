"""The source model the edit kinds work on: ``Source`` (text, AST, tokens,
offsets), ``splice_text``, AST queries, module-level splices and ``CodeEdit``."""

from __future__ import annotations

import ast
import io
import random
import re
import tokenize
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable, Iterator

# ==========================================================================
# Source positions and splicing
# ==========================================================================

FuncNode = (ast.FunctionDef, ast.AsyncFunctionDef)


def normalize_source(text: str) -> str:
    """Unix newlines, no trailing whitespace at the end, one final newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.rstrip() + "\n"


class Source:
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


def split_lines(text: str) -> list[str]:
    """Lines of ``text`` with their ``\n`` (unlike ``str.splitlines``, form
    feeds and other Unicode line breaks do not split)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def splice_text(text: str, edits: Iterable[tuple[int, int, str]]) -> str:
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
class Function:
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


def functions_in(tree: ast.Module) -> list[Function]:
    """Module-level functions and methods (classes searched recursively)."""
    found: list[Function] = []

    def visit(body: list[ast.stmt], cls: ast.ClassDef | None) -> None:
        for stmt in body:
            if isinstance(stmt, FuncNode):
                found.append(Function(stmt, cls, body))
            elif isinstance(stmt, ast.ClassDef):
                visit(stmt.body, stmt)

    visit(tree.body, None)
    return found


def has_docstring(node: ast.AST) -> bool:
    body = getattr(node, "body", [])
    return bool(body) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str)


def stmt_start_line(stmt: ast.stmt) -> int:
    """First line of a statement including its decorators."""
    decorators = getattr(stmt, "decorator_list", [])
    return min([stmt.lineno] + [d.lineno for d in decorators])


def all_args(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    extra = [x for x in (a.vararg, a.kwarg) if x is not None]
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *extra]


def user_args(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    """Parameters other than ``self``/``cls``."""
    return [a for a in all_args(fn) if a.arg not in ("self", "cls")]


def walk_own(node: ast.AST) -> Iterator[ast.AST]:
    """Like ``ast.walk`` but does not enter nested functions, lambdas or classes."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        yield child
        if not isinstance(child, (*FuncNode, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(child))


def returns_value(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.Return) and n.value is not None for n in walk_own(fn))


def is_generator(fn: ast.AST) -> bool:
    return any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in walk_own(fn))


def name_words(name: str) -> list[str]:
    """``_parseHeaderLine`` -> ``["parse", "header", "line"]``."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name.strip("_"))
    return [w.lower() for w in re.split(r"[_\s]+", spaced) if w]


def one_line(text: str, limit: int = 48) -> str:
    """Collapse whitespace and shorten ``text`` to at most ``limit`` chars."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def header_tokens(
    src: Source, fn: ast.FunctionDef | ast.AsyncFunctionDef
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


def body_insert_line(src: Source, fn: ast.FunctionDef | ast.AsyncFunctionDef, after_docstring: bool) -> int | None:
    """Line at which new statements can be inserted at the top of ``fn``'s body.

    With ``after_docstring`` the line after the docstring (if any).  None for
    one-line functions (body on the ``def`` line).
    """
    header = header_tokens(src, fn)
    if header is None:
        return None
    colon_row = header[1].start[0]
    first = fn.body[0]
    if stmt_start_line(first) <= colon_row:
        return None
    if after_docstring and has_docstring(fn):
        if len(fn.body) > 1 and fn.body[1].lineno == first.end_lineno:
            return None
        return first.end_lineno + 1
    return colon_row + 1


def body_top_splices(src: Source, fns: list[Function], after_docstring: bool,
                     text_for: Callable[[Function, str], str]) -> list[tuple[int, int, str]]:
    """One splice per function of ``fns`` inserting ``text_for(fn, indent)`` at the top of its
    body (after its docstring with ``after_docstring``), ``indent`` being the body's. Every
    function must have a :func:`body_insert_line`."""
    out = []
    for f in fns:
        at = src.line_offset(body_insert_line(src, f.node, after_docstring))
        body = f.node.body[1:] if after_docstring and has_docstring(f.node) else f.node.body
        out.append((at, at, text_for(f, indent_of(src, body[0].lineno))))
    return out


def indent_of(src: Source, lineno: int) -> str:
    line = src.line(lineno)
    return line[: len(line) - len(line.lstrip())]


def module_has_import(tree: ast.Module, module: str, name: str | None = None) -> bool:
    """Whether a top-level statement imports ``module`` (or ``name`` from it)."""
    for stmt in tree.body:
        if name is None and isinstance(stmt, ast.Import):
            if any(a.name == module and a.asname is None for a in stmt.names):
                return True
        if name is not None and isinstance(stmt, ast.ImportFrom) and stmt.module == module:
            if any(a.name == name and a.asname is None for a in stmt.names):
                return True
    return False


def module_assigns(tree: ast.Module, name: str) -> bool:
    return any(
        isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
        for stmt in tree.body
    )


def prelude_edit(src: Source, imports: list[str], definitions: list[str]) -> tuple[int, int, str] | None:
    """Splice adding import lines and module-level definitions near the top.

    They go after the last top-level import before the first ``def``/``class``,
    else after the module docstring, else before the first statement.
    """
    if not imports and not definitions:
        return None
    body = src.tree.body
    last_doc = body[0] if has_docstring(src.tree) else None
    last_import = None
    for stmt in body:
        if isinstance(stmt, (*FuncNode, ast.ClassDef)):
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
    at = src.line_offset(stmt_start_line(body[0])) if body else len(src.text)
    return at, at, (block + defs).lstrip("\n") + "\n\n"


def arg_defaults(fn: ast.AST) -> dict[int, ast.AST]:
    """``id(arg) -> default expression`` for parameters that have one."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    out = {id(arg): d for arg, d in zip(positional[len(positional) - len(a.defaults):], a.defaults)}
    out.update({id(arg): d for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    return out


# ==========================================================================
# Edits and the functions they target
# ==========================================================================


@dataclass(frozen=True)
class CodeEdit:
    """One applied edit: its kind, the instruction an agent would get, the result."""

    kind: str
    instruction: str
    source: str
    details: dict = field(default_factory=dict)


def pick_functions(fns: list[Function], rng: random.Random, max_all: int = 4) -> tuple[list[Function], str]:
    """One function, or all of them when few; with a phrase naming them."""
    if len(fns) > 1 and len(fns) <= max_all and rng.random() < 0.5:
        return fns, "every function" if all(f.cls is None for f in fns) else "every function and method"
    fn = rng.choice(fns)
    return [fn], f"the {fn.kind} `{fn.qualname}`"


def target_functions(src: Source, target: str | None) -> list[Function]:
    fns = functions_in(src.tree)
    return [f for f in fns if f.node.name == target] if target else fns
