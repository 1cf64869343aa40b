"""The step-time tail of a batch that outgrows its blobs (``saspec bench --only tail``'s case).

    PYTHONPATH=<tree>/src:<this checkout>/bench/src python benchmarks/reliability/tail_latency.py

64 code-like prompts of 4,096 tokens, 3 accepted tokens a step, 1,500 steps, no hint."""

from __future__ import annotations

import json

from saspec_bench.commands.bench import bench_tail, warm_up

if __name__ == "__main__":
    warm_up()
    print(json.dumps(bench_tail(), indent=1))
