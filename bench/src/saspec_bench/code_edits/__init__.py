"""Code edits done the way a coding agent's output does them: precise, through
``ast`` and ``tokenize``, so the untouched text stays byte-identical.

``apply_edit(kind, source, rng)`` applies one edit kind and returns a
``CodeEdit`` with the instruction text, or None when the kind does not apply
to that source. The workloads in ``workloads`` turn these into (prompt, output)
traces.

Where things are:

* ``source``: the source model (``Source``: text, AST, tokens, offsets),
  ``splice_text``, AST queries, module-level splices, ``CodeEdit``.
* ``registry``: ``@edit_kind(name)`` and ``apply_edit``.
* ``renaming``: ``rename`` (a parameter, local variable or function).
* ``documenting``: ``type_hints``, ``docstring``, ``add_comments``.
* ``instrumenting``: ``try_except``, ``log_entry``, ``add_validation``.
* ``restructuring``: ``delete_function``, ``reorder_functions``,
  ``change_constant``, ``loop_to_comprehension``.
* ``selection``: the code edited: stdlib files, their code units, a unit's
  edits in sequence.

A new kind is a function ``(src, rng, target) -> CodeEdit | None`` decorated
with ``@edit_kind("name")`` in one of those modules, and its name appended to
``EDIT_KINDS``.
"""

from __future__ import annotations

from . import documenting, instrumenting, renaming, restructuring  # noqa: F401  (they register the kinds)
from .registry import apply_edit, edit_kind, fix_order
from .selection import code_units, edit_unit, read_python, stdlib_python_files
from .source import CodeEdit, normalize_source

__all__ = [
    "CodeEdit",
    "apply_edit",
    "code_units",
    "edit_kind",
    "edit_unit",
    "normalize_source",
    "read_python",
    "stdlib_python_files",
    "EDIT_KINDS",
    "CODE_EDIT_KINDS",
    "HUMANEVAL_EDIT_KINDS",
]

#: Every edit kind :func:`apply_edit` knows; the registry is kept in this order.
EDIT_KINDS: tuple[str, ...] = fix_order((
    "rename", "type_hints", "docstring", "try_except", "log_entry", "delete_function",
    "reorder_functions", "change_constant", "add_comments", "add_validation", "loop_to_comprehension",
))
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
