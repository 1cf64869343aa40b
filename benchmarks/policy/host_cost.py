"""The policy's per-step host cost against saspec's drafting call, at B rows x C tokens (no model).

``SAProposer`` is driven the way vLLM's runner and saspec's plugin drive it (request ids named, builds at
arrival), each row gaining 3 tokens per step; the same arrays go to a proposer with the fixed rule
(``length_rule="fixed"``: the drafting call alone) and one with the policy (the default), interleaved step
by step (the share: the medians' difference, and the median of each step's own difference). Also, alone
on the same batch: ``DraftPolicy.decide`` + ``observe`` + ``observe_step``, and
``DraftPolicy.step`` (the one call ``SAProposer`` makes).

    python benchmarks/policy/host_cost.py --rows 64 --context 8192 --k 8 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import numpy as np

from saspec.integrations.vllm.proposer import SAProposer
from saspec.policy import DraftPolicy, StepCost, cpu_like
from saspec_bench.synthetic import code_like_prompt


def config(k: int, rows: int, width: int) -> SimpleNamespace:
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k, prompt_lookup_min=2),
                           model_config=SimpleNamespace(max_model_len=width),
                           scheduler_config=SimpleNamespace(max_num_seqs=rows),
                           device_config=SimpleNamespace(device_type="cpu"))


def run(rows: int, context: int, k: int, steps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    width = context + 3 * (steps + 2) + 64
    texts = [code_like_prompt(context, rng) for _ in range(rows)]
    ids = np.zeros((rows, width), np.int32)
    n = np.full(rows, context, np.int32)
    for b, t in enumerate(texts):
        ids[b, :context] = t[:context]
    rids = [f"r{b}" for b in range(rows)]
    props = {name: SAProposer(config(k, rows, width), length_rule=rule, pool_tokens=0)
             for name, rule in (("fixed", "fixed"), ("policy", "policy"))}
    for p in props.values():
        p.schedule([(r, ids[b, :context].copy(), None) for b, r in enumerate(rids)], [])
    times = {name: [] for name in props}
    clock = [0.0]
    for p in props.values():
        p._clock = lambda: clock[0]  # the policy times the model's step on this clock: 1 ms per step
    for step in range(steps):
        new = []
        for b in range(rows):
            # continue the row's text with its own earlier tokens (a copy), 3 tokens per step
            src = (n[b] - context // 2) % context
            tok = ids[b, src: src + 3].tolist()
            ids[b, n[b]: n[b] + 3] = tok
            n[b] += 3
            new.append(tok)
        clock[0] += 1e-3
        for name, p in props.items():
            p.name_rows(rids)
            t0 = time.perf_counter()
            p.propose(new, n, ids)
            times[name].append(time.perf_counter() - t0)
    # The policy alone, on the same batch's shape.
    pol = DraftPolicy(k, cost=StepCost(cpu_like, max_tokens=rows * (k + 1)))
    match = rng.integers(0, 200, rows).astype(np.int64)
    offered = np.full(rows, k, np.int64)
    drafts = rng.integers(0, 100, (rows, k)).astype(np.int32)
    newt = drafts.copy()
    lens = rng.integers(1, k + 1, rows).astype(np.int64)
    alone = []
    for _ in range(steps):
        t0 = time.perf_counter()
        pol.observe_step(rows + 8, 1e-3)
        pol.observe(match, offered, drafts, newt, lens)
        pol.decide(match, offered)
        alone.append(time.perf_counter() - t0)
    one = DraftPolicy(k, cost=StepCost(cpu_like, max_tokens=rows * (k + 1)))
    m32, o32, l32 = match.astype(np.int32), offered.astype(np.int32), lens.astype(np.int32)
    step_alone = []
    for _ in range(steps):
        t0 = time.perf_counter()
        one.step(m32, o32, drafts, newt, l32, 1e-3, True)
        step_alone.append(time.perf_counter() - t0)
    skip = min(20, steps // 4)  # the first steps build and compile
    med = {name: statistics.median(t[skip:]) * 1e6 for name, t in times.items()}
    # the same step's two calls ran back to back: their difference is the least moved by the machine's drift
    paired = statistics.median(p - f for p, f in zip(times["policy"][skip:], times["fixed"][skip:])) * 1e6
    return {"rows": rows, "context": context, "k": k, "steps": steps, "fixed_us": med["fixed"],
            "policy_us": med["policy"], "policy_share": (med["policy"] - med["fixed"]) / med["fixed"],
            "paired_us": paired, "paired_share": paired / med["fixed"],
            "policy_alone_us": statistics.median(alone[skip:]) * 1e6,
            "step_alone_us": statistics.median(step_alone[skip:]) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--k", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for k in args.k:
        runs = [run(args.rows, args.context, k, args.steps, seed=r) for r in range(args.rounds)]
        best = min(runs, key=lambda r: r["policy_us"])
        print(json.dumps({**best, "fixed_us_all": [round(r["fixed_us"], 1) for r in runs],
                          "policy_us_all": [round(r["policy_us"], 1) for r in runs],
                          "paired_share_all": [round(r["paired_share"], 3) for r in runs],
                          "alone_us_all": [round(r["policy_alone_us"], 1) for r in runs],
                          "step_alone_us_all": [round(r["step_alone_us"], 1) for r in runs]}))


if __name__ == "__main__":
    main()
