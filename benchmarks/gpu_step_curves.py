#!/usr/bin/env python3
"""Step-cost curves of real architectures on a GPU, as curve files the served replay reads.

    python3 benchmarks/gpu_step_curves.py --out DIR               # both models (gpu_check.py allows 150 s)
    python -m saspec_bench.served_sim RUNS... --curve DIR/qwen2.5-coder-1.5b.json DIR/qwen2.5-coder-7b.json

Each model is ``Qwen2ForCausalLM`` built from the Qwen2.5-Coder 1.5B or 7B configuration with random weights (the
weights do not change a forward's time), bf16, sdpa attention. A step of B rows of t tokens is the forward over
[B, t] new tokens after ``--context`` cached ones (a ``StaticCache``: every row attends over the same cache length)
with logits for every token, as a verifying step needs them. It is captured in a CUDA graph, as serving engines run
their decode steps (an eager forward of a small batch mostly waits for kernel launches), and replayed
``--repeats`` times between CUDA events: the median. Where capture fails the eager time stands in (``mode``).

Writes, per model, ``DIR/<model>.grid.json`` (every shape: batch, tokens a row, seconds graphed and eager) and
``DIR/<model>.json``, a curve file (``saspec_bench.step_curves``): for each token count B x t the median over the
shapes that give it, made not to fall with the tokens (a step with more tokens is not cheaper; the differences
between shapes of one count are the attention's), prior ``gpu``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "src"))  # saspec_bench.step_curves (numpy only) on a bare device machine

#: The architectures (Qwen2.5-Coder's published configurations), and a tiny one for a CPU smoke run.
CONFIGS = {
    "qwen2.5-coder-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-coder-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                             num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True),
}
COMMON = dict(rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768, hidden_act="silu")
BATCHES = (1, 2, 4, 8, 16, 32, 64)
TOKENS = (1, 2, 4, 8, 16, 33)


def build(torch: Any, name: str, device: str, dtype: Any) -> tuple[Any, Any]:
    """The model ``name`` of :data:`CONFIGS` with random weights (seed 0) on ``device``: (model, config)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**CONFIGS[name], **COMMON, attn_implementation="sdpa")
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in bf16 directly: a 7B model in fp32 first would take twice the memory
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(before)
    return model.eval(), cfg


def step_fn(torch: Any, model: Any, cache: Any, batch: int, tokens: int, context: int, device: str) -> Callable:
    """One verifying step of ``batch`` rows x ``tokens`` tokens at cache positions context.. (static tensors)."""
    ids = torch.zeros((batch, tokens), dtype=torch.long, device=device)
    cpos = torch.arange(context, context + tokens, device=device)
    pos = cpos.unsqueeze(0).expand(batch, -1).contiguous()

    def run() -> Any:
        # Newer transformers write a StaticCache at its own running length (a tensor it advances in place), older
        # ones at cache_position: reset the length so every call (and graph replay) writes the same positions.
        for layer in getattr(cache, "layers", ()):
            n = getattr(layer, "cumulative_length", None)
            if isinstance(n, torch.Tensor):
                n.fill_(context)
            elif isinstance(n, int):
                layer.cumulative_length = context
        return model(input_ids=ids, position_ids=pos, cache_position=cpos, past_key_values=cache, use_cache=True,
                     logits_to_keep=0).logits

    return run


def median_seconds(torch: Any, fn: Callable, repeats: int, cuda: bool) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` (CUDA events on a GPU, the wall clock on a CPU)."""
    out = []
    for _ in range(repeats):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def time_eager(torch: Any, run: Callable, repeats: int, cuda: bool) -> float:
    """Median seconds of ``run()`` after one warm-up call."""
    run()
    return median_seconds(torch, run, repeats, cuda)


def time_graph(torch: Any, run: Callable, repeats: int) -> float:
    """Median seconds of one replay of ``run`` captured in a CUDA graph (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    return median_seconds(torch, graph.replay, repeats, True)


def measure(torch: Any, name: str, device: str, batches: Sequence[int], tokens: Sequence[int], context: int,
            repeats: int, log: Callable[[str], None] = print) -> dict:
    """Every shape of ``batches`` x ``tokens`` on model ``name``: the grid (see the module doc)."""
    from transformers import StaticCache

    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    t0 = time.perf_counter()
    model, cfg = build(torch, name, device, dtype)
    log(f"{name}: built in {time.perf_counter() - t0:.1f} s")
    rows = []
    with torch.inference_mode():
        for b in batches:
            cache = StaticCache(config=cfg, max_cache_len=context + max(tokens))  # sized by its first forward
            for t in tokens:
                run = step_fn(torch, model, cache, b, t, context, device)
                eager = time_eager(torch, run, max(3, repeats // 3), cuda)
                row = {"batch": b, "tokens_per_row": t, "tokens": b * t, "eager_seconds": eager,
                       "seconds": eager, "mode": "eager"}
                if cuda:
                    try:
                        row["seconds"], row["mode"] = time_graph(torch, run, repeats), "graph"
                    except Exception as e:  # noqa: BLE001 (a forward that cannot be captured: its eager time stands)
                        row["graph_error"] = f"{type(e).__name__}: {e}"[:300]
                rows.append(row)
                log(f"  B={b:3d} t={t:2d}: {row['seconds'] * 1e3:8.3f} ms ({row['mode']}; eager {eager * 1e3:.3f})")
            del cache
            if cuda:
                torch.cuda.empty_cache()
    del model
    if cuda:
        torch.cuda.empty_cache()
    return {"model": name, "config": CONFIGS[name], "dtype": str(dtype).replace("torch.", ""), "device": device,
            "device_name": torch.cuda.get_device_name() if cuda else "cpu", "context": context,
            "repeats": repeats, "rows": rows}


def curve_points(rows: Sequence[dict]) -> tuple[list[int], list[float]]:
    """(token counts, seconds) of a grid: per count the median over its shapes, then a running maximum (a step
    with more tokens is not cheaper)."""
    by_n: dict[int, list[float]] = {}
    for r in rows:
        by_n.setdefault(int(r["tokens"]), []).append(float(r["seconds"]))
    xs = sorted(by_n)
    ys, top = [], 0.0
    for n in xs:
        top = max(top, statistics.median(by_n[n]))
        ys.append(top)
    return xs, ys


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the grids and curve files")
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-1.5b", "qwen2.5-coder-7b"], choices=sorted(CONFIGS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    ap.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS), help="tokens a row (1 + draft tokens)")
    ap.add_argument("--context", type=int, default=1024, help="cached tokens a row attends over")
    ap.add_argument("--repeats", type=int, default=10, help="timed replays per shape (the median)")
    args = ap.parse_args(argv)
    bad = [v for v in (*args.batches, *args.tokens, args.repeats) if v < 1] + ([args.context] if args.context < 0 else [])
    if bad:
        ap.error(f"batches, tokens and repeats must be >= 1 and context >= 0, got {bad[0]}")
    import torch

    from saspec_bench.step_curves import Curve

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        grid = measure(torch, name, args.device, args.batches, args.tokens, args.context, args.repeats)
        (args.out / f"{name}.grid.json").write_text(json.dumps(grid, indent=1) + "\n")
        xs, ys = curve_points(grid["rows"])
        modes = sorted({r["mode"] for r in grid["rows"]})
        Curve(name, tuple(xs), tuple(ys), "gpu",
              f"{name} (random weights, {grid['dtype']}) on {grid['device_name']}: forwards of B rows x t tokens "
              f"after {args.context} cached, {'/'.join(modes)}, median of {args.repeats}; "
              f"benchmarks/gpu_step_curves.py").save(args.out / f"{name}.json")
        print(f"{name}: {args.out / (name + '.json')} ({len(xs)} points, {'/'.join(modes)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
