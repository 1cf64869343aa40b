"""Replay saspec's automaton drafts over the plain outputs of a ``bench-llama-cpp`` run, priced
by a measured step-cost table, to choose the drafter's K / min_match / length scale without
timing noise (greedy: the loop emits plain's tokens, so the accepted lengths are exact).

    PYTHONPATH=src:bench/src python benchmarks/llama_cpp/replay_drafts.py benchmarks/llama_cpp/run1 \\
        benchmarks/llama_cpp/step_cost.json

``step_cost.json``: what ``step_cost.py`` writes (its "table": tokens in the step -> seconds).
Prints, per prompt kind and setting, the predicted time relative to plain (one token per step).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from saspec.integrations.llama_cpp.drafter import SADraftModel
from saspec_bench.prompts import bench_prompts
from saspec_bench.tokenizers import get_tokenizer


def cost_fn(table: dict[str, float]):
    xs = np.array(sorted(int(k) for k in table))
    ys = np.array([table[str(x)] for x in xs])
    return lambda n: float(np.interp(n, xs, ys))


def replay(prompt: list[int], out: list[int], d: SADraftModel, cost) -> tuple[float, int, int]:
    d.begin(prompt)
    i, t, drafted, steps = 1, 0.0, 0, 0
    new = out[:1]
    while i < len(out):
        draft = d.propose(new)[: len(out) - i - 1 + 1]
        a = 0
        while a < len(draft) and i + a < len(out) and draft[a] == out[i + a]:
            a += 1
        t += cost(1 + len(draft))
        drafted += len(draft)
        steps += 1
        new = out[i: i + a + 1]
        i += a + 1
    return t, drafted, steps


def main() -> int:
    run = Path(sys.argv[1])
    cost = cost_fn(json.loads(Path(sys.argv[2]).read_text())["table"])
    res = json.loads((run / "results.json").read_text())
    argv = res["info"]["argv"]

    def opt(name, default):
        return int(argv[argv.index(name) + 1]) if name in argv else default

    prompts = {p["id"]: p for p in bench_prompts(get_tokenizer(), opt("--code-prompts", 2), opt("--free-prompts", 1),
                                                  opt("--seed", 0), opt("--multi-turn-prompts", 2))}
    plain = [r for r in res["runs"] if r["method"] == "plain"]
    # K + 1 tokens per step at most 32: the step-cost table ends there (np.interp would clamp beyond)
    settings = [(k, mm, sc) for k in (8, 16, 24, 31) for mm in (1, 2, 3, 4, 6) for sc in (1.0, 2.0, 4.0)]
    by_kind: dict[tuple, list[float]] = {}
    for k, mm, sc in settings:
        for r in plain:
            p = prompts[r["id"]]
            t, drafted, steps = replay(p["prompt_ids"], r["tokens"], SADraftModel(k, min_match=mm, length_scale=sc), cost)
            base = cost(1) * (len(r["tokens"]) - 1)
            by_kind.setdefault((p["kind"], k, mm, sc), []).append((t, base))
    for kind in sorted({key[0] for key in by_kind}):
        rows = sorted(((sum(b for _, b in v) / sum(t for t, _ in v), key) for key, v in by_kind.items() if key[0] == kind),
                      reverse=True)
        print(f"## {kind}: predicted decode speed-up over plain (best 8, then K=16 mm=1 sc=2)")
        for x, key in rows[: int(__import__("os").environ.get("TOP", "8"))]:
            print(f"  K={key[1]} min_match={key[2]} scale={key[3]}: {x:.2f}x")
        for x, key in rows:
            if key[1:] == (16, 1, 2.0):
                print(f"  default K=16 min_match=1 scale=2: {x:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
