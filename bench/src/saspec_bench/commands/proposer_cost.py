"""``saspec bench-vllm --proposer-cost``: what drafting costs per decode step inside vLLM's proposer interface.

No model runs: each proposer is called the way vLLM's model runner calls it,
on a persistent batch of B rows whose texts are C-token code-like prompts
(``synthetic.code_like_prompt``: repeated 2,000-token blocks, 1% of each copy
mutated), each row gaining ``STEP_TOKENS`` tokens per step. The proposers, each
built fresh per cell, all called on the same arrays in turn at every step
(interleaved):

* ``saspec-defaults``: ``SAProposer`` as a new user gets it, from
  ``proposer_config()``'s defaults (its K, the drafting policy, the
  cross-request pool on, the minimum match vLLM leaves to custom classes), as
  the plugin drives it: told each new request at its arrival (``schedule``,
  builds on a background thread) and each step's row ids (``name_rows``);
* ``saspec-defaults-noplugin``: the same without the plugin, rows matched by
  fingerprint;
* ``saspec-fixed``: the defaults with the fixed rule (``length_rule="fixed"``:
  the automaton's draft, no policy), with the plugin; against
  ``saspec-defaults`` it gives the policy's share of the call;
* ``saspec`` / ``saspec-noplugin``: K = ``K``, minimum match 2, the other
  settings their defaults (with / without the plugin);
* ``ngram``: vLLM's ``NgramProposer`` (``prompt_lookup_min`` 2, max 5, K = ``K``);
* ``suffix``: vLLM's ``SuffixDecodingProposer`` (ArcticInference's suffix
  trees, its global cache off, K = ``K``), where ``arctic_inference`` imports
  (build it outside the repository; see BENCHMARKS.md).

Per cell and proposer: the median steady-step cost (µs per call; best of
``rounds`` rounds) and the first step's, which builds every request (for the
plugin's rows the first step after arrival with no prefill in between: the
build has nothing to hide behind). ``--arrival-prefill-s`` adds the scenario of
builds during prefill: ``A`` requests of ``C_a`` tokens arrive at once into a
running batch of ``saspec-defaults``, the emulated prefill (a sleep of the
given seconds, standing for the accelerator's forward: the host is free) runs,
and the next step's cost is compared with a steady step's of the grown batch.

``--baseline-src DIR``: the same children again with another checkout's
``saspec`` (``DIR``, its ``src``; this checkout's bench code) first on the
path, one round each in turn (this checkout first in even rounds, the
baseline first in odd ones); the baseline's columns are marked ``@base``.

The child (``--child JOB OUT``) runs in the vLLM environment (``--vllm-python``);
the parent writes ``results.md`` and ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from .. import results
from ..options import CliError
from ..synthetic import code_like_prompt

#: K of vLLM's n-gram and suffix proposers and of the ``saspec`` / ``saspec-noplugin`` rows.
K = 8
STEP_TOKENS = 3
#: Room past each row's last step: more than any proposer's K here (``proposer_config()``'s is 32).
ROOM = 64
PROPOSERS = ("saspec-defaults", "saspec-defaults-noplugin", "saspec-fixed", "saspec", "saspec-noplugin", "ngram",
             "suffix")
DEFAULT_PROPOSERS = ("saspec-defaults", "saspec-defaults-noplugin", "saspec-fixed", "ngram", "suffix")
DEFAULT_BATCHES = (1, 8, 64, 256)
DEFAULT_CONTEXTS = (2048, 8192, 32768)
#: The marker of a baseline checkout's proposers in the results.
BASE = "@base"


# -- the child: runs in the vLLM environment ---------------------------------------------


def _vllm_config(rows: int, width: int, k: int = K, min_match: int = 2) -> SimpleNamespace:
    spec = SimpleNamespace(num_speculative_tokens=k, prompt_lookup_min=min_match, prompt_lookup_max=5,
                           suffix_decoding_max_tree_depth=24, suffix_decoding_max_spec_factor=1.0,
                           suffix_decoding_min_token_prob=0.1, suffix_decoding_max_cached_requests=0)
    return SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(max_model_len=width),
                           scheduler_config=SimpleNamespace(max_num_seqs=max(rows, 1024)),
                           parallel_config=SimpleNamespace(tensor_parallel_size=1))


class Batch:
    """vLLM's persistent input batch as proposers see it: ``token_ids_cpu`` [B, width],
    ``num_tokens_no_spec`` [B], request ids; each row's whole future text is known.
    ``contexts``: each row's prompt length (default ``context`` for all)."""

    def __init__(self, rows: int, context: int, steps: int, seed: int, contexts: list[int] | None = None) -> None:

        contexts = contexts or [context] * rows
        self.width = max(contexts) + STEP_TOKENS * (steps + 2) + ROOM
        self.texts = np.stack([code_like_prompt(self.width, seed=seed + r) for r in range(rows)])
        self.token_ids_cpu = np.zeros((rows, self.width), np.int32)
        for b, c in enumerate(contexts):
            self.token_ids_cpu[b, :c] = self.texts[b, :c]
        self.num_tokens_no_spec = np.array(contexts, np.int32)
        self.num_prompt_tokens = self.num_tokens_no_spec.copy()
        self.req_ids = [f"req-{seed}-{r}" for r in range(rows)]
        self.req_id_to_index = {r: i for i, r in enumerate(self.req_ids)}
        self.sampled: list[list[int]] = [[] for _ in range(rows)]

    def advance(self, rows: int | None = None) -> None:
        """Each of the first ``rows`` rows (all by default) gains ``STEP_TOKENS`` tokens."""
        n = self.num_tokens_no_spec
        for b in range(n.shape[0] if rows is None else rows):
            new = self.texts[b, n[b] : n[b] + STEP_TOKENS]
            self.token_ids_cpu[b, n[b] : n[b] + STEP_TOKENS] = new
            self.sampled[b] = new.tolist()
            n[b] += STEP_TOKENS

    def head(self, rows: int) -> SimpleNamespace:
        """The first ``rows`` rows as a batch of their own (views of the arrays)."""
        return SimpleNamespace(token_ids_cpu=self.token_ids_cpu[:rows], num_tokens_no_spec=self.num_tokens_no_spec[:rows],
                               num_prompt_tokens=self.num_prompt_tokens[:rows], req_ids=self.req_ids[:rows],
                               sampled=self.sampled[:rows])


def _defaults_proposer(rows: int, width: int, **settings: Any) -> Any:
    """``SAProposer`` as vLLM builds it from ``proposer_config()`` (K and the pool from it, ``prompt_lookup_min``
    0 as vLLM sets it for custom classes, no saspec setting in the environment), with ``settings`` on top."""
    from saspec.integrations.vllm import SAProposer, proposer_config

    spec = proposer_config()  # also leaves the pool's size in the environment, as for vLLM's workers
    return SAProposer(_vllm_config(rows, width, spec["num_speculative_tokens"], 0), **settings)


def _proposers(names: list[str], rows: int, width: int) -> dict[str, Any]:
    """name -> a callable(batch) doing one propose step the way vLLM's runner does."""
    cfg = _vllm_config(rows, width)
    out: dict[str, Any] = {}
    for name in names:
        if name.startswith("saspec"):
            if name.startswith("saspec-defaults"):
                p = _defaults_proposer(rows, width)
            elif name == "saspec-fixed":
                p = _defaults_proposer(rows, width, length_rule="fixed")
            else:
                from saspec.integrations.vllm import SAProposer

                p = SAProposer(cfg, min_match=2)
            if name.endswith("-noplugin"):
                out[name] = lambda b, p=p: p.propose(b.sampled, b.num_tokens_no_spec, b.token_ids_cpu)
            else:
                out[name] = _plugin_step(p)
        elif name == "ngram":
            from vllm.v1.spec_decode.ngram_proposer import NgramProposer

            p = NgramProposer(cfg)
            out[name] = lambda b, p=p: p.propose(K, b.sampled, b.num_tokens_no_spec, b.token_ids_cpu)
        elif name == "suffix":
            from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

            p = SuffixDecodingProposer(cfg)
            out[name] = lambda b, p=p: p.propose(K, b, b.sampled)
    return out


def _plugin_step(p: Any) -> Any:
    """What the plugin does around ``SAProposer.propose``: news first (once per request), then row ids."""
    announced: list[int] = [0]  # rows announced so far: a batch only grows at its end

    def step(b: Batch, announce_only: bool = False) -> Any:
        if len(b.req_ids) > announced[0]:  # as the plugin: the scheduler's new requests only
            p.schedule([(b.req_ids[i], b.token_ids_cpu[i, : b.num_prompt_tokens[i]], None)
                        for i in range(announced[0], len(b.req_ids))], [])
            announced[0] = len(b.req_ids)
        if announce_only:
            return None
        p.name_rows(b.req_ids)
        return p.propose(b.sampled, b.num_tokens_no_spec, b.token_ids_cpu)

    return step


def available(names: list[str]) -> list[str]:
    """The proposers of ``names`` that import here (``suffix`` needs ``arctic_inference``)."""
    import importlib.util

    return [n for n in names if n != "suffix" or importlib.util.find_spec("arctic_inference") is not None]


def cell(names: list[str], rows: int, context: int, steps: int, rounds: int,
         first_round: int = 0) -> dict[str, dict[str, float]]:
    """Median steady ms per call (best round) and the first step's ms, per proposer. Round ``r`` draws
    its texts from seed ``1000 * (first_round + r)``."""
    res = {n: {"steady_ms": float("inf"), "first_ms": float("inf")} for n in names}
    for rnd in range(first_round, first_round + rounds):
        batch = Batch(rows, context, steps, seed=1000 * rnd)
        calls = _proposers(names, rows, batch.width)
        times: dict[str, list[float]] = {n: [] for n in names}
        for step in range(steps + 1):
            batch.advance()
            for n in names:
                t0 = time.perf_counter()
                calls[n](batch)
                dt = (time.perf_counter() - t0) * 1e3
                if step == 0:
                    res[n]["first_ms"] = min(res[n]["first_ms"], dt)
                else:
                    times[n].append(dt)
        for n in names:
            res[n]["steady_ms"] = min(res[n]["steady_ms"], statistics.median(times[n]))
    return res


def arrival(rows: int, context: int, arriving: int, arriving_context: int, prefill_s: float,
            steps: int) -> dict[str, float]:
    """Builds during prefill: ``arriving`` requests of ``arriving_context`` tokens join a
    steady batch of ``rows`` rows; after ``prefill_s`` seconds (the prefill, on the
    accelerator) the first step that drafts for them runs. ms of that step, and medians
    of the steps before the arrival and after it."""
    batch = Batch(rows + arriving, context, 2 * steps + 4, seed=7, contexts=[context] * rows + [arriving_context] * arriving)
    p = _defaults_proposer(rows + arriving, batch.width)
    step = _plugin_step(p)
    steady = []
    for _ in range(steps):
        batch.advance(rows)
        t0 = time.perf_counter()
        step(batch.head(rows))
        steady.append((time.perf_counter() - t0) * 1e3)
    waited = p.stats["waited"]
    step(batch, announce_only=True)  # the scheduler's step that starts their prefill
    time.sleep(prefill_s)
    batch.advance()
    t0 = time.perf_counter()
    step(batch)
    after = (time.perf_counter() - t0) * 1e3
    later = []
    for _ in range(steps):
        batch.advance()
        t0 = time.perf_counter()
        step(batch)
        later.append((time.perf_counter() - t0) * 1e3)
    return {"steady_ms": statistics.median(steady), "after_prefill_ms": after, "later_ms": statistics.median(later),
            "waited": p.stats["waited"] - waited, "arriving": arriving}


def child(job_path: str, out_path: str) -> None:
    for var in [v for v in os.environ if v.startswith("SASPEC_VLLM_") or v == "SASPEC_POLICY_LOG"]:
        del os.environ[var]  # the defaults are the library's, not this shell's
    job = json.loads(Path(job_path).read_text())
    names = available(job["proposers"])
    out: dict[str, Any] = {"proposers": names, "cells": [], "arrival": None}
    try:
        import vllm

        out["vllm"] = vllm.__version__
    except ImportError:
        out["vllm"] = None
    for rows in job["batches"]:
        for context in job["contexts"]:
            res = cell(names, rows, context, job["steps"], job["rounds"], job.get("first_round", 0))
            out["cells"].append({"rows": rows, "context": context, **{n: res[n] for n in names}})
            print(f"[proposer-cost] B={rows} C={context}: "
                  + ", ".join(f"{n} {res[n]['steady_ms'] * 1e3:.1f} us" for n in names), file=sys.stderr, flush=True)
            Path(out_path).write_text(json.dumps(out))
    out["arrival"] = [{**a, **arrival(a["rows"], a["context"], a["arriving"], a["arriving_context"], a["prefill_s"],
                                      job["steps"])} for a in job.get("arrival") or []]
    Path(out_path).write_text(json.dumps(out))


# -- the parent ------------------------------------------------------------------------------


def _ints(text: str, name: str) -> list[int]:

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{name} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise CliError(f"{name} must list integers >= 1, got {text!r}")
    return values


def _seconds(text: str) -> list[float]:

    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--arrival-prefill-s must be comma-separated seconds, got {text!r}") from None
    if any(not (v >= 0) or v > 600 for v in values):
        raise CliError(f"--arrival-prefill-s must list seconds in [0, 600], got {text!r}")
    return values


def _names(text: str | None) -> list[str]:
    if text is None:
        return list(DEFAULT_PROPOSERS)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in PROPOSERS]
    if bad or not names:
        raise CliError(f"--proposers must list names from {', '.join(PROPOSERS)}, got {text!r}")
    return list(dict.fromkeys(names))


def merge(into: dict[str, Any] | None, res: dict[str, Any], suffix: str = "") -> dict[str, Any]:
    """``res`` (one child's results) merged into ``into``: each cell's proposers renamed with ``suffix``, the
    best steady and first-step times of the children kept; the arrival scenario of the first child only."""
    renamed = {"proposers": [n + suffix for n in res["proposers"]], "vllm": res.get("vllm"),
               "cells": [{"rows": c["rows"], "context": c["context"],
                          **{n + suffix: c[n] for n in res["proposers"] if n in c}} for c in res["cells"]],
               "arrival": res.get("arrival")}
    if into is None:
        return renamed
    for n in renamed["proposers"]:
        if n not in into["proposers"]:
            into["proposers"].append(n)
    cells = {(c["rows"], c["context"]): c for c in into["cells"]}
    for c in renamed["cells"]:
        have = cells.get((c["rows"], c["context"]))
        if have is None:
            into["cells"].append(c)
            continue
        for n, t in c.items():
            if n in ("rows", "context"):
                continue
            old = have.setdefault(n, dict(t))
            for key in ("steady_ms", "first_ms"):
                old[key] = min(old[key], t[key])
    if into.get("arrival") is None:
        into["arrival"] = renamed["arrival"]
    return into


def main(args: argparse.Namespace) -> int:

    if not Path(args.vllm_python).is_file():
        raise CliError(f"no vLLM python at {args.vllm_python}; see README, Integrations (or pass --vllm-python)")
    base = getattr(args, "baseline_src", None)
    if base is not None and not (Path(base) / "saspec" / "__init__.py").is_file():
        raise CliError(f"--baseline-src must be a checkout's src directory holding saspec/, got {base!r}")
    job = {"batches": _ints(args.batches, "--batches"), "contexts": _ints(args.contexts, "--contexts"),
           "steps": args.steps, "rounds": args.rounds, "proposers": _names(getattr(args, "proposers", None)),
           "arrival": [{"rows": 64, "context": 8192, "arriving": 16, "arriving_context": 32768, "prefill_s": x}
                       for x in _seconds(args.arrival_prefill_s or "")]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    job_path, res_path = out / ".job.json", out / ".out.json"
    bench_src = str(Path(__file__).resolve().parents[2])  # the child imports this module from here
    env = dict(os.environ)
    paths = [args.peer_arctic, bench_src, env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    checkouts = [("", env)]
    if base is not None:
        checkouts.append((BASE, {**env, "PYTHONPATH": os.pathsep.join(p for p in [base, *paths] if p)}))
    res: dict[str, Any] | None = None
    rounds = args.rounds if base is not None else 1  # with a baseline: one round per child, in turn
    for rnd in range(rounds):
        for suffix, child_env in (checkouts if rnd % 2 == 0 else checkouts[::-1]):
            one = {**job, "rounds": 1, "first_round": rnd} if base is not None else job
            if suffix:
                one = {**one, "arrival": []}
            job_path.write_text(json.dumps(one))
            proc = subprocess.run([args.vllm_python, "-m", "saspec_bench.commands.proposer_cost", "--child",
                                   str(job_path), str(res_path)], env=child_env)
            if proc.returncode != 0:
                raise CliError(f"the proposer-cost child{' (baseline)' if suffix else ''} failed "
                               f"(exit {proc.returncode})")
            res = merge(res, json.loads(res_path.read_text()), suffix)
    job_path.unlink()
    res_path.unlink()
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(), "vllm": res.get("vllm"), "argv": sys.argv[1:],
            "k": K, "step_tokens": STEP_TOKENS, "steps": args.steps, "rounds": args.rounds, "baseline_src": base,
            "commit": _commit(Path(__file__).resolve().parents[4]),
            "baseline_commit": _commit(Path(base).resolve().parent) if base is not None else None}
    return results.publish(out, info, format_report(info, res), **res)


def _commit(checkout: Path) -> str | None:
    """``checkout``'s commit, with ``+`` where its ``src/saspec`` differs from it (uncommitted changes)."""
    try:
        commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(checkout), "diff", "--quiet", "HEAD", "--", "src/saspec"]).returncode
    except (OSError, subprocess.CalledProcessError):
        return None
    return (commit + ("+" if dirty else "")) or None


#: Cost ratios of the report: (label, numerator, denominator).
RATIOS = (("defaults / ngram", "saspec-defaults", "ngram"),
          ("defaults, no plugin / ngram", "saspec-defaults-noplugin", "ngram"),
          ("policy / fixed", "saspec-defaults", "saspec-fixed"),
          ("saspec / ngram", "saspec", "ngram"),
          ("saspec / suffix", "saspec", "suffix"))


def format_report(info: dict[str, Any], res: dict[str, Any]) -> str:
    names = res["proposers"]
    cells = res["cells"]
    base = [n[: -len(BASE)] for n in names if n.endswith(BASE)]
    ratios = [(label, a + sfx, b + sfx) for label, a, b in RATIOS for sfx in ("", BASE)
              if (not sfx or a in base) and any(a + sfx in c and (b in c or b + sfx in c) for c in cells)]
    commits = ""
    if info.get("commit") or info.get("baseline_commit"):
        commits = f"commit {info.get('commit')}" + (f", baseline ({BASE}) {info['baseline_commit']}"
                                                    if info.get("baseline_commit") else "") + "; "
    lines = [f"# Drafting cost inside vLLM's proposer interface ({info['date']})", "",
             f"{commits}vLLM {info['vllm']}, {info['cpu']}, {info['cpus']} CPUs; {info['step_tokens']} tokens per "
             f"row per step; n-gram, suffix and `saspec` K = {info['k']}, `saspec-defaults*` and `saspec-fixed` "
             f"`proposer_config()`'s; median of {info['steps']} steps, best of {info['rounds']} rounds; "
             "µs per propose() call (ratios: cost over cost; below 1 the first is cheaper).", "",
             "| B x C | " + " | ".join(names) + " | " + " | ".join(r[0] + (BASE if r[1].endswith(BASE) else "")
                                                           for r in ratios) + " |",
             "|---|" + "---:|" * (len(names) + len(ratios))]
    for c in cells:
        row = [f"{c[n]['steady_ms'] * 1e3:.1f}" if n in c else "-" for n in names]
        for _, a, b in ratios:
            den = c.get(b) or c.get(b[: -len(BASE)] if b.endswith(BASE) else b)
            row.append(f"{c[a]['steady_ms'] / den['steady_ms']:.2f}x" if a in c and den else "-")
        lines.append(f"| {c['rows']} x {c['context'] // 1024}k | " + " | ".join(row) + " |")
    lines += ["", "First step (ms; the call that builds every request):", "",
              "| B x C | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for c in cells:
        lines.append(f"| {c['rows']} x {c['context'] // 1024}k | "
                     + " | ".join(f"{c[n]['first_ms']:.1f}" if n in c else "-" for n in names) + " |")
    for a in res.get("arrival") or []:
        lines += ["", f"Builds during prefill: {a['arriving']} requests of {a['arriving_context']} tokens join a "
                  f"running batch of {a['rows']} x {a['context']}; after an emulated prefill of {a['prefill_s']} s "
                  f"the next step costs {a['after_prefill_ms']:.3f} ms, {a['after_prefill_ms'] / a['later_ms']:.1f}x a "
                  f"steady step of the grown batch ({a['later_ms']:.3f} ms; before the arrival {a['steady_ms']:.3f} "
                  f"ms); builds still running when it started: {a['waited']} of {a['arriving']}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: python -m saspec_bench.commands.proposer_cost --child JOB.json OUT.json "
                         "(or: saspec bench-vllm --proposer-cost)")
