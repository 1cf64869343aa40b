"""`saspec record-traces`: real greedy target outputs with a draft model's runs, as shipped data.

For each prompt (code edits on the standard library, HumanEval rewrites and
ShareGPT chat turns, from ``workloads``), the target model generates greedily
with the package's own exact speculative loop (``generate.speculative_generate``
with the SA drafter: the output is token-identical to plain greedy decoding,
and copy-heavy outputs take a fraction of the forwards). Then one
teacher-forced pass of the draft model over prompt + output gives its
accepted run at every output position (``draft_runs``). Each finished trace is
appended at once to ``OUT.partial.jsonl`` (one JSON line, flushed), so an
interrupted run resumes where it stopped (traces are keyed by their prompt id
and skipped when present); when every prompt is done the traces are written,
in prompt order, to ``OUT`` (gzip JSONL in the trace format of
``workloads.save_traces``) and the partial file is removed.

``meta`` of each trace: ``id``, ``workload`` (``code-edits``,
``humaneval-edit`` or ``chat``: ``saspec simulate`` splits the file into one
workload per value, named ``real:<workload>``), the prompt's own meta, the
target's forwards and wall time.

The defaults record 80 prompts; chat outputs are capped at ``CHAT_MAX_NEW``
tokens, since the SA loop gains little on them and they cost the most to
record. How long a recording takes: BENCHMARKS.md, "Draft quality".
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..datafiles import CROSS_REQUESTS_PATH, REAL_OUTPUTS_PATH
from ..prompts import WORKLOAD_KEY
from ..lm import add_model_arguments, load_models
from ..options import CliError, comma_list, nonnegative_int, output_file, positive_int
from .. import workloads as wl
from ..cross_requests import cross_request_prompts
from ..draft_runs import compute_draft_runs
from ..models import EOS_IDS
from ..tokenizers import get_tokenizer
from ..workloads import Trace, json_lines, load_traces, trace_json

DEFAULT_COUNTS = {"code-edits": 40, "humaneval-edit": 20, "chat": 20}
CODE_MAX_NEW = 1200
CHAT_MAX_NEW = 256


# -- prompts -------------------------------------------------------------------------


def default_prompts(tok: Any, counts: dict[str, int] = DEFAULT_COUNTS, seed: int = 0,
                    code_max_tokens: int = 800, chat_max_prompt: int = 1024) -> list[dict[str, Any]]:
    """The recording's prompts: ``{"id", "workload", "prompt_ids", "max_new_tokens", "meta"}``.

    Code edits: stdlib units of at most ``code_max_tokens`` tokens; HumanEval
    rewrites; chat: ShareGPT turns with prompts of at most ``chat_max_prompt``
    tokens (short prompts keep the CPU prefills cheap). ``max_new_tokens``:
    code, 1.5x the reference output + 64 (at most ``CODE_MAX_NEW``); chat,
    ``CHAT_MAX_NEW``. A workload whose data is not installed is skipped with
    a message. Deterministic for a given seed.
    """
    out: list[dict[str, Any]] = []

    def add(name: str, traces, max_new: Callable[[Any], int]) -> None:
        for t in traces[: counts.get(name, 0)]:
            key = ":".join(str(t.meta.get(k)) for k in ("source", "unit", "edit", "turn") if k in t.meta)
            out.append({"id": f"{name}:{key}", "workload": name, "prompt_ids": t.prompt.tolist(),
                        "max_new_tokens": max_new(t), "meta": dict(t.meta)})

    def code_new(t) -> int:
        return min(CODE_MAX_NEW, int(1.5 * t.output.size) + 64)

    builders = {"code-edits": lambda n: wl.build_code_edits(tok, n, seed, max_tokens=code_max_tokens),
                "humaneval-edit": lambda n: wl.build_humaneval_edit(tok, n, seed),
                "chat": lambda n: wl.build_sharegpt(tok, n, seed, max_prompt_tokens=chat_max_prompt)}
    for name, build in builders.items():
        n = counts.get(name, 0)
        if n <= 0:
            continue
        try:
            w = build(n)
        except wl.WorkloadUnavailable as exc:
            print(f"skipping {name}: {exc}", file=sys.stderr)
            continue
        add(name, w.traces, code_new if name != "chat" else (lambda t: CHAT_MAX_NEW))
    ids = [p["id"] for p in out]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate prompt ids")
    return out


def read_prompts(path: str | Path) -> list[dict[str, Any]]:
    """Prompts from a JSONL file: ``{"id": str, "workload": str, "prompt_ids": [int],
    "max_new_tokens": int >= 1, "meta": {}}`` per line (``meta`` optional).
    ``ValueError`` naming ``path:line`` for a malformed line or a repeated id."""
    out, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for where, obj in json_lines(f, path, ValueError):
            ok = (isinstance(obj, dict) and isinstance(obj.get("id"), str) and isinstance(obj.get("workload"), str)
                  and isinstance(obj.get("prompt_ids"), list) and obj["prompt_ids"]
                  and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in obj["prompt_ids"])
                  and isinstance(obj.get("max_new_tokens"), int) and obj["max_new_tokens"] >= 1
                  and isinstance(obj.get("meta", {}), dict))
            if not ok:
                raise ValueError(f"{where}: expected {{id: str, workload: str, prompt_ids: [int >= 0] (non-empty), "
                                 f"max_new_tokens: int >= 1, meta: object}}")
            if obj["id"] in seen:
                raise ValueError(f"{where}: repeated id {obj['id']!r}")
            seen.add(obj["id"])
            out.append({"meta": {}, **obj})
    return out


# -- recording -------------------------------------------------------------------------


def partial_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".gz").removesuffix(".jsonl") + ".partial.jsonl")


def _read_lines(path: Path) -> dict[str, dict]:
    """Recorded trace objects by id; a truncated last line (interrupted write) is dropped."""
    done: dict[str, dict] = {}
    if not path.is_file():
        return done
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            rid = obj.get("meta", {}).get("id") if isinstance(obj, dict) else None
            if isinstance(rid, str):
                done[rid] = obj
    return done


def record(prompts: Sequence[dict[str, Any]], target: Any, draft: Any, out: str | Path, *, target_name: str,
           draft_name: str, eos_ids: Sequence[int], max_run: int = 64, chunk: int = 256, k: int = 8,
           per_match: float = 2.0, progress: bool = True) -> dict[str, Any]:
    """Record every prompt not yet in ``out`` (or its partial file) and write ``out``.

    ``target``, ``draft``: HF causal LMs sharing a vocabulary; ``prompts`` as
    from :func:`default_prompts`. The target's greedy output comes from
    ``speculative_generate`` with an SA drafter (``k``, ``per_match``), which
    is token-identical to plain greedy. Returns ``{"recorded", "skipped",
    "traces", "output_tokens", "seconds"}``.
    """
    from tqdm import tqdm

    from ..loop import make_drafter, speculative_generate
    out = Path(out)
    if not str(out).endswith(".jsonl.gz"):
        raise ValueError(f"the output must end in .jsonl.gz, got {out}")
    part = partial_path(out)
    done = {**_read_lines(out), **_read_lines(part)}
    todo = [p for p in prompts if p["id"] not in done]
    skipped = len(prompts) - len(todo)
    out.parent.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    new_tokens = 0
    with open(part, "a", encoding="utf-8") as f, tqdm(total=len(prompts), initial=skipped, unit="trace",
                                                      desc="recording", disable=not progress) as bar:
        for p in todo:
            bar.set_postfix_str(f"{p['id'][:40]} ({new_tokens} new tokens)")
            t0 = time.perf_counter()
            res = speculative_generate(target, p["prompt_ids"], make_drafter("sa", k=k, per_match=per_match),
                                       p["max_new_tokens"], eos_ids)
            gen_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            runs = compute_draft_runs(draft, p["prompt_ids"], res.tokens, draft_name, max_run, chunk)
            meta = {**p.get("meta", {}), "id": p["id"], WORKLOAD_KEY: p["workload"],
                    "target_forwards": res.stats.target_forwards, "generate_s": round(gen_s, 3),
                    "draft_runs_s": round(time.perf_counter() - t0, 3),
                    "hit_max_new_tokens": len(res.tokens) >= p["max_new_tokens"]}
            trace = Trace(p["prompt_ids"], res.tokens, meta, runs)
            obj = trace_json(trace, target_name)
            f.write(json.dumps(obj) + "\n")
            f.flush()
            done[p["id"]] = obj
            new_tokens += len(res.tokens)
            bar.update(1)
    # every prompt done (in this or an earlier run): write OUT in prompt order, drop the partial file
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as g:
        for p in prompts:
            g.write(json.dumps(done[p["id"]]) + "\n")
    os.replace(tmp, out)
    part.unlink(missing_ok=True)
    w = load_traces(out)  # validates what was written
    return {"recorded": len(todo), "skipped": skipped, "traces": len(w.traces),
            "output_tokens": int(sum(t.output.size for t in w.traces)), "seconds": time.perf_counter() - t_all}




# -- the command -------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``saspec record-traces``' options."""
    p.add_argument("--out", default=None, type=output_file,
                   help=f"the data file to write (.jsonl.gz; default {REAL_OUTPUTS_PATH.name}, or "
                        "cross_requests.jsonl.gz with --cross-requests)")
    add_model_arguments(p)
    p.add_argument("--prompts", default=None,
                   help="JSONL prompts file ({id, workload, prompt_ids, max_new_tokens, meta} per line) instead of "
                        "the built-in code-edit / HumanEval-edit / chat prompts")
    for name, n in DEFAULT_COUNTS.items():
        p.add_argument(f"--{name}", type=nonnegative_int, default=n, dest=name.replace("-", "_"),
                       help=f"built-in {name} prompts")
    p.add_argument("--cross-requests", action="store_true",
                   help="record the workloads that repeat across requests (tests-for, json-extract, agent-edit; "
                        "see saspec_bench/cross_requests.py) instead of the built-in ones")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="workload builders' seed")
    p.add_argument("--eos", type=comma_list(nonnegative_int, what="token id"), default=None,
                   help="end-of-sequence ids (default: the Qwen ids <|im_end|>, <|endoftext|>)")
    p.add_argument("--max-run", type=positive_int, default=64, help="cap of the stored draft-model runs (<= 255)")
    p.add_argument("--chunk", type=positive_int, default=256, help="tokens per teacher-forcing forward")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    if args.out is None:
        args.out = str(CROSS_REQUESTS_PATH if args.cross_requests else REAL_OUTPUTS_PATH)
    if args.max_run > 255:
        raise CliError(f"--max-run must be <= 255, got {args.max_run}")
    if not str(args.out).endswith(".jsonl.gz"):
        raise CliError(f"--out must end in .jsonl.gz, got {args.out}")
    if args.prompts is not None and args.cross_requests:
        raise CliError("--prompts and --cross-requests exclude each other")
    if args.cross_requests:
        prompts = cross_request_prompts(get_tokenizer(), seed=args.seed)
    elif args.prompts is not None:
        try:
            prompts = read_prompts(args.prompts)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    else:
        counts = {name: getattr(args, name.replace("-", "_")) for name in DEFAULT_COUNTS}
        prompts = default_prompts(get_tokenizer(), counts, args.seed)
    if not prompts:
        raise CliError("no prompts to record")
    import torch

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    target, draft, tname, dname, _ = load_models(args)
    vocab = min(target.config.vocab_size, draft.config.vocab_size)
    bad = next((p["id"] for p in prompts if max(p["prompt_ids"]) >= vocab), None)
    if bad is not None:
        raise CliError(f"prompt {bad!r} has token ids outside the models' vocabulary of {vocab}")
    eos = tuple(args.eos) if args.eos is not None else EOS_IDS
    print(f"{len(prompts)} prompts; target {tname}, draft model {dname} ({args.dtype}); writing {args.out}",
          file=sys.stderr)
    res = record(prompts, target, draft, args.out, target_name=tname, draft_name=dname, eos_ids=eos,
                 max_run=args.max_run, chunk=args.chunk, progress=not args.quiet)
    print(f"recorded {res['recorded']} traces, skipped {res['skipped']} already recorded; {args.out}: "
          f"{res['traces']} traces, {res['output_tokens']} output tokens ({res['seconds']:.0f} s)")
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``record-traces`` on the ``saspec`` parser (torch loads only when it runs)."""
    p = sub.add_parser("record-traces", help="record real greedy target outputs + draft-model runs (shipped data)",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    add_arguments(p)
    p.set_defaults(func=main)
