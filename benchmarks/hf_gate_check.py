"""The transformers integration with its defaults, as a new user runs it, on the real Qwen2.5-Coder-1.5B.

Three code edits the project's workloads do not hold (each asks to edit a standard-library function given in
full) and one free-form question, greedy, fp32, the model loaded with ``from_pretrained`` as a user loads it.
Per prompt, back to back (interleaved, one run): plain ``generate``, transformers' prompt lookup
(``prompt_lookup_num_tokens=10``) and assisted decoding (the 0.5B), then ``custom_generate=saspec.integrations.hf.generate``
with its defaults (the policy), with ``saspec_policy=False``, and the hybrid (``assistant_model=0.5B``) with and
without the policy. Each method first runs once untimed (8 tokens), so that no timed call compiles saspec's
kernels. Every output is checked against plain's. tok/s counts the whole call, prefill included.

    python benchmarks/hf_gate_check.py [--out DIR] [--new-tokens N]   # after `saspec models install`; ~21 minutes
    python benchmarks/hf_gate_check.py --prompts edit-type-hints --methods saspec,saspec-hybrid --rounds 3 --out DIR
"""

from __future__ import annotations

import argparse
import calendar
import fnmatch
import inspect
import json
import platform
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import saspec.integrations.hf as sahf
from saspec_bench import models

EDITS = (
    ("rename", "Rename the parameter `path` to `search_path` everywhere in this function and return the full updated "
               "function, nothing else.", shutil.which),
    ("type-hints", "Add a type hint to every parameter and to the return value of this function. Return the full "
                   "updated function, nothing else.", fnmatch.translate),
    ("logging", "Add a `logger.debug(...)` call at the start of this function that logs its arguments. Return the full "
                "updated function, nothing else.", calendar.monthrange),
)
FREE = "Explain in a few paragraphs why the sky is blue and why sunsets are red."

METHODS = {  # name -> extra generate() keywords; "assistant" is replaced by the draft model
    "plain": {},
    "hf-prompt-lookup": {"prompt_lookup_num_tokens": 10},
    "hf-assisted": {"assistant_model": "assistant"},
    "saspec": {"custom_generate": sahf.generate},
    "saspec-no-policy": {"custom_generate": sahf.generate, "saspec_policy": False},
    "saspec-hybrid": {"custom_generate": sahf.generate, "assistant_model": "assistant"},
    "saspec-hybrid-no-policy": {"custom_generate": sahf.generate, "assistant_model": "assistant",
                                "saspec_policy": False},
}


def prompts(tok) -> list[tuple[str, str, list[int]]]:
    out = []
    for name, instruction, fn in EDITS:
        source = textwrap.dedent(inspect.getsource(fn))
        msg = [{"role": "user", "content": f"{instruction}\n\n```python\n{source}```"}]
        out.append((f"edit-{name}", "code-edit", tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=True,
                                                                         return_dict=False)))
    msg = [{"role": "user", "content": FREE}]
    out.append(("free-0", "free-form", tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=True,
                                                              return_dict=False)))
    return out


class Counter:
    """Counts a model's forwards while active."""

    def __init__(self, model) -> None:
        self.model, self.n = model, 0

    def __enter__(self):
        self.handle = self.model.register_forward_hook(lambda *a: setattr(self, "n", self.n + 1))
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def run(target, draft, ids: list[int], new_tokens: int, method: str) -> dict:
    kw = {k: (draft if v == "assistant" else v) for k, v in METHODS[method].items()}
    drafter = None
    if kw.get("custom_generate"):  # the drafter the call would build, given to it to read its counts
        drafter = kw["saspec_drafter"] = sahf.drafter_for(target.device.type, "assistant_model" in kw,
                                                          saspec_policy=kw.pop("saspec_policy", None))
    x = torch.tensor([ids])
    try:
        with Counter(target) as f, Counter(draft) as d:
            t0 = time.perf_counter()
            out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new_tokens,
                                  temperature=None, top_p=None, top_k=None, **kw)
            wall = time.perf_counter() - t0
    finally:
        if drafter is not None:
            drafter.close()
    tokens = out[0, len(ids):].tolist()
    stats = drafter.stats() if drafter is not None and drafter.policy is not None else None
    return {"method": method, "tokens": tokens, "new_tokens": len(tokens), "wall_s": wall,
            "tok_per_s": len(tokens) / wall, "target_forwards": f.n, "draft_forwards": d.n, "policy": stats}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/hf/policy-defaults", help="output directory")
    p.add_argument("--new-tokens", type=int, default=160)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--prompts", default=None, help="comma-separated prompt names (default: all)")
    p.add_argument("--rounds", type=int, default=1, help="run the methods of each prompt this many times, alternated")
    args = p.parse_args()
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or args.rounds < 1:
        p.error(f"unknown methods {unknown}" if unknown else f"--rounds must be >= 1, got {args.rounds}")
    t_spec, d_spec = models.family("qwen2.5-coder")
    models.offline()
    target = AutoModelForCausalLM.from_pretrained(str(models.converted_dir(t_spec)), dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(models.converted_dir(d_spec)), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(models.converted_dir(t_spec)))
    runs = []
    chosen = prompts(tok)
    if args.prompts:
        names = args.prompts.split(",")
        unknown = sorted(set(names) - {n for n, _, _ in chosen})
        if unknown:
            p.error(f"unknown prompts {unknown}")
        chosen = [c for c in chosen if c[0] in names]
    for method in methods:  # untimed: numba compiles saspec's kernels at their first call (cold cache: seconds)
        run(target, draft, chosen[0][2], 8, method)
    for name, kind, ids in chosen:
        plain = None
        for method in methods * args.rounds:
            r = run(target, draft, ids, args.new_tokens, method)
            plain = plain or r
            r.update(prompt=name, kind=kind, prompt_tokens=len(ids), same_as_plain=r["tokens"] == plain["tokens"],
                     x_plain=r["tok_per_s"] / plain["tok_per_s"])
            runs.append(r)
            print(f"{name:16s} {method:22s} {r['new_tokens']:4d} tok {r['tok_per_s']:6.2f} tok/s {r['x_plain']:5.2f}x "
                  f"plain, {r['target_forwards']:4d} target / {r['draft_forwards']:4d} draft forwards, "
                  f"same {r['same_as_plain']}{'' if r['policy'] is None else ', policy ' + str(r['policy'])}",
                  flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = {"commit": commit, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(), "new_tokens": args.new_tokens}
    (out / "results.json").write_text(json.dumps({"info": info, "runs": runs}, indent=1))
    lines = [f"# transformers integration, defaults ({commit}, torch {torch.__version__}, "
             f"{info['threads']} threads, fp32, {args.new_tokens} new tokens)", "",
             f"| prompt | method | tokens | tok/s | x {methods[0]} | target forwards | draft forwards | same as {methods[0]} | policy "
             "steps (automaton / neural / none) |", "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for r in runs:
        g = r["policy"]  # one row a step; the last step (the last forward's tokens) drafts nothing
        steps = "" if g is None else f"{g['policy_automaton_rows']} / {g['policy_neural_rows']} / {g['policy_none_rows']}"
        lines.append(f"| {r['prompt']} | {r['method']} | {r['new_tokens']} | {r['tok_per_s']:.2f} | "
                     f"{r['x_plain']:.2f}x | {r['target_forwards']} | {r['draft_forwards']} | {r['same_as_plain']} | "
                     f"{steps} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/results.md and results.json")


if __name__ == "__main__":
    main()
