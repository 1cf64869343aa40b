"""The transformers integration on the real 1.5B, fp32, on this CPU, loaded as a user loads it (no routed linears): plain generate vs custom_generate=saspec.integrations.hf.generate (default, no gate, unrouted), interleaved per prompt.

    python benchmarks/hf_cpu_check.py   # after `saspec models install`; about 7 minutes on 2 cores
"""
import sys, time, torch
import saspec.integrations.hf as sahf
from saspec.evidence import models, workloads as wl
from saspec.evidence.e2e import FREE_FORM_PROMPTS, bench_prompts
from saspec.evidence.tokenizers import get_tokenizer
torch.set_num_threads(2)
t, d = models.family("qwen2.5-coder")
target, tok = models.load(t, "float32", fast_verify=False)
code = bench_prompts(get_tokenizer(), 1, 0, 0)[0]["prompt_ids"]
jobs = [("free-0", tok.encode(wl.chat_prompt([("user", FREE_FORM_PROMPTS[0])])), 100), ("code-0", code, 300)]
for name, ids, n in jobs:
    x = torch.tensor([ids])
    base = None
    for label, kw in (("plain", None), ("sahf default", {}), ("sahf no-gate", {"saspec_gate": False}),
                      ("sahf unrouted", {"saspec_fast_verify": False}), ("plain", None)):
        t0 = time.perf_counter()
        if kw is None:
            out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, temperature=None, top_p=None, top_k=None)
        else:
            out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, custom_generate=sahf.generate, temperature=None, top_p=None, top_k=None, **kw)
        dt = time.perf_counter() - t0
        new = out.shape[1] - x.shape[1]
        base = base or (new / dt)
        print(f"{name} {label:13s} {new} tok {new/dt:.2f} tok/s {new/dt/base:.2f}x", flush=True)
