"""What one step of saspec's loop costs on the real target, by the tokens in it, and the Python
loop's own share: ``llama_decode`` alone (a prepared batch, logits at every row) against the
loop's step (``Context.decode`` with ``want_from=0``, greedy ``Sampler.verify``, ``truncate``),
each the minimum of 5, after a 239-token prompt. Run in the llama-cpp-python venv, under the lock::

    PYTHONPATH=src:bench/src flock /tmp/saspec-cpu.lock /work/venvs/llama/bin/python \\
        benchmarks/llama_cpp/step_cost.py benchmarks/llama_cpp/step_cost.json
"""

from __future__ import annotations

import json
import sys
import time

import llama_cpp
import numpy as np
from llama_cpp import Llama

from saspec.integrations.llama_cpp import Context, Sampler
from saspec_bench import models
from saspec_bench.prompts import bench_prompts
from saspec_bench.tokenizers import get_tokenizer


def main() -> int:
    target, _ = models.family("qwen2.5-coder")
    prompt = bench_prompts(get_tokenizer(), 1, 0, 0, 0)[0]["prompt_ids"]
    m = Llama(model_path=str(models.gguf_path(target)), n_ctx=8192, n_batch=512, n_threads=2, n_threads_batch=2,
              verbose=False)
    ctx = Context(m)
    ctx.truncate(0)
    ctx.decode(prompt, want_last=True)
    base = ctx.n_past
    greedy = Sampler()
    raw = llama_cpp.llama_batch_init(64, 0, 1)
    rows = []
    for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32):
        toks = prompt[:n]
        loop_s, raw_s = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            out = ctx.decode(toks, want_from=0)
            greedy.verify(out, toks[1:])
            ctx.truncate(base)
            loop_s.append(time.perf_counter() - t0)
            raw.n_tokens = n
            for i in range(n):
                raw.token[i], raw.pos[i], raw.n_seq_id[i], raw.logits[i] = toks[i], base + i, 1, 1
                raw.seq_id[i][0] = 0
            t0 = time.perf_counter()
            assert llama_cpp.llama_decode(m.ctx, raw) == 0
            raw_s.append(time.perf_counter() - t0)
            llama_cpp.llama_memory_seq_rm(ctx.memory, 0, base, -1)
        rows.append({"n": n, "step_s": min(loop_s), "llama_decode_s": min(raw_s)})
        print(f"{n:3d} tokens: step {1e3 * min(loop_s):7.1f} ms, llama_decode {1e3 * min(raw_s):7.1f} ms, "
              f"loop overhead {1e3 * (min(loop_s) - min(raw_s)):5.2f} ms", flush=True)
    table = {str(r["n"]): r["step_s"] for r in rows}
    out = {"prompt_tokens": len(prompt), "rows": rows, "table": table}
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
