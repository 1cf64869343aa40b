"""Workloads whose requests repeat each other: the prompts a cross-request pool is measured on.

Each builder returns prompts for ``saspec record-traces --prompts`` (``{"id",
"workload", "prompt_ids", "max_new_tokens", "meta"}``), in *arrival order*:
request i may draft from the outputs of requests 0..i-1, as a server's pool
would. All three are drawn from the CPython standard library, so they need no
data package:

* ``tests-for``: one instruction over many inputs ("write pytest tests for this
  function"), each prompt a different stdlib function. Outputs share the
  skeleton (imports, ``def test_...``, ``assert ... ==``), not the content.
* ``json-extract``: structured output over many inputs: the same JSON schema
  filled in from a different function's signature and docstring each time.
* ``agent-edit``: one file edited over ``turns`` user turns, each request the
  conversation so far (earlier versions in the context, as an agent's), the
  output the whole file after that turn's edit.

``cross_request_prompts`` is what ``saspec record-traces --cross-requests``
records into ``CROSS_REQUESTS_PATH``.
"""

from __future__ import annotations

import ast
import os
import random
import sysconfig
from typing import Any, Callable

from .code_edits import edit_unit, read_python, stdlib_python_files
from .code_edits.source import functions_in
from .workloads import chat_prompt

WORKLOADS = ("json-extract", "agent-edit", "tests-for")  # in recording order
TESTS_MAX_NEW = 128  # tests are not copies: each output token costs about one 1.5B forward to record
TESTS_COUNT = 20
JSON_COUNT = 40
EDIT_TURNS = 6
JSON_MAX_NEW = 160
EDIT_MAX_NEW = 900

_TESTS_ASK = ("Write pytest tests for the following function from the Python standard library module `{module}`. "
              "Import it from the module, cover normal use and one edge case, and reply with the test code only.")
_JSON_ASK = ("Extract the following fields from this function and reply with one JSON object only, no prose:\n"
             '{"name": str, "module": str, "parameters": [{"name": str, "default": str or null}], '
             '"returns": str or null, "raises": [str], "summary": str}}')


def _functions(root: str, rng: random.Random, min_lines: int, max_lines: int):
    """Public module-level functions with a docstring, as ``(module, name, source)``, shuffled."""
    files = list(stdlib_python_files(root))
    rng.shuffle(files)
    for rel in files:
        parsed = read_python(os.path.join(root, rel))
        if parsed is None:
            continue
        text, tree = parsed
        lines = text.splitlines(keepends=True)
        module = rel.removesuffix(".py").replace(os.sep, ".").removesuffix(".__init__")
        for fn in functions_in(tree):
            node = fn.node
            if fn.cls is not None or node.name.startswith("_") or ast.get_docstring(node) is None:
                continue
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            if min_lines <= node.end_lineno - start + 1 <= max_lines:
                yield module, node.name, "".join(lines[start - 1: node.end_lineno])
                break  # one function per module: the inputs differ


def _prompt(tok: Any, workload: str, i: int, key: str, text: str, max_new: int, meta: dict) -> dict[str, Any]:
    return {"id": f"{workload}:{i:02d}:{key}", "workload": workload, "prompt_ids": tok.encode(text),
            "max_new_tokens": max_new, "meta": {**meta, "arrival": i}}


def _one_task(tok: Any, workload: str, n: int, rng: random.Random, root: str | None, max_lines: int, max_new: int,
              ask: Callable[[str, str], str]) -> list[dict[str, Any]]:
    """``n`` requests of ``workload``: ``ask(module, source)`` for ``n`` different stdlib
    functions of 5 to ``max_lines`` lines, picked by ``rng``."""
    root = root or sysconfig.get_paths()["stdlib"]
    out: list[dict[str, Any]] = []
    for module, name, src in _functions(root, rng, 5, max_lines):
        if len(out) == n:
            break
        out.append(_prompt(tok, workload, len(out), f"{module}.{name}", chat_prompt([("user", ask(module, src))]),
                           max_new, {"source": f"stdlib:{module}", "unit": name}))
    return out


def build_tests_for(tok: Any, n: int = 40, seed: int = 0, root: str | None = None) -> list[dict[str, Any]]:
    """``n`` requests: pytest tests for ``n`` different stdlib functions (5-40 lines each)."""
    return _one_task(tok, "tests-for", n, random.Random(f"tests:{seed}"), root, 40, TESTS_MAX_NEW,
                     lambda module, src: _TESTS_ASK.format(module=module) + f"\n\n```python\n{src}```")


def build_json_extract(tok: Any, n: int = 40, seed: int = 0, root: str | None = None) -> list[dict[str, Any]]:
    """``n`` requests: one JSON schema filled from ``n`` different stdlib functions (5-60 lines)."""
    return _one_task(tok, "json-extract", n, random.Random(f"json:{seed}"), root, 60, JSON_MAX_NEW,
                     lambda module, src: f"{_JSON_ASK}\n\nModule `{module}`:\n\n```python\n{src}```")


def build_agent_edit(tok: Any, turns: int = 6, seed: int = 0, root: str | None = None,
                     min_tokens: int = 300, max_tokens: int = 700) -> list[dict[str, Any]]:
    """One conversation editing one stdlib module over ``turns`` user turns: request t is the
    conversation up to turn t (earlier answers: the reference versions), its output the file
    after edit t."""
    root = root or sysconfig.get_paths()["stdlib"]
    rng = random.Random(f"agent:{seed}")
    files = list(stdlib_python_files(root))
    rng.shuffle(files)
    kinds = ("type_hints", "docstring", "add_comments", "try_except", "log_entry", "add_validation", "rename",
             "change_constant")
    for rel in files:
        parsed = read_python(os.path.join(root, rel))
        if parsed is None:
            continue
        code = parsed[0]
        if not min_tokens <= len(tok.encode(code)) <= max_tokens:
            continue
        edits = edit_unit(code, rng.sample(kinds, len(kinds)), rng, turns)
        if len(edits) < turns:
            continue
        where = rel.replace(os.sep, "/")
        reply = "Reply with the complete updated code only, without explanations."
        messages = [("user", f"{edits[0].instruction}\n\nHere is the code (from `{where}`):\n\n```python\n{code}```"
                             f"\n\n{reply}")]
        out = []
        for t, edit in enumerate(edits):
            if t:
                messages += [("assistant", f"```python\n{edits[t - 1].source}```"), ("user", f"{edit.instruction}\n\n{reply}")]
            out.append(_prompt(tok, "agent-edit", t, f"{where}:turn{t + 1}", chat_prompt(list(messages)),
                               EDIT_MAX_NEW, {"source": f"stdlib:{where}", "edit": edit.kind, "turn": t + 1}))
        return out
    raise ValueError(f"no stdlib module of {min_tokens}-{max_tokens} tokens takes {turns} edits")


def cross_request_prompts(tok: Any, seed: int = 0) -> list[dict[str, Any]]:
    """All three workloads, each in its arrival order (what ``record-traces --cross-requests`` records)."""
    return (build_json_extract(tok, JSON_COUNT, seed) + build_agent_edit(tok, EDIT_TURNS, seed)
            + build_tests_for(tok, TESTS_COUNT, seed))
