"""The drafting policy replayed over real outputs under a synthetic clock: no model, no real timing.

Each shipped real output of Qwen2.5-Coder-1.5B (``data/real_outputs.jsonl.gz``: code edits, HumanEval edits,
chat) is decoded again with a real ``SpecEngine``: each step offers the automaton's draft to a
:class:`~saspec.policy.SequencePolicy` (or the former gate, ``saspec_bench.former_gate.CostGate``, with the same calls),
verifies what it chose (the target accepts the drafts that equal the output, then one token of its own) and
reports the step time a *cost model* gives for the forward's size (times a seeded load where asked: bursts, 20%
of steps 2-5x slower, or a competing process, a third of the steps 2-5x slower). Deterministic, so it measures
the rule and what its exploration costs; ``tests/bench/test_former_gate.py`` states the old gate's properties on the
same replay.

    python -m saspec_bench.gate_replay   # policy and old gate, every machine and load (about a minute)
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from saspec.engine import SpecEngine
from saspec.policy import SequencePolicy, StepCost, cpu_like, gpu_like

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


def compute_bound(n: int) -> float:
    """A fixed part worth four tokens, then every verified token costs as much as a row's own: a CPU."""
    return (4.0 + n) / 5.0


def batched(n: int) -> float:
    """One row's share of a compute-bound step at concurrency: a fixed part worth half a token, then a token's worth
    per token (a CPU serving 8 rows)."""
    return (0.5 + n) / 1.5


MACHINES: dict[str, Callable[[int], float]] = {
    "cheap verify (a GPU at small batch)": cheap,
    "compute-bound (a CPU: 4 + n)": compute_bound,
    "compute-bound at concurrency (a CPU serving 8 rows: 0.5 + n)": batched,
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


def replay(gate: Any, trace: dict[str, Any], cost: Cost, k: int = 8, branched: bool = True) -> dict[str, Any]:
    """Greedy decoding of ``trace``'s fixed output with SA drafts chosen by ``gate``, each offer saying
    whether its match branched (``SpecEngine.extend``'s ``branch_out``; never, without ``branched``).

    Returns ``choices`` (per step: match length, the gate's source, tokens verified), ``steps`` (per step:
    seconds, tokens emitted), the total ``time`` and the output's ``tokens``."""
    output = trace["output_ids"]
    engine = SpecEngine()
    engine.add_request(0, trace["prompt_ids"])
    engine.prepare([0])
    acc, lens = np.zeros((1, k + 1), np.int32), np.zeros(1, np.int32)
    match_out, draft_out, branch = np.zeros(1, np.int32), np.zeros((1, k), np.int32), np.zeros(1, np.int32)
    pos, total, choices, steps, new = 0, 0.0, [], [], []
    while pos < len(output):
        acc[0, : len(new)], lens[0] = new, len(new)
        engine.extend(acc, lens, match_out, draft_out, None, branch)
        draft = [int(t) for t in draft_out[0] if t >= 0]
        match = int(match_out[0])
        gate.offer(match, draft, branched and bool(branch[0]))
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


def summary(runs: list[dict[str, Any]], plain: list[float], long: int = 16) -> dict[str, float]:
    """Speed-up over plain decoding (``plain``: its time per run, under the same load), the share of steps
    with a match of at least ``long`` tokens that drafted, the share of steps that drafted at all, and the
    draft tokens verified in vain (``wasted``) and accepted."""
    steps = [c for r in runs for c in r["choices"]]
    longs = [c for c in steps if c[0] >= long]
    verified = sum(c[2] for c in steps)
    accepted = sum(n - 1 for r in runs for _, n in r["steps"])
    return {"x_plain": sum(plain) / sum(r["time"] for r in runs),
            "drafted_long": sum(c[2] > 0 for c in longs) / max(len(longs), 1),
            "drafted": sum(c[2] > 0 for c in steps) / max(len(steps), 1),
            "wasted": verified - accepted, "accepted": accepted}


def best_fixed(trace: dict[str, Any], cost: Cost, k: int = 8) -> float:
    """The time of the best of the fixed rules for this trace: every SA draft cut to d tokens, d = 0..k
    (an oracle that knows the trace and the machine)."""
    return min(replay(_Fixed(d), trace, cost, k)["time"] for d in range(k + 1))


class MatchCapped:
    """No more draft tokens than the match is long (``max_spec_factor`` 1, as vLLM's suffix drafter defaults),
    from a match of 2."""

    def offer(self, match: int, draft: Any, branched: bool = False) -> None:
        pass

    def choose(self, match: int, sa_len: int) -> tuple[str, int]:
        return ("sa", min(match, sa_len)) if match >= 2 and sa_len else ("none", 0)

    def observe_forward(self, tokens: int, seconds: float) -> None:
        pass

    def observe_tokens(self, tokens: Any) -> None:
        pass


class _Fixed:
    """The SA's draft cut to ``d`` tokens, every step."""

    def __init__(self, d: int) -> None:
        self.d = d

    def offer(self, match: int, draft: Any, branched: bool = False) -> None:
        pass

    def choose(self, match: int, sa_len: int) -> tuple[str, int]:
        return ("sa", min(self.d, sa_len)) if self.d and sa_len else ("none", 0)

    def observe_forward(self, tokens: int, seconds: float) -> None:
        pass

    def observe_tokens(self, tokens: Any) -> None:
        pass


LOADS = ("steady", "bursts", "competing")


def loaded(machine: Callable[[int], float], load: str, seed: int) -> Cost:
    """``machine`` under ``load``: steady; bursts (20% of steps 2-5x); a competing process (1/3 of steps 2-5x)."""
    if load == "steady":
        return lambda s, n: machine(n)
    return bursts(machine, seed=seed, share=0.2 if load == "bursts" else 1 / 3)


#: The token counts a profiled policy times up front (each 3 times, the minimum kept).
PROFILE_SIZES = (1, 2, 3, 5, 9)


def make(name: str, cost: Cost | None = None) -> Any:
    """A fresh policy: ``policy-cpu`` / ``policy-gpu`` (the prior shape of a CPU / a GPU), ``policy-profiled``
    (the shape profiled up front on ``cost``, under its load, with ``StepCost.profile``; the profile's own
    time is not counted), ``gate``, or ``match-capped`` (:class:`MatchCapped`). A name may end in
    ``-unbranched`` (see :func:`rule`)."""
    name = rule(name)[0]
    if name == "match-capped":
        return MatchCapped()
    if name == "gate":
        import warnings

        from .former_gate import CostGate

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return CostGate(8)
    if name == "policy-profiled":
        if cost is None:
            raise ValueError("policy-profiled needs the cost model to profile")
        clock, calls = [0.0], [0]

        def run_step(n: int) -> None:  # the profile's steps, before the replay's (negative step numbers)
            calls[0] += 1
            clock[0] += cost(-calls[0], n)

        return SequencePolicy(8, cost=StepCost.profile(run_step, PROFILE_SIZES, clock=lambda: clock[0]))
    return SequencePolicy(8, cost=StepCost(cpu_like if name == "policy-cpu" else gpu_like))


def rule(name: str) -> tuple[str, bool]:
    """(the rule, whether its offers say when their match branched): ``NAME-unbranched`` is ``NAME`` never told."""
    base = name.removesuffix("-unbranched")
    return base, base == name


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="the drafting policy replayed over real outputs")
    ap.add_argument("--rules", nargs="+", default=["policy-cpu", "policy-gpu", "policy-profiled",
                                                   "policy-profiled-unbranched", "gate", "match-capped"])
    ap.add_argument("--loads", nargs="+", default=list(LOADS))
    args = ap.parse_args()
    traces = load_traces()
    kinds = sorted({t["meta"]["workload"] for t in traces})
    print("| machine | load | workload | best fixed length (oracle), x plain | "
          + " | ".join(f"{r}: x plain / long drafted / drafted / in vain" for r in args.rules) + " |")
    print("|---|---|---|---:|" + "---:|" * len(args.rules))
    for name, machine in MACHINES.items():
        for load in args.loads:
            for kind in kinds:
                chosen = [(i, t) for i, t in enumerate(traces) if t["meta"]["workload"] == kind]
                plain = [plain_time(t, loaded(machine, load, i)) for i, t in chosen]
                oracle = sum(plain) / sum(best_fixed(t, loaded(machine, load, i)) for i, t in chosen)
                cells = []
                for r in args.rules:
                    runs = [replay(make(r, loaded(machine, load, i)), t, loaded(machine, load, i), branched=rule(r)[1])
                            for i, t in chosen]
                    s = summary(runs, plain)
                    cells.append(f"{s['x_plain']:.2f}x / {s['drafted_long']:.0%} / {s['drafted']:.0%} / {s['wasted']}")
                print(f"| {name} | {load} | {kind} | {oracle:.2f}x | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
