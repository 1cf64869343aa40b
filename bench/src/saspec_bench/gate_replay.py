"""The cost gate replayed over real outputs under a synthetic clock: no model, no real timing.

Each shipped real output of Qwen2.5-Coder-1.5B (``data/real_outputs.jsonl.gz``: code edits, HumanEval edits,
chat) is decoded again with a real ``SpecEngine``: each step offers the automaton's draft to a
:class:`~saspec.gate.CostGate`, verifies what it chose (the target accepts the drafts that equal the output,
then one token of its own) and reports the step time a *cost model* gives for the forward's size (times a seeded
burst of load where asked). Deterministic, so it measures the gate's rule and what its exploration costs;
``tests/test_gate.py`` states the gate's properties on the same replay.

    python -m saspec_bench.gate_replay   # the table in BENCHMARKS.md, "The cost gate" (about 10 seconds)
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from saspec.engine import SpecEngine
from saspec.gate import CostGate

REAL_OUTPUTS = Path(__file__).parent / "data" / "real_outputs.jsonl.gz"

Cost = Callable[[int, int], float]  # (step, tokens in the forward) -> seconds

# The cost of a forward over n tokens in units of a 1-token forward, on four kinds of machine.


def cheap(n: int) -> float:
    """Verifying is nearly free: a GPU at small batch."""
    return 1.0 + 0.03 * (n - 1)


def dear(n: int) -> float:
    """Every verified token costs a forward: bf16 on a CPU without native bf16 matmuls."""
    return float(n)


def flattening(n: int) -> float:
    """About a forward per row up to 4 rows, little more after: fp32 ``F.linear`` on an x86 CPU."""
    return [1.0, 2.1, 3.1, 2.9, 3.0, 3.1, 3.2, 3.25, 3.3][min(n, 9) - 1]


def fixed_overhead(n: int) -> float:
    """A fixed overhead for any verify, then little per token: a tiny model, where Python dominates."""
    return 1.0 if n == 1 else 1.4 + 0.03 * (n - 2)


MACHINES: dict[str, Callable[[int], float]] = {
    "cheap verify (a GPU at small batch)": cheap,
    "a forward per token (bf16, no native bf16 matmuls)": dear,
    "flattening (fp32 F.linear on an x86 CPU)": flattening,
    "fixed overhead (a tiny model)": fixed_overhead,
}


def load_traces(path: Path = REAL_OUTPUTS) -> list[dict[str, Any]]:
    """The shipped real outputs: dicts with ``prompt_ids``, ``output_ids`` and ``meta["workload"]``."""
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def bursts(machine: Callable[[int], float], seed: int, share: float = 0.2, lo: float = 2.0, hi: float = 5.0) -> Cost:
    """``machine``'s costs with a seeded ``share`` of steps ``lo``-``hi`` times slower (a busy machine)."""
    rng = np.random.default_rng(seed)
    slow: dict[int, float] = {}

    def cost(step: int, n: int) -> float:
        if step not in slow:
            slow[step] = rng.uniform(lo, hi) if rng.random() < share else 1.0
        return machine(n) * slow[step]

    return cost


def replay(gate: CostGate, trace: dict[str, Any], cost: Cost, k: int = 8) -> dict[str, Any]:
    """Greedy decoding of ``trace``'s fixed output with SA drafts chosen by ``gate``.

    Returns ``choices`` (per step: match length, the gate's source, tokens verified), ``steps`` (per step:
    seconds, tokens emitted), the total ``time`` and the output's ``tokens``."""
    output = trace["output_ids"]
    engine = SpecEngine()
    engine.add_request(0, trace["prompt_ids"])
    engine.prepare([0])
    acc, lens = np.zeros((1, k + 1), np.int32), np.zeros(1, np.int32)
    match_out, draft_out = np.zeros(1, np.int32), np.zeros((1, k), np.int32)
    pos, total, choices, steps, new = 0, 0.0, [], [], []
    while pos < len(output):
        acc[0, : len(new)], lens[0] = new, len(new)
        engine.extend(acc, lens, match_out, draft_out)
        draft = [int(t) for t in draft_out[0] if t >= 0]
        match = int(match_out[0])
        gate.offer(match, draft)
        source, n = gate.choose(match, len(draft))
        if source == "probe":  # one token: the automaton's, else a guess (the last token again)
            verify = draft[:1] or [output[pos - 1] if pos else 0]
        else:
            verify = draft[:n] if source == "sa" else []
        verify = verify[: len(output) - pos - 1]  # the target's own token ends the output
        a = 0
        while a < len(verify) and verify[a] == output[pos + a]:
            a += 1
        new = output[pos : pos + a + 1]
        seconds = cost(len(choices), 1 + len(verify))
        gate.observe_forward(1 + len(verify), seconds)
        gate.observe_tokens(new)
        choices.append((match, source, len(verify)))
        steps.append((seconds, len(new)))
        total += seconds
        pos += len(new)
    engine.remove_request(0)
    return {"choices": choices, "steps": steps, "time": total, "tokens": len(output)}


def plain_time(trace: dict[str, Any], cost: Cost) -> float:
    """What plain decoding of ``trace``'s output costs: one 1-token forward per token."""
    return sum(cost(step, 1) for step in range(len(trace["output_ids"])))


def summary(runs: list[dict[str, Any]], plain: list[float], gates: list[CostGate], long: int = 16) -> dict[str, float]:
    """Speed-up over plain decoding (``plain``: its time per run, under the same load), the share of steps
    with a match of at least ``long`` tokens that drafted, and the shares of steps that were warm-up or
    re-tries."""
    steps = sum(len(r["choices"]) for r in runs)
    longs = [c for r in runs for c in r["choices"] if c[0] >= long]
    return {"x_plain": sum(plain) / sum(r["time"] for r in runs),
            "drafted_long": sum(c[2] > 0 for c in longs) / max(len(longs), 1),
            "warm_up": sum(g.stats["warm-up"] for g in gates) / steps,
            "retries": sum(g.stats["retries"] for g in gates) / steps}


def main() -> None:
    traces = load_traces()
    kinds = sorted({t["meta"]["workload"] for t in traces})
    print("| machine | load | workload | x plain | long matches drafted | warm-up steps | re-try steps |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name, machine in MACHINES.items():
        for load in ("steady", "bursts"):
            for kind in kinds:
                chosen = [(i, t) for i, t in enumerate(traces) if t["meta"]["workload"] == kind]

                def cost(i: int) -> Cost:  # the same load for the gate and for plain decoding
                    return (lambda s, n: machine(n)) if load == "steady" else bursts(machine, seed=i)

                gates = [CostGate(8) for _ in chosen]
                runs = [replay(g, t, cost(i)) for g, (i, t) in zip(gates, chosen)]
                s = summary(runs, [plain_time(t, cost(i)) for i, t in chosen], gates)
                print(f"| {name} | {load} | {kind} | {s['x_plain']:.2f}x | {s['drafted_long']:.0%} | "
                      f"{s['warm_up']:.1%} | {s['retries']:.1%} |", flush=True)


if __name__ == "__main__":
    main()
