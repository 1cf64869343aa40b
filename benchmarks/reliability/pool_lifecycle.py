"""Pools left behind: build and drop 40 engines with ``pool_tokens``, then count the
live RequestPools, the threads and the process's RSS.

    PYTHONPATH=<tree>/src:<tree>/bench/src python benchmarks/reliability/pool_lifecycle.py

Each engine: one 4,096-token code-like request decoding 60 steps of 3 tokens, removed
(its output joins the pool), the pool flushed, the engine dropped."""

from __future__ import annotations

import gc
import json
import threading

import numpy as np

from saspec import RequestPool, SpecEngine
from saspec_bench.synthetic import code_like_prompt


def rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(engines: int = 40) -> dict:
    prompt = code_like_prompt(4096, seed=0)
    acc = np.zeros((1, 9), np.int32)
    lens, m, d = np.full(1, 3, np.int32), np.zeros(1, np.int32), np.zeros((1, 8), np.int32)
    start = {"threads": threading.active_count(), "rss_mb": rss_mb()}
    for i in range(engines):
        eng = SpecEngine(pool_tokens=1 << 20)
        eng.add_request(i, prompt)
        eng.prepare([i])
        for s in range(60):
            acc[0, :3] = prompt[3 * s: 3 * s + 3]
            eng.extend(acc, lens, m, d)
        eng.remove_request(i)
        eng.request_pool.flush()
        if i == 0:
            start["rss_after_first_mb"] = rss_mb()
        del eng
    gc.collect()
    for t in threading.enumerate():  # a dropped pool's thread ends on its own: wait for it, bounded
        if t.name == "saspec-pool":
            t.join(10)
    pools = sum(isinstance(o, RequestPool) for o in gc.get_objects())
    return {"engines": engines, "start": start, "live_pools": pools, "threads": threading.active_count(),
            "pool_threads": sum(t.name == "saspec-pool" for t in threading.enumerate()), "rss_mb": rss_mb()}


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
