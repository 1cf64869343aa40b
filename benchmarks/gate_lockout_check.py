"""The lock-out on the real model: the gate when its first multi-token forwards are slow (a cold process, a burst).

``model.generate(custom_generate=saspec.integrations.hf.generate)`` with its defaults on the real
Qwen2.5-Coder-1.5B (fp32, loaded with ``from_pretrained``), one code edit, greedy; a forward pre-hook makes the
first two multi-token target forwards of each call ``--slow`` times as long (it sleeps), so the gate's first
timings of a verify are slow. Run once per saspec tree (``--tree``: a checkout's ``src``; the default is this
one), each in a fresh process, against plain ``generate`` and ``saspec_gate=False`` in the same process.

    python benchmarks/gate_lockout_check.py --tree /path/to/old/checkout/src --tree src   # ~6 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import calendar, inspect, json, sys, textwrap, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
import saspec, saspec.integrations.hf as sahf
from saspec_bench import models
slow, new_tokens = float(sys.argv[1]), int(sys.argv[2])
spec, _ = models.family("qwen2.5-coder")
models.offline()
path = str(models.converted_dir(spec))
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
tok = AutoTokenizer.from_pretrained(path)
source = textwrap.dedent(inspect.getsource(calendar.monthrange))
msg = [{"role": "user", "content": "Add a `logger.debug(...)` call at the start of this function that logs its "
        f"arguments. Return the full updated function, nothing else.\n\n```python\n{source}```"}]
ids = tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=True, return_dict=False)
state = {"slow_left": 0, "t0": 0.0, "forwards": 0}
def pre(mod, args, kwargs):
    state["t0"] = time.perf_counter()
def post(mod, args, kwargs, out):
    state["forwards"] += 1
    n = kwargs["input_ids"].shape[1]
    if 1 < n <= 33 and state["slow_left"] > 0:  # a verify, not the prefill
        state["slow_left"] -= 1
        time.sleep((slow - 1.0) * (time.perf_counter() - state["t0"]))
model.register_forward_pre_hook(pre, with_kwargs=True)
model.register_forward_hook(post, with_kwargs=True)
out = {"saspec": saspec.__file__}
x = torch.tensor([ids])
for name, kw in (("plain", {}), ("gate", {"custom_generate": sahf.generate}),
                 ("no-gate", {"custom_generate": sahf.generate, "saspec_gate": False})):
    state.update(slow_left=2, forwards=0)
    t0 = time.perf_counter()
    y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new_tokens,
                       temperature=None, top_p=None, top_k=None, **kw)
    wall = time.perf_counter() - t0
    n = y.shape[1] - x.shape[1]
    out[name] = {"tok_per_s": n / wall, "forwards": state["forwards"], "tokens": y[0, x.shape[1]:].tolist()}
print(json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", help="a saspec checkout's src directory (repeat); default: this one")
    p.add_argument("--slow", type=float, default=3.0, help="how many times as long the first two verifies take")
    p.add_argument("--new-tokens", type=int, default=120)
    args = p.parse_args()
    for tree in args.tree or ["src"]:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
        res = subprocess.run([sys.executable, "-c", CHILD, str(args.slow), str(args.new_tokens)], env=env,
                             capture_output=True, text=True, check=True)
        r = json.loads(res.stdout.strip().splitlines()[-1])
        plain = r["plain"]["tok_per_s"]
        for m in ("plain", "gate", "no-gate"):
            same = r[m]["tokens"] == r["plain"]["tokens"]
            print(f"{r['saspec']}: {m:8s} {r[m]['tok_per_s']:.2f} tok/s = {r[m]['tok_per_s'] / plain:.2f}x plain, "
                  f"{r[m]['forwards']} target forwards, same output {same}", flush=True)


if __name__ == "__main__":
    main()
