"""The prompts the end-to-end benchmarks send to a model: code edits given in full,
multi-turn edits and free-form questions (``bench_prompts``), and recorded
cross-request workloads in arrival order (``cross_request_prompts``). Each prompt
is ``{"id", "kind", "prompt_ids", "meta"}`` (``max_new`` where the recording fixes it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import workloads as wl
from .datafiles import CROSS_REQUESTS_PATH
from .options import CliError
from .workloads import Workload, load_traces

WORKLOAD_KEY = "workload"  # the meta field a recorded trace names its workload in

FREE_FORM_PROMPTS = (
    "Explain how a hash table works, including how collisions are handled and why lookups are fast "
    "on average. Use plain prose, no code.",
    "Write a short story (about 300 words) about a lighthouse keeper who finds a message in a bottle.",
    "What are the main differences between processes and threads in an operating system? "
    "Explain with examples.",
    "Summarize the causes and consequences of the French Revolution in a few paragraphs.",
    "I am planning a week-long trip to Japan in spring. Suggest an itinerary with cities, sights and "
    "how to travel between them.",
    "Explain to a beginner what gradient descent is and why the learning rate matters. No formulas.",
    "Write a polite email to a landlord asking for a broken heater to be repaired this week.",
    "Compare renting and buying a home: the financial and practical trade-offs, in plain prose.",
)


def bench_prompts(tok, n_code: int, n_free: int, seed: int, n_multi: int = 0) -> list[dict[str, Any]]:
    """The bench's prompts: ``{"id", "kind", "prompt_ids", "meta"}``.

    Code edits are the simulator's workloads (stdlib function/module edits
    and HumanEval rewrites, Qwen chat format) restricted to references of
    150-400 tokens; free-form prompts are fixed questions in the chat format;
    ``n_multi`` multi-turn edits (kind ``multi-turn-edit``) are stdlib edits
    asked in a second user turn after the assistant's reply to a first
    (``workloads.build_multiturn_edits``), references of 150-400 tokens.
    """
    def picked(w: Any, n: int, kind: str, name: Any) -> list[dict[str, Any]]:
        """The first ``n`` traces of ``w`` with a 150-400 token reference, as prompts."""
        picks = [t for t in w.traces if 150 <= t.output.size <= 400][:n]
        return [{"id": name(t), "kind": kind, "prompt_ids": t.prompt.tolist(),
                 "meta": {**t.meta, "reference_tokens": int(t.output.size)}} for t in picks]

    def stdlib_name(t: Any) -> str:
        return f"{t.meta['source'].split(':', 1)[1]}:{t.meta['edit']}"

    out: list[dict[str, Any]] = []
    n_std, n_he = (n_code + 1) // 2, n_code // 2
    if n_std:
        out += picked(wl.build_code_edits(tok, 8 * n_std, seed, min_tokens=150, max_tokens=400), n_std, "code-edit",
                      lambda t: "stdlib:" + stdlib_name(t))
    if n_he:
        out += picked(wl.build_humaneval_edit(tok, 40, seed), n_he, "code-edit",
                      lambda t: f"{t.meta['source']}:{t.meta['edit']}")
    if n_multi:
        out += picked(wl.build_multiturn_edits(tok, 8 * n_multi, seed, min_tokens=150, max_tokens=400), n_multi,
                      "multi-turn-edit", lambda t: "multiturn:" + stdlib_name(t))
    for i, q in enumerate(FREE_FORM_PROMPTS[:n_free]):
        out.append({"id": f"free-{i}", "kind": "free-form", "prompt_ids": tok.encode(wl.chat_prompt([("user", q)])),
                    "meta": {"question": q}})
    return out


def split_workloads(path: str | Path) -> dict[str, Any]:
    """The recorded file as workloads ``real:<workload>`` (by ``meta["workload"]``, in first-seen order)."""
    w = load_traces(path)
    groups: dict[str, list] = {}
    for t in w.traces:
        groups.setdefault(f"real:{t.meta.get(WORKLOAD_KEY, 'unknown')}", []).append(t)
    return {name: Workload(name, traces, {**w.meta, "builder": "recorded"}) for name, traces in groups.items()}


def cross_request_prompts(spec: str, path: str | Path = CROSS_REQUESTS_PATH) -> list[dict[str, Any]]:
    """``WORKLOAD[:N]``: the first N recorded traces of that cross-request workload as bench
    prompts (kind ``cross:WORKLOAD``, each capped at its recorded output's length)."""
    name, _, n = spec.partition(":")
    if not Path(path).is_file():
        raise CliError(f"no recorded cross-request workloads ({path}; run `saspec record-traces "
                       "--cross-requests`)")
    found = split_workloads(path)
    w = found.get(f"real:{name}")
    if w is None:
        raise CliError(f"unknown cross-request workload {name!r}; recorded: "
                       + ", ".join(k.removeprefix("real:") for k in found))
    if n and (not n.isdigit() or int(n) < 1):
        raise CliError(f"--cross-requests {spec!r}: N must be an int >= 1")
    traces = w.traces[: int(n)] if n else w.traces
    return [{"id": f"{name}:{i:02d}", "kind": f"cross:{name}", "prompt_ids": t.prompt.tolist(),
             "max_new": int(t.output.size)} for i, t in enumerate(traces)]
