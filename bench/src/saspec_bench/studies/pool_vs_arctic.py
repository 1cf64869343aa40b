"""saspec's cross-request pool against ArcticInference's global suffix tree, on the same traces.

Greedy acceptance in arrival order, one request at a time (as ``saspec simulate``'s
pool table, ``saspec_bench/pool_sim.py``): each step a drafter proposes up to K tokens,
the accepted ones are the common prefix with the recorded output, and the text
grows by them plus one token of the target's own. AL is output tokens per step.

* saspec: ``SpecEngine`` with no pool, and with a ``RequestPool`` of the outputs;
* Arctic: ``SuffixDecodingCache`` as vLLM's ``method: "suffix"`` configures it
  (tree depth 24, 10,000 cached responses, ``max_spec_factor`` 1.0,
  ``min_token_prob`` 0.1), with its global tree off (``max_cached_requests=0``)
  and on; its drafts are capped at K too.

ArcticInference is a peer, built outside the repository from its PyPI sdist
(BENCHMARKS.md, "Drafting cost per step", says how) and found on PYTHONPATH.

Usage: PYTHONPATH=/path/to/arctic python -m saspec_bench.studies.pool_vs_arctic [--k 8] [--n 60]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from saspec import RequestPool
from saspec_bench import workloads as wl
from saspec_bench.datafiles import CROSS_REQUESTS_PATH
from saspec_bench.pool_sim import accepted_prefix, arrival_order
from saspec_bench.positions import Flat
from saspec_bench.datafiles import REAL_OUTPUTS_PATH
from saspec_bench.prompts import split_workloads
from saspec_bench.tokenizers import get_tokenizer

DEPTH, CACHED, FACTOR, MIN_PROB = 24, 10_000, 1.0, 0.1  # vLLM 0.32's suffix defaults


def arctic_arrival_order(flat: Flat, k: int, cached: int) -> float:
    """AL of ArcticInference's cache over ``flat``'s traces in order."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=DEPTH, max_cached_requests=cached)
    steps = 0
    for i, prompt in enumerate(flat.prompts):
        out = flat.tokens[flat.offsets[i]: flat.offsets[i + 1]]
        cache.start_request(i, prompt.astype(np.int32))
        text = prompt.astype(np.int32).tolist()
        q = 0
        while q < out.shape[0]:
            d = cache.speculate(i, np.asarray(text[-DEPTH:], np.int32), max_spec_tokens=k, max_spec_factor=FACTOR,
                                min_token_prob=MIN_PROB).token_ids
            a = accepted_prefix(d, out, q)
            new = out[q: q + a + 1]
            cache.add_active_response(i, new.astype(np.int32))
            text += new.tolist()
            q += new.shape[0]
            steps += 1
        cache.stop_request(i)
    return flat.tokens.shape[0] / steps


def workloads(n: int) -> dict[str, Flat]:
    tok = get_tokenizer()
    out = {name: Flat.of(wl.build_workload(name, tok, n, seed=0).traces) for name in ("humaneval", "code-edits", "chat")}
    for path in (REAL_OUTPUTS_PATH, CROSS_REQUESTS_PATH):
        if path.is_file():
            out.update({name: Flat.of(w.traces) for name, w in split_workloads(path).items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=8, help="draft tokens per step")
    ap.add_argument("--n", type=int, default=60, help="requests per built workload")
    ap.add_argument("--pool-tokens", type=int, default=1 << 20, help="saspec's pool size")
    args = ap.parse_args()
    print(f"K = {args.k}, greedy acceptance, arrival order; AL (output tokens per step)")
    print("| workload | requests | saspec | saspec + pool | Arctic, no global tree | Arctic + global tree "
          "| saspec + pool / Arctic + global |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, flat in workloads(args.n).items():
        t0 = time.perf_counter()
        own = arrival_order(flat, args.k, None, "near-first")["al"]
        pooled = arrival_order(flat, args.k, RequestPool(args.pool_tokens), "near-first")["al"]
        a_local = arctic_arrival_order(flat, args.k, 0)
        a_global = arctic_arrival_order(flat, args.k, CACHED)
        print(f"| {name} | {len(flat.prompts)} | {own:.3f} | {pooled:.3f} | {a_local:.3f} | {a_global:.3f} "
              f"| {pooled / a_global:.3f} |  <!-- {time.perf_counter() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
