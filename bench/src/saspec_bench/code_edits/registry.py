"""The edit-kind registry: ``@edit_kind(name)`` registers an edit function,
:func:`apply_edit` runs one by name and checks its result."""

from __future__ import annotations

import ast
import random
from typing import Callable

from .source import CodeEdit, Source

#: An edit kind: ``(source, rng, target function name or None) -> CodeEdit | None``.
_EditFn = Callable[[Source, random.Random, "str | None"], "CodeEdit | None"]

_EDITS: dict[str, _EditFn] = {}
_VERIFIERS: dict[str, Callable[[CodeEdit], bool]] = {}


def edit_kind(name: str, verify: Callable[[CodeEdit], bool] | None = None) -> Callable[[_EditFn], _EditFn]:
    """Register the decorated function as edit kind ``name``.

    ``verify(edit)``, if given, runs on every result that parses; False rejects it.
    """

    def register(fn: _EditFn) -> _EditFn:
        if name in _EDITS:
            raise ValueError(f"edit kind {name!r} is registered twice")
        _EDITS[name] = fn
        if verify is not None:
            _VERIFIERS[name] = verify
        return fn

    return register


def fix_order(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Put the registry in the order of ``kinds`` (every registered kind, once) and return it."""
    if sorted(kinds) != sorted(_EDITS):
        raise RuntimeError(f"edit kinds {sorted(kinds)} differ from the registered {sorted(_EDITS)}")
    ordered = {kind: _EDITS[kind] for kind in kinds}
    _EDITS.clear()
    _EDITS.update(ordered)
    return kinds


def apply_edit(kind: str, source: str, rng: random.Random, target: str | None = None) -> CodeEdit | None:
    """Apply one edit of ``kind`` to Python ``source``.

    ``target`` restricts function-level edits to functions of that name.
    Returns None when the edit does not apply to this code; a returned edit
    always parses and differs from ``source``.  ``source`` must parse.
    """
    if kind not in _EDITS:
        raise ValueError(f"unknown edit kind {kind!r}; choose from {', '.join(_EDITS)}")
    src = Source(source)
    edit = _EDITS[kind](src, rng, target)
    if edit is None or edit.source == source:
        return None
    try:
        ast.parse(edit.source)
    except SyntaxError:
        return None
    verify = _VERIFIERS.get(kind)
    if verify is not None and not verify(edit):
        return None
    return edit
