"""The drafting policy's forwards on a tiny random model, in fresh processes, with the real clock.

A tiny random Qwen2 (hidden 64, 2 layers, fp32) after a prompt that repeats a 30-token block, 60 new tokens,
``model.generate(custom_generate=saspec.integrations.hf.generate)`` with the policy (the default) and with
``saspec_policy=False`` (the fixed rule). Each process builds the same model and prompt (fixed seeds) and runs
both once; the policy's choices follow the step times it measures, so they can differ between processes.
``--competing`` keeps CPU-bound processes busy meanwhile (``--busy`` busy loops, default one: on a 2-core machine
the other core; two keep both cores busy, as a test suite running beside it does). ``--calls`` policy calls per
process (each against the fixed rule's).

    python benchmarks/gate_tiny_processes.py [N] [--competing [--busy B]] [--calls C]   # N processes (default 10)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, numpy as np, torch, transformers
import saspec.integrations.hf as sahf
torch.manual_seed(3)
cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                               tie_word_embeddings=False, use_cache=True, bos_token_id=None, eos_token_id=None)
model = transformers.Qwen2ForCausalLM(cfg).float().eval()
model.generation_config.pad_token_id = 0
prompt = np.random.default_rng(0).integers(1, 512, 30).tolist() * 4
count = [0]
model.register_forward_hook(lambda *a: count.__setitem__(0, count[0] + 1))
out = {"policy": [], "fixed": []}
for name, policy in [("policy", True)] * CALLS + [("fixed", False)]:
    count[0] = 0
    ids = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=60,
                         custom_generate=sahf.generate, saspec_policy=policy)
    out[name].append({"forwards": count[0], "tokens": ids[0, len(prompt):].tolist()})
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=10, help="fresh processes")
    ap.add_argument("--competing", action="store_true", help="busy loops run meanwhile")
    ap.add_argument("--busy", type=int, default=1, help="how many busy loops with --competing")
    ap.add_argument("--calls", type=int, default=1, help="policy calls per process")
    a = ap.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy if a.competing else 0)]
    try:
        run(a.n, a.calls)
    finally:
        for p in busy:
            p.kill()


def run(n: int, calls: int) -> None:
    rows = []
    for i in range(n):
        res = subprocess.run([sys.executable, "-c", f"CALLS = {calls}\n" + CHILD], capture_output=True, text=True,
                             check=True)
        r = json.loads(res.stdout.strip().splitlines()[-1])
        fixed = r["fixed"][0]
        for call in r["policy"]:
            rows.append((call["forwards"], fixed["forwards"], call["tokens"] == fixed["tokens"]))
        print(f"process {i}: policy {[c['forwards'] for c in r['policy']]} forwards, fixed rule {fixed['forwards']}, "
              f"same output {all(s for _, _, s in rows[-calls:])}", flush=True)
    worst = max(g / f for g, f, _ in rows)
    print(f"policy forwards per call: {[g for g, _, _ in rows]}; fixed rule: {sorted(set(f for _, f, _ in rows))}; "
          f"worst ratio {worst:.2f}; outputs identical: {all(s for _, _, s in rows)}")


if __name__ == "__main__":
    main()
