"""What a bench command leaves under ``--out``: ``results.json`` (its info and every run, rewritten as runs
finish, so a stopped run keeps what it measured) and ``results.md`` (the report, also printed); and each output
compared with plain decoding's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence


def save(out: Path, info: dict[str, Any], **results: Any) -> None:
    """Write ``results.json``: ``{"info": info, **results}``."""
    (out / "results.json").write_text(json.dumps({"info": info, **results}, indent=1))


def publish(out: Path, info: dict[str, Any], report: str, **results: Any) -> int:
    """Write ``results.json`` and the report to ``results.md``, print the report; returns 0 (the exit code)."""
    save(out, info, **results)
    (out / "results.md").write_text(report)
    print(report)
    return 0


def mark_identity(runs: list[dict[str, Any]], key: Sequence[str] = ("id",)) -> None:
    """Set ``same_as_plain`` and ``first_diff`` (the first position that differs from plain's output, or None)
    on every run: its ``tokens`` against those of the ``plain`` run with the same ``key`` fields."""
    plain = {tuple(r[k] for k in key): r["tokens"] for r in runs if r["method"] == "plain"}
    for r in runs:
        ref = plain.get(tuple(r[k] for k in key))
        r["same_as_plain"] = None if ref is None else r["tokens"] == ref
        r["first_diff"] = None
        if ref is not None and r["tokens"] != ref:
            n = min(len(ref), len(r["tokens"]))
            r["first_diff"] = next((i for i in range(n) if ref[i] != r["tokens"][i]), n)
