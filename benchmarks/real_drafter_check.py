"""Check, with real models, that the simulator's draft-model and hybrid steps equal the loop's.

For the first N traces of a recorded file (``saspec record-traces``), run
``generate.speculative_generate`` with the SA alone (K=8, and up to 32 with the
per-match rule), the draft model alone (K=3 and K=8) and with the SA +
draft-model hybrid, and compare the target forwards with the
costed walk over the stored runs (``evidence.realsim.run_costed``). The loop
is run to each trace's length without EOS so that it replays exactly the
recorded output; a trace whose output the loop does not reproduce (a
floating-point near-tie in the target) is reported and skipped.

    python benchmarks/real_drafter_check.py [--traces bench/src/saspec_bench/data/real_outputs.jsonl.gz] [-n 6]

Uses the installed Qwen2.5-Coder models (fp32) unless --target-dir/--draft-dir are given.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main() -> int:
    from saspec_bench import realsim
    from saspec_bench.costmodel import gpu_like_profile
    from saspec_bench.loop import SAModelDrafter, ModelDrafter, SADrafter, speculative_generate
    from saspec_bench.lm import load_models
    from saspec_bench.datafiles import REAL_OUTPUTS_PATH
    from saspec_bench.positions import Flat
    from saspec_bench.workloads import load_traces

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default=str(REAL_OUTPUTS_PATH))
    ap.add_argument("-n", type=int, default=6, help="traces to check (the shortest first)")
    ap.add_argument("--family", default="qwen2.5-coder")
    ap.add_argument("--target-dir")
    ap.add_argument("--draft-dir")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    target, draft, _, _, _ = load_models(args)
    traces = sorted(load_traces(args.traces).traces, key=lambda t: t.output.size)[: args.n]
    prof = gpu_like_profile()
    configs = [("sa K=8", lambda: SADrafter(8), dict(mode="sa", k_sa=8)),
               ("sa K=32 per-match 2", lambda: SADrafter(32, per_match=2.0),
                dict(mode="sa", k_sa=32, rule="per-match", scale=2.0)),
               ("draft-model K=3", lambda: ModelDrafter(draft, k=3), dict(mode="neural", k_nn=3)),
               ("draft-model K=8", lambda: ModelDrafter(draft, k=8), dict(mode="neural", k_nn=8)),
               ("hybrid T=4 K=8", lambda: SAModelDrafter(SADrafter(8), ModelDrafter(draft, k=8), 4),
                dict(mode="hybrid", k_nn=8, k_sa=8, threshold=4)),
               ("hybrid T=4 K=8 patience 3 per-match 2",
                lambda: SAModelDrafter(SADrafter(32, per_match=2.0), ModelDrafter(draft, k=8), 4, 3),
                dict(mode="hybrid", k_nn=8, k_sa=32, threshold=4, patience=3, rule="per-match", scale=2.0))]
    bad = 0
    for i, t in enumerate(traces):
        arr = realsim.Arrays(Flat.of([t]), np.zeros(t.output.size, np.int32))
        for name, make, kw in configs:
            res = speculative_generate(target, t.prompt.tolist(), make(), int(t.output.size), eos_ids=())
            if res.tokens != t.output.tolist():
                print(f"trace {i}: the loop's output differs from the recorded one (near-tie); skipped")
                break
            sim = realsim.run_costed(arr, prof, 1, **kw)
            ok = sim["steps"] == res.stats.target_forwards
            bad += not ok
            print(f"trace {i} ({t.output.size} tokens) {name}: loop {res.stats.target_forwards} forwards "
                  f"(AL {res.stats.al:.3f}), simulator {sim['steps']} {'OK' if ok else 'MISMATCH'}")
    print("all equal" if not bad else f"{bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
