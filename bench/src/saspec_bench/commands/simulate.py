"""`saspec simulate`: how many tokens per target forward pass each drafter and
hybrid policy gives, on real tokenized workloads (the walks are :mod:`saspec_bench.acceptance`'s).

The command prints a summary per workload (:func:`format_first_screen`) and
writes every table to ``OUT/tables.md``, the results to ``OUT/results.json``
and the plots to ``OUT``; its last line says where.
"""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from pathlib import Path

import numpy as np
from saspec import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)

from saspec.build import OCCURRENCES
from ..options import CliError, comma_list, int_in, nonnegative_int, output_file, positive_int, probability
from ..positions import Flat
from ..realsim import SA_WIDTH, speed_section

from ..acceptance import (DEFAULT_P, DEFAULT_THRESHOLD, DEFAULT_THRESHOLDS, default_hybrid_policy, default_p, format_results, simulate_workload)
from .. import workloads as wl
from ..datafiles import CROSS_REQUESTS_PATH, REAL_OUTPUTS_PATH
from ..pool_sim import format_pool_table, pool_comparison
from ..prompts import split_workloads
from ..tokenizers import get_tokenizer


# -- the command -----------------------------------------------------------------

DEFAULT_SIZES = {"code-edits": 200, "humaneval": 164, "humaneval-edit": 164, "chat": 300}


EPILOG = """\
recorded traces (--workloads FILE.jsonl, or FILE.jsonl.gz gzip-compressed):
  UTF-8 JSON Lines, one trace per line (blank lines skipped), each an object:
    prompt_ids  list of int   prompt token ids, each in [0, 2**31) (may be empty)
    output_ids  list of int   the fixed output the drafters are replayed against
                              (greedy target output), ids as above, non-empty
    model       string        optional: the model that produced the output
    meta        object        optional: free-form, kept with the trace
  Example line:
    {"prompt_ids": [9707, 11, 1879], "output_ids": [1879, 0, 151645], "model": "qwen2.5-coder-1.5b-instruct", "meta": {"id": "demo"}}
  The workload is named after the file, without .jsonl(.gz). workloads.save_traces
  writes this format (so does `saspec bench-e2e`, as OUT/traces.jsonl); a malformed
  line is reported as FILE:LINE.

The modeled neural drafter gets draft position i right with probability p[i]
given positions before it were right. Without --p the default profile
(%s) is cut to K or extended to K by repeating
its last value; an explicit --p needs at least K values (extra ones are ignored).
""" % ", ".join(map(str, DEFAULT_P))


TRACE_SUFFIXES = (".jsonl", ".jsonl.gz")


def _is_trace_file(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


REAL = "real"  # the recorded real outputs (saspec_bench/data/real_outputs.jsonl.gz, `saspec record-traces`)
CROSS = "cross"  # recorded workloads that repeat across requests (`saspec record-traces --cross-requests`)
DEFAULT_POOL_TOKENS = 1 << 20


def _recorded() -> dict[str, Path]:

    return {REAL: REAL_OUTPUTS_PATH, CROSS: CROSS_REQUESTS_PATH}


def default_workloads() -> tuple[str, ...]:
    """The built-in workloads, and ``real`` and ``cross`` when their data files exist."""
    return tuple(DEFAULT_SIZES) + tuple(name for name, path in _recorded().items() if path.is_file())


def _workload_name(text: str) -> str:
    if text in DEFAULT_SIZES or text in (REAL, CROSS):
        return text
    if not _is_trace_file(text):
        raise argparse.ArgumentTypeError(f"unknown workload {text!r}; choose from {', '.join(DEFAULT_SIZES)} "
                                         "or give a trace file ending in .jsonl (or .jsonl.gz)")
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such trace file: {text}")
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", type=comma_list(_workload_name, what="workload"), default=default_workloads(),
                   help="comma-separated built-in workloads and/or recorded trace files (.jsonl, format below)")
    p.add_argument("--size", type=positive_int, default=None,
                   help="traces per built-in workload (default: " + ", ".join(f"{k} {v}" for k, v in DEFAULT_SIZES.items())
                   + ")")
    p.add_argument("-k", "--k", type=int_in(1, SA_WIDTH), default=8,
                   help=f"draft tokens per step (K, at most {SA_WIDTH}: the cost model's tables stop there)")
    p.add_argument("--threshold", type=positive_int, default=DEFAULT_THRESHOLD,
                   help="hybrid rows: SA drafts when its match length >= T, else the neural drafter")
    p.add_argument("--thresholds", type=comma_list(positive_int, what="threshold"), default=DEFAULT_THRESHOLDS,
                   help="thresholds T (>= 1) to sweep, comma-separated")
    p.add_argument("--p", type=comma_list(probability, what="probability"), default=None,
                   help="modeled neural drafter: P(draft position i right | all before right), comma-separated, "
                        "each in [0, 1], at least K values (default: "
                        + ",".join(map(str, DEFAULT_P)) + ", extended to K by repeating the last value)")
    p.add_argument("--occurrences", type=comma_list(str, choices=tuple(OCCURRENCES), what="SA occurrence rule"),
                   default=tuple(OCCURRENCES), help="SA occurrence rules to compare")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the workload builders and neural draws")
    p.add_argument("--no-ngram", action="store_true", help="skip the n-gram baseline")
    p.add_argument("--pool-tokens", type=nonnegative_int, default=DEFAULT_POOL_TOKENS,
                   help="also replay each workload in arrival order with a cross-request pool of this many tokens "
                        "(outputs, and prompts + outputs) against none; 0 skips it")
    p.add_argument("--out", default="saspec-out", help="directory for plots and results.json")
    p.add_argument("--json", metavar="PATH", type=output_file,
                   help="write the results JSON here (default: OUT/results.json)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots")


def load_workloads(names: list[str], size: int | None, seed: int) -> dict[str, Flat]:
    """Build (or load) the named workloads; skip, with a message, those whose
    optional data is not installed.

    Raises ``FileNotFoundError`` for a missing trace file and
    ``workloads.TraceFormatError`` for a malformed, undecodable or empty one.
    """

    tok = None
    out = {}
    for name in names:
        if _is_trace_file(name):
            try:
                w = wl.load_traces(name)
            except (UnicodeDecodeError, EOFError, OSError) as exc:
                if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
                    raise
                raise wl.TraceFormatError(f"{name}: not a UTF-8 JSON Lines file ({exc})") from None
            if not w.traces:
                raise wl.TraceFormatError(f"{name}: no traces (the file has no non-blank line)")
            key = Path(name).name.removesuffix(".gz").removesuffix(".jsonl")
            if key in out or key in names:
                raise CliError(f"two workloads would be named {key!r} ({name} and another); rename the trace file")
            out[key] = Flat.of(w.traces)
            continue
        if name in (REAL, CROSS):
            path = _recorded()[name]
            if not path.is_file():
                how = "saspec record-traces" + (" --cross-requests" if name == CROSS else "")
                print(f"skipping workload {name!r}: no recorded data ({path}; run `{how}`)")
                continue
            for sub, w in split_workloads(path).items():
                out[sub] = Flat.of(w.traces)
            continue
        tok = tok or get_tokenizer()
        try:
            w = wl.build_workload(name, tok, size or DEFAULT_SIZES.get(name, 100), seed)
        except wl.WorkloadUnavailable as e:
            print(f"skipping workload {name!r}: {e}")
            continue
        if size is not None and len(w.traces) < size:
            print(f"workload {name!r}: {len(w.traces)} traces, all it has (--size asked for {size})")
        out[name] = Flat.of(w.traces)
    return out


def format_summary(results: dict[str, dict], threshold: int) -> str:
    """Per workload, the ratios the targets are stated in (same run)."""
    lines = ["| workload | hybrid T={t} / neural | adaptive / neural | tree / neural | best SA policy / first |".format(t=threshold),
             "|---|---|---|---|---|"]
    for name, res in results.items():
        al = {r["drafter"]: r["AL"] for r in res["rows"]}
        sa = {d[3:]: v for d, v in al.items() if d.startswith("sa:")}
        best = max(sa, key=sa.get) if sa else None
        ratio = f"{sa[best] / sa['first']:.3f}x ({best})" if best and "first" in sa else "-"
        def r(key):
            return f"{al[key] / al['neural']:.3f}x" if key in al else "-"
        lines.append(f"| {name} | {r(f'hybrid:T={threshold}')} | {r('hybrid:adaptive')} | {r(f'tree:T={threshold}')} | {ratio} |")
    return "\n".join(lines)


SCREEN_WIDTH = 110  # the first screen's prose lines wrap here


def _short(name: str) -> str:
    """A cost profile's name, or a speed-table column ``"<profile> B=<b>"``, without its parenthesis."""
    head, _, batch = name.rpartition(" B=")
    return f"{head.split(' (')[0]} B={batch}" if head else name.split(" (")[0]


def _draft_and_hybrid(by: dict, name: str, k: int, threshold: int, t_model: int, rule: str) -> tuple[dict, dict, bool]:
    """A workload's speed-table rows for the first screen: (draft model alone, hybrid, real?).
    With the real draft model's runs, the tuned hybrid (``t_model``, SA drafts up to 32 by
    ``rule``) against the draft model at K=8; else the modeled drafter's rows at ``k``."""
    if (name, "draft-model K=8") in by:
        return by[(name, "draft-model K=8")], by[(name, f"hybrid:draft-model T={t_model} K=8 SA<=32 {rule}")], True
    return by[(name, f"neural (modeled, free) K={k}")], by[(name, f"hybrid(modeled) T={threshold} K={k}")], False


def format_first_screen(results: dict[str, dict], speed: dict, k: int, threshold: int, policy: str) -> str:
    """What ``saspec simulate`` prints: per workload, SA against n-gram and the hybrid against
    the draft model alone (AL), and the hybrid's modeled tokens/s over the draft model alone
    and over no drafting per cost profile and batch. ``results``: :func:`simulate_workload`'s
    per workload; ``speed``: ``realsim.speed_section``'s data."""
    t_model = (speed.get("model_threshold") or {}).get("best", threshold)
    r, scale = speed["length_study"]["best"]
    rule = f"{r}:{scale:g}"
    by = {(row["workload"], row["drafter"]): row for row in speed["speed"]}
    cols = list(speed["speed"][0]["tok_s"])
    al = ["| workload | SA | n-gram | SA / n-gram | draft model | hybrid | hybrid / draft model |", "|---" * 7 + "|"]
    tok = ["| workload | " + " | ".join(_short(c) for c in cols) + " |", "|---" * (1 + len(cols)) + "|"]
    real_models = set()
    for name, res in results.items():
        rows = {row["drafter"]: row for row in res["rows"]}
        sa, ng = rows[f"sa:{policy}"]["AL"], rows.get("ngram", {}).get("AL")
        dm, hy, real = _draft_and_hybrid(by, name, k, threshold, t_model, rule)
        if real:
            real_models.add(rows["draft-model"]["note"])
        al.append(f"| {name} | {sa:.2f} | " + (f"{ng:.2f} | {sa / ng:.2f}x" if ng else "- | -")
                  + f" | {dm['AL']:.2f} {'real' if real else 'modeled'} | {hy['AL']:.2f} | {hy['AL'] / dm['AL']:.2f}x |")
        none = by[(name, "none")]["tok_s"]
        tok.append(f"| {name} | " + " | ".join(f"{hy['tok_s'][c] / dm['tok_s'][c]:.2f}x ({hy['tok_s'][c] / none[c]:.1f}x)"
                                                for c in cols) + " |")
    real = (f"the real one ({', '.join(sorted(real_models))}, teacher-forced runs) where a workload has its "
            f"runs (hybrid T={t_model}, SA drafts up to 32 by {rule}, K=8), else " if real_models else "")
    n = len(results)
    header = (f"saspec simulate: {n} workload{'s' * (n != 1)}, K={k}, SA policy {policy}. Hybrid: the SA's draft where "
              f"its match is >= T tokens, else the draft model's. The draft model is {real}the modeled neural "
              f"drafter (free drafts; hybrid T={threshold}, K={k}).")
    profiles = "; ".join(f"{_short(pr['name'])}: {pr['name']}, {pr['notes'].get('source', '')}"
                         for pr in speed["profiles"])
    return "\n".join([textwrap.fill(header, SCREEN_WIDTH), "", "Tokens per target forward (AL):", *al, "",
                      "Modeled tokens/s of the hybrid over the draft model alone (and over no drafting):", *tok,
                      textwrap.fill(f"Cost profiles: {profiles}.", SCREEN_WIDTH)])


TABLES_FILE = "tables.md"


def format_tables(first_screen: str, results: dict[str, dict], threshold: int, speed_text: str, timing: str,
                  pool_text: str = "") -> str:
    """``OUT/tables.md``: the first screen, then every table (each drafter and policy's AL,
    the ratios, the cost model's studies and speed table, the pool's table), then the run's timings."""
    return "\n\n".join([
        "# saspec simulate", first_screen,
        "## Every drafter and policy: tokens per target forward", format_results(results),
        "## Ratios: hybrid, adaptive and tree over the modeled neural drafter; the best SA policy over first",
        format_summary(results, threshold),
        "## The cost model: draft-length rules, the hybrid's threshold, modeled tokens/s", speed_text]
        + (["## Memory across requests", pool_text] if pool_text else []) + [timing]) + "\n"


# (marker, linestyle, marker size) per SA policy in the threshold plot: the
# policies' curves often coincide, so each is drawn differently and the later
# ones smaller, so that every curve stays visible where they overlap.
_POLICY_STYLES = (("o", "-", 9), ("s", "--", 7), ("^", "-.", 6), ("x", ":", 6), ("D", "-", 4), ("v", "--", 4))
_GROUP_COLORS = {"none": "0.6", "neural": "0.35", "ngram": "tab:purple", "sa": "tab:blue", "hybrid": "tab:green",
                 "tree": "tab:orange"}


def _grid(n: int):
    """Rows and columns for ``n`` small panels: at most two per row."""
    cols = min(n, 2)
    return (n + cols - 1) // cols, cols


def plot(results: dict[str, dict], out: Path, k: int | None = None, threshold: int | None = None) -> list[Path]:
    """Write three PNGs to ``out`` and return their paths:

    * ``al_vs_threshold.png``: per workload, the hybrid's AL against the
      threshold T for each SA policy (ticks at the swept T), with the neural
      drafter alone as reference;
    * ``al_by_policy.png``: per workload, every drafter/policy row's AL as
      labelled horizontal bars;
    * ``accepted_distribution.png``: per workload, the fraction of steps that
      accepted 1..K+1 tokens for the neural drafter, SA (first) and the
      adaptive hybrid.

    ``k`` and ``threshold`` only label the figures. One panel per workload,
    two per row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    def save(fig, name: str) -> Path:
        fig.savefig(out / name, dpi=100, bbox_inches="tight")
        plt.close(fig)
        return out / name

    kk = f"K={k}, " if k is not None else ""
    n = len(results)
    rows, cols = _grid(n)
    paths = []

    # 1. AL against the threshold
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.0 * rows), squeeze=False)
    for ax, (name, res) in zip(axes.flat, results.items()):
        neural = next(r["AL"] for r in res["rows"] if r["drafter"] == "neural")
        policies = list(res["sweep"])
        ts = sorted({t for pts in res["sweep"].values() for t, _ in pts})
        for j, policy in enumerate(policies):
            marker, ls, size = _POLICY_STYLES[j % len(_POLICY_STYLES)]
            pts = res["sweep"][policy]
            # a small horizontal offset per policy (on the log axis) keeps coinciding markers apart
            shift = 2 ** (0.05 * (j - (len(policies) - 1) / 2))
            ax.plot([t * shift for t, _ in pts], [a for _, a in pts], marker=marker, ls=ls, ms=size, lw=1.4,
                    mfc="none" if marker not in ("x",) else None, mew=1.4, label=f"hybrid, SA policy {policy}")
        ax.axhline(neural, color="0.4", ls=(0, (4, 3)), lw=1.2, label="neural drafter alone")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(ts))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(t) for t in ts])
        # how far apart the policies' curves are at most (relative), stated since they nearly coincide
        spread = max((max(a) - min(a)) / min(a) for a in zip(*([a for _, a in res["sweep"][q]] for q in policies)))
        ax.set_title(f"{name} (policies differ by at most {spread:.1%})" if len(policies) > 1 else name)
        ax.set_xlabel("threshold T (SA drafts when its match >= T)")
        ax.set_ylabel("tokens per target forward (AL)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), frameon=False,
               bbox_to_anchor=(0.5, -0.01))
    fig.suptitle(f"Hybrid drafting: AL against the threshold T ({kk}modeled neural drafter)", fontsize=13)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    paths.append(save(fig, "al_vs_threshold.png"))

    # 2. AL by drafter / policy
    drafters = [r["drafter"] for r in next(iter(results.values()))["rows"]]
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 0.32 * len(drafters) * rows + 1.2 * rows),
                             squeeze=False)
    for ax, (name, res) in zip(axes.flat, results.items()):
        rws = {r["drafter"]: r for r in res["rows"]}
        names = [d for d in drafters if d in rws]
        labels = [f"{d} ({rws[d]['note']})" if rws[d].get("note") else d for d in names]
        vals = [rws[d]["AL"] for d in names]
        colors = [_GROUP_COLORS.get(d.split(":")[0], "tab:gray") for d in names]
        y = np.arange(len(names))
        bars = ax.barh(y, vals, color=colors)
        ax.bar_label(bars, fmt="%.2f", padding=2, fontsize=8)
        ax.set_yticks(y, labels, fontsize=9)
        ax.invert_yaxis()
        ax.set_xlim(0, max(vals) * 1.15)
        ax.set_title(name)
        ax.set_xlabel("tokens per target forward (AL)")
        ax.grid(axis="x", alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    thr = f", hybrid/tree T={threshold}" if threshold is not None else ""
    fig.suptitle(f"AL by drafter and policy ({kk}higher is better{thr})", fontsize=13)
    fig.tight_layout()
    paths.append(save(fig, "al_by_policy.png"))

    # 3. distribution of tokens accepted per step
    shown = ("neural", "sa:first", "hybrid:adaptive")
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.6 * rows), squeeze=False)
    for ax, (name, res) in zip(axes.flat, results.items()):
        for j, r in enumerate(r for r in res["rows"] if r["drafter"] in shown and "hist" in r):
            h = np.asarray(r["hist"], float)
            marker, ls, size = _POLICY_STYLES[j % len(_POLICY_STYLES)]
            ax.plot(np.arange(1, h.size + 1), h / h.sum(), marker=marker, ls=ls, ms=size - 2, mfc="none",
                    label=r["drafter"])
        ax.set_title(name)
        ax.set_xlabel("tokens accepted in a step (drafts + the target's own)")
        ax.set_ylabel("fraction of steps")
        ax.xaxis.set_major_locator(FixedLocator(np.arange(1, len(res["rows"][0]["hist"]) + 1)))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False, bbox_to_anchor=(0.5, -0.01))
    fig.suptitle(f"Tokens accepted per step ({kk}all traces of each workload)", fontsize=13)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    paths.append(save(fig, "accepted_distribution.png"))
    return paths


def main(args: argparse.Namespace) -> int:
    """Run ``saspec simulate`` with parsed arguments (see :func:`add_arguments`): print the
    first screen (:func:`format_first_screen`), write every table to ``OUT/tables.md``, the
    results to ``OUT/results.json`` (or ``--json``) and the plots to ``OUT``.

    Raises ``options.CliError`` for option combinations the parser cannot check
    alone (``--p`` shorter than K, no workload left to simulate).
    """
    from tqdm import tqdm

    names = list(args.workloads)
    policies = tuple(args.occurrences)
    if args.p is None:
        p = default_p(args.k)
    elif len(args.p) < args.k:
        raise CliError(f"--p gives {len(args.p)} probabilities but -k is {args.k}: give one per draft position "
                       f"(or leave --p out for the default profile extended to K)")
    else:
        p = tuple(args.p[: args.k])
    thresholds = tuple(args.thresholds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    flats = load_workloads(names, args.size, args.seed)
    build_s = time.perf_counter() - t0
    if not flats:
        raise CliError(f"none of the workloads {', '.join(names)} is available (see the messages above)")
    results = {}
    t0 = time.perf_counter()
    with tqdm(total=len(flats) * (len(policies) + (0 if args.no_ngram else 1)), desc="simulating", unit="pass") as bar:
        for name, flat in flats.items():
            bar.set_postfix_str(name)
            results[name] = simulate_workload(flat, args.k, p, thresholds, args.threshold, policies,
                                              seed=args.seed, ngram=not args.no_ngram, progress=bar)
    sim_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    policy = default_hybrid_policy(policies)
    speed_text, speed = speed_section(flats, args.k, p, args.threshold, args.seed, occurrence=policy)
    cost_s = time.perf_counter() - t1
    pool, pool_text = None, ""
    if args.pool_tokens:

        pool = pool_comparison(flats, args.k, args.pool_tokens, policy)  # the SA occurrence rule of the first screen
        pool_text = format_pool_table(pool, args.k, args.pool_tokens, policy)
    sa_tokens = sum(r["tokens"] for r in results.values()) * len(policies)
    sa_seconds = sum(v for r in results.values() for key, v in r["seconds"].items() if key.startswith("sa:"))
    first = format_first_screen(results, speed, args.k, args.threshold, policy)
    timing = (f"workloads built in {build_s:.1f} s; simulated in {sim_s:.1f} s; cost model in {cost_s:.1f} s; "
              f"SA passes: {sa_tokens / max(sa_seconds, 1e-9) / 1e6:.2f} M output tokens/s")
    tables_path = out / TABLES_FILE
    tables_path.write_text(format_tables(first, results, args.threshold, speed_text, timing, pool_text))
    summary = {"args": {k: v for k, v in vars(args).items() if not callable(v)}, "neural_p": list(p),
               "build_seconds": build_s, "simulate_seconds": sim_s,
               "sa_tokens_per_second": sa_tokens / max(sa_seconds, 1e-9), "workloads": results,
               "cost_model": speed, "pool": pool}
    json_path = Path(args.json) if args.json else out / "results.json"
    json_path.write_text(json.dumps(summary, indent=1))
    plots = plot(results, out, args.k, args.threshold) if not args.no_plots else []
    print()
    print(first)
    if pool:
        print()
        print(f"Memory across requests (arrival order, SA only, a pool of {args.pool_tokens} tokens of outputs), AL "
              "with / without: " + ", ".join(f"{_short(n)} {r['outputs']['al'] / r['off']['al']:.3f}x"
                                              for n, r in pool.items()))
    print()
    print(f"full tables: {tables_path}; results: {json_path}"
          + (f"; plots: {', '.join(p.name for p in plots)} in {out}" if plots else ""))
    return 0
