#!/usr/bin/env python3
"""The loop's gated drafters with an earlier ``CostGate`` against the current one, on the
prompts and settings of ``saspec bench-e2e -k 32 --dtype float32`` (Qwen2.5-Coder 1.5B target,
0.5B draft model, code edits up to 300 new tokens, free-form up to 200).

    python3 benchmarks/gate_ab.py --old e86b6f5 --mode plain --out gate_ab.json
    python3 benchmarks/gate_ab.py --old e86b6f5 --mode spike --out gate_spike.json

``--mode plain``: hybrid and SA on 4 code edits and 3 free-form prompts, two rounds, the
two gates interleaved per prompt (old then current, then current then old).
``--mode spike``: the hybrid on the 4 code edits, once per gate, with one slow forward
injected: the first 2-token forward of each generation (the gate's first probe) takes
1.5x, then 3x, as long. Prints one JSON line per run; every output must be the same
across gates (greedy decoding). Needs ``saspec models install`` and about 30 minutes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def old_gate(rev: str):
    """``CostGate`` as of git revision ``rev`` (its select.py loaded as a module of saspec)."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/saspec/select.py"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "select_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("saspec._select_old", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.CostGate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="git revision whose CostGate is the baseline")
    ap.add_argument("--mode", choices=("plain", "spike"), default="plain")
    ap.add_argument("--out", default="gate_ab.json")
    args = ap.parse_args()

    import torch

    from saspec.evidence import generate as gen
    from saspec.evidence import models
    from saspec.evidence.e2e import bench_prompts
    from saspec.evidence.tokenizers import get_tokenizer
    from saspec.select import CostGate

    gates = {"old": old_gate(args.old), "new": CostGate}
    slow = {"spike": 1.0, "done": False}
    forward = gen.CausalLM.forward

    def slow_forward(self, feed, *a, **kw):  # the first 2-token forward after the prefill takes `spike` x as long
        t = time.perf_counter()
        out = forward(self, feed, *a, **kw)
        if len(feed) == 2 and not slow["done"] and self.forwards > 1:
            slow["done"] = True
            time.sleep((slow["spike"] - 1.0) * (time.perf_counter() - t))
        return out

    gen.CausalLM.forward = slow_forward
    torch.set_num_threads(2)
    tspec, dspec = models.family("qwen2.5-coder")
    target = models.load(tspec, "float32")[0]
    draft = models.load(dspec, "float32")[0]
    if args.mode == "plain":
        prompts = bench_prompts(get_tokenizer(), 4, 3, 0)
        plan = [(1.0, rnd, p, m, v) for rnd, order in enumerate((("old", "new"), ("new", "old")))
                for p in prompts for m in ("hybrid", "sa") for v in order]
    else:
        prompts = bench_prompts(get_tokenizer(), 4, 0, 0)
        plan = [(s, 0, p, "hybrid", v) for s in (3.0, 1.5) for p in prompts for v in ("old", "new")]
    rows = []
    for spike, rnd, p, method, variant in plan:
        gen.CostGate = gates[variant]
        slow.update(spike=spike, done=False)
        drafter = gen.make_drafter(method, draft_model=draft, k=32, draft_k=8, stop_below=0.4, gate=True)
        res = gen.speculative_generate(target, p["prompt_ids"], drafter, 300 if p["kind"] == "code-edit" else 200)
        s = res.stats
        row = {"spike": spike, "round": rnd, "prompt": p["id"], "kind": p["kind"], "method": method, "gate": variant,
               "tokens": s.new_tokens, "al": round(s.al, 2), "tok_per_s": round(s.tok_per_s, 3),
               "decode_tok_per_s": round(s.decode_tok_per_s, 3), "steps": s.steps, "drafted": s.drafted,
               "out_hash": hash(tuple(res.tokens))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    same = all(len({r["out_hash"] for r in rows if r["prompt"] == p}) == 1 for p in {r["prompt"] for r in rows})
    print("outputs identical across gates:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
