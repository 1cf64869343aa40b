"""A cost model for speculative decoding: modeled tokens/s from a simulated run.

AL (tokens per target forward) ignores two costs: verifying more tokens makes
the target forward dearer, and drafting takes time. The model used by
``saspec simulate`` charges every decode step::

    time(step) = target(verified tokens per row, batch B)
                 + drafter cost (draft-model forwards, their catch-up tokens; SA extend)

and reports ``B * output tokens / sum of step times`` per drafter, at batch 1
and 64. Each row of a batch is assumed to take a step of the same shape (the
batch is B copies of the workload, step by step), so a step's cost is the
profile's time for a forward of B rows with that many tokens each. Prefills
(the target's and the draft model's prompt) are outside the modeled decode
time. The modeled neural drafter (i.i.d. acceptance) is charged nothing for
drafting (an optimistic stand-in for MTP heads).

A :class:`Profile` holds, per batch size, times in seconds of one forward of
the whole batch:

* ``target_s[n - 1]``: the target with ``n`` tokens per row (``n`` = 1..N:
  the verified drafts + 1), at the profile's context length;
* ``draft_s[n - 1]``: the draft model with ``n`` new tokens per row (1 while
  drafting; more when it catches up on tokens it did not see);
* ``sa_step_s``: one ``SpecEngine.extend`` call for the batch.

Beyond ``N`` tokens a time grows linearly with the slope of its last two
entries. Two sources:

* :func:`gpu_like_profile`: a roofline from published figures (labelled
  ``gpu-like``; assumptions in its docstring);
* ``saspec calibrate`` (:func:`calibrate`): measured on this machine with
  real models, written as JSON.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from saspec import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from saspec import SpecEngine
from .datafiles import CPU_PROFILE_PATH
from .lm import cache_kwarg, crop_cache, new_cache
from .positions import extend_buffers

PROFILE_VERSION = 1
DEFAULT_BATCHES = (1, 64)
MAX_TOKENS = 33  # profile entries: 1..33 tokens per row (K up to 32, plus the bonus token)


@dataclass
class BatchCosts:
    """Times of one forward of a batch, in seconds (see the module docstring).

    ``target_s``, ``draft_s``: float64 arrays [N], entry ``n - 1`` for ``n``
    tokens per row, N >= 2; ``sa_step_s``: float."""

    target_s: np.ndarray
    draft_s: np.ndarray
    sa_step_s: float

    def __post_init__(self) -> None:
        for name in ("target_s", "draft_s"):
            arr = np.asarray(getattr(self, name), dtype=np.float64)
            if arr.ndim != 1 or arr.size < 2 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
                raise ValueError(f"{name} must be a 1-D array of >= 2 positive finite seconds, got {arr!r}")
            setattr(self, name, arr)
        if not (math.isfinite(self.sa_step_s) and self.sa_step_s >= 0):
            raise ValueError(f"sa_step_s must be a finite number >= 0, got {self.sa_step_s!r}")
        self.sa_step_s = float(self.sa_step_s)


@dataclass
class Profile:
    """Per-batch forward times (``batches[B]``), a name that says where they
    come from, and free-form notes (assumptions, machine, models)."""

    name: str
    batches: dict[int, BatchCosts]
    notes: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"version": PROFILE_VERSION, "name": self.name, "notes": self.notes,
                "batches": {str(b): {"target_s": c.target_s.tolist(), "draft_s": c.draft_s.tolist(),
                                     "sa_step_s": c.sa_step_s} for b, c in sorted(self.batches.items())}}

    @classmethod
    def from_json(cls, obj: Any, where: str = "profile") -> Profile:
        """Parse :meth:`as_json`'s object; ``ValueError`` naming ``where`` if malformed."""
        try:
            if not isinstance(obj, dict) or obj.get("version") != PROFILE_VERSION:
                raise ValueError(f"expected an object with version {PROFILE_VERSION}")
            batches = {}
            for b, c in obj["batches"].items():
                if int(b) < 1:
                    raise ValueError(f"batch size {b} < 1")
                batches[int(b)] = BatchCosts(np.asarray(c["target_s"], float), np.asarray(c["draft_s"], float),
                                             float(c["sa_step_s"]))
            if not batches:
                raise ValueError("no batch sizes")
            return cls(str(obj["name"]), batches, dict(obj.get("notes", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: malformed cost profile ({exc})") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_json(json.loads(Path(path).read_text()), str(path))


@njit(cache=True)
def lookup(table: np.ndarray, n: int) -> float:
    """Seconds of a forward with ``n`` tokens per row: ``table[n - 1]`` (float64 [N], N >= 2) for
    ``1 <= n <= N``; beyond, linear with the slope of the last two entries. Compiled: the costed walk
    (``realsim.walk_real``) calls it every step."""
    if n <= table.shape[0]:
        return table[max(n, 1) - 1]
    return table[-1] + (n - table.shape[0]) * (table[-1] - table[-2])


# -- the GPU-like profile ------------------------------------------------------------

# Published figures (NVIDIA H100 SXM5 datasheet): 3.35 TB/s HBM3, 989 TFLOP/s dense BF16.
H100_HBM_BYTES_S = 3.35e12
H100_BF16_FLOPS = 989e12

# Qwen2.5 architecture figures (the models' config.json): parameters, layers, KV heads x head dim.
QWEN25_CODER_1_5B = {"params": 1.54e9, "layers": 28, "kv_dim": 2 * 128, "q_dim": 1536}
QWEN25_CODER_0_5B = {"params": 0.49e9, "layers": 24, "kv_dim": 2 * 64, "q_dim": 896}


def roofline_forward_s(model: dict, batch: int, tokens: int, context: int, *, bw: float, flops: float,
                       overhead_s: float, bytes_per_value: int = 2) -> float:
    """Seconds of one forward of ``batch`` rows with ``tokens`` new tokens each
    over ``context`` cached tokens each: ``overhead + max(memory, compute)``.

    memory = (weights + the batch's KV cache) bytes / ``bw``; compute = (2 x
    params + 4 x layers x context x q_dim) FLOPs per token x batch x tokens /
    ``flops``."""
    kv_bytes = 2 * model["layers"] * model["kv_dim"] * bytes_per_value  # K and V, per cached token
    mem = (model["params"] * bytes_per_value + batch * context * kv_bytes) / bw
    per_token = 2 * model["params"] + 4 * model["layers"] * context * model["q_dim"]
    return overhead_s + max(mem, batch * tokens * per_token / flops)


def gpu_like_profile(batches: tuple[int, ...] = DEFAULT_BATCHES, context: int = 1500,
                     bw_efficiency: float = 0.7, flops_efficiency: float = 0.5,
                     overhead_s: float = 3e-4, sa_step_s_per_row: float = 1.5e-6,
                     sa_step_s_min: float = 5e-6) -> Profile:
    """A GPU-like profile, computed from published figures, not measured.

    Assumptions (all stated in the profile's notes):

    * an H100 SXM5 (3.35 TB/s, 989 TFLOP/s dense BF16) reaching
      ``bw_efficiency`` of its bandwidth and ``flops_efficiency`` of its
      compute in these forwards, bf16 weights and KV cache;
    * target Qwen2.5-Coder-1.5B, draft model Qwen2.5-Coder-0.5B (parameter
      counts and KV shapes from their configs), ``context`` cached tokens per
      row (1,500: about the workloads' mean prompt + output);
    * a forward costs ``overhead_s`` (launches under CUDA graphs, sampling)
      plus the larger of reading weights + KV cache and the matmul FLOPs
      (:func:`roofline_forward_s`). At batch 1 this is memory-bound:
      verifying 33 tokens costs about as much as 1. At batch 64 the forward
      turns compute-bound at a few tokens per row, so each verified token
      costs compute;
    * the SA's extend: ``max(sa_step_s_min, sa_step_s_per_row x B)``, rounded
      up from the host per-step figures (BENCHMARKS.md, "Host engine").
    """
    bw, fl = H100_HBM_BYTES_S * bw_efficiency, H100_BF16_FLOPS * flops_efficiency
    out = {}
    for b in batches:
        n = np.arange(1, MAX_TOKENS + 1)
        tgt = np.array([roofline_forward_s(QWEN25_CODER_1_5B, b, int(t), context, bw=bw, flops=fl,
                                           overhead_s=overhead_s) for t in n])
        drf = np.array([roofline_forward_s(QWEN25_CODER_0_5B, b, int(t), context, bw=bw, flops=fl,
                                           overhead_s=overhead_s) for t in n])
        out[b] = BatchCosts(tgt, drf, max(sa_step_s_min, sa_step_s_per_row * b))
    notes = {"source": "roofline from published figures, NOT measured",
             "gpu": "H100 SXM5: 3.35 TB/s HBM3, 989 TFLOP/s dense BF16",
             "bw_efficiency": bw_efficiency, "flops_efficiency": flops_efficiency, "overhead_s": overhead_s,
             "context_tokens": context, "target": "Qwen2.5-Coder-1.5B (bf16)", "draft": "Qwen2.5-Coder-0.5B (bf16)",
             "sa_step": f"max({sa_step_s_min}, {sa_step_s_per_row} x batch) s (host extend, BENCHMARKS.md)"}
    return Profile("gpu-like (modeled)", out, notes)


def default_profiles() -> list[Profile]:
    """The GPU-like profile, and the CPU profile measured by ``saspec calibrate``
    when its file (``saspec_bench/data/cpu_profile.json``) exists."""
    profiles = [gpu_like_profile()]
    if CPU_PROFILE_PATH.is_file():
        profiles.insert(0, Profile.load(CPU_PROFILE_PATH))
    return profiles


# -- measuring a profile (saspec calibrate) -------------------------------------------


def _random_cache(model: Any, batch: int, context: int, dtype: Any) -> Any:
    """A DynamicCache holding ``context`` positions of random K/V per row,
    shaped for ``model`` (costs like a real cache: attention reads it all)."""
    import torch

    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = new_cache(model)
    g = torch.Generator().manual_seed(0)
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(batch, heads, context, head_dim, generator=g).to(dtype)
        v = torch.randn(batch, heads, context, head_dim, generator=g).to(dtype)
        cache.update(k, v, layer)
    return cache


def time_forwards(model: Any, batch: int, tokens: list[int], context: int, repeats: int = 3,
                  vocab: int | None = None) -> dict[int, float]:
    """Seconds of one forward of ``batch`` rows with ``n`` new tokens each (for
    each ``n`` in ``tokens``) over a cache of ``context`` positions of random
    K/V; the best of ``repeats`` (after one 1-token warm-up). The cache is cropped back after each
    forward. Logits are kept for all new tokens (verification needs them)."""
    import torch

    if batch < 1 or context < 1 or repeats < 1 or not tokens or min(tokens) < 1:
        raise ValueError("batch, context, repeats and every token count must be >= 1")
    dtype = next(model.parameters()).dtype
    vocab = vocab or model.config.vocab_size
    kw = cache_kwarg(model)
    out = {}
    with torch.inference_mode():
        cache = _random_cache(model, batch, context, dtype)
        g = torch.Generator().manual_seed(1)

        def forward(n: int) -> float:
            ids = torch.randint(0, vocab, (batch, n), generator=g)
            mask = torch.ones(batch, context + n, dtype=torch.long)
            t0 = time.perf_counter()
            model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=n, **{kw: cache})
            dt = time.perf_counter() - t0
            crop_cache(cache, context)
            return dt

        forward(1)  # warm-up
        for n in tokens:
            out[n] = min(forward(n) for _ in range(repeats))
    return out


def _fill(points: dict[int, float], n_max: int) -> np.ndarray:
    """Entries 1..n_max, linearly interpolated between the measured points,
    made non-decreasing (a forward over more tokens is not cheaper; dips are
    timing noise on shared cores: the running maximum is kept) and
    extrapolated past the last point with the mean slope over all points."""
    xs = np.array(sorted(points), float)
    ys = np.maximum.accumulate(np.array([points[int(x)] for x in xs]))
    n = np.arange(1, n_max + 1, dtype=float)
    out = np.interp(n, xs, ys)
    if xs.size >= 2:
        slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
        out = np.where(n > xs[-1], ys[-1] + (n - xs[-1]) * slope, out)
    return out


def sa_step_seconds(batch: int, k: int = 8, context: int = 1000, steps: int = 200) -> float:
    """Seconds per ``SpecEngine.extend`` call for ``batch`` rows (K=``k``,
    one accepted token per row per step, random prompts of ``context``
    tokens), the median of ``steps`` calls."""
    rng = np.random.default_rng(0)
    eng = SpecEngine(parallel_threshold=2**31)
    for b in range(batch):
        eng.add_request(b, rng.integers(0, 1000, context).astype(np.int32))
    eng.prepare(list(range(batch)))
    acc, lens, mout, dout = extend_buffers(batch, k)
    lens[:] = 1
    times = []
    for _ in range(steps):
        acc[:, 0] = rng.integers(0, 1000, batch)
        t0 = time.perf_counter()
        eng.extend(acc, lens, mout, dout)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def calibrate(target: Any, draft: Any, *, name: str, batches: tuple[int, ...] = DEFAULT_BATCHES,
              context: int = 512, tokens: dict[int, list[int]] | None = None, repeats: int = 3,
              notes: dict[str, Any] | None = None, log=print) -> Profile:
    """Measure a :class:`Profile` on this machine: target and draft-model
    forward times for the token counts ``tokens[B]`` (default: every count
    1..33 at batch 1, a spread of counts at larger batches, interpolated to
    1..33), and the SA's extend time, per batch size. ``repeats``: timed
    forwards per point at batch 1 (the best is kept); 1 at larger batches."""
    out = {}
    for b in batches:
        ns = (tokens or {}).get(b) or (list(range(1, MAX_TOKENS + 1)) if b == 1 else [1, 2, 3, 5, 9, 17, 33])
        reps = repeats if b == 1 else 1  # large batches: one timed forward per point (they take seconds)
        t0 = time.perf_counter()
        tgt = time_forwards(target, b, ns, context, reps)
        log(f"batch {b}: target forwards timed in {time.perf_counter() - t0:.0f} s: "
            + ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in tgt.items()))
        t0 = time.perf_counter()
        drf = time_forwards(draft, b, ns, context, reps)
        log(f"batch {b}: draft forwards timed in {time.perf_counter() - t0:.0f} s: "
            + ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in drf.items()))
        out[b] = BatchCosts(_fill(tgt, MAX_TOKENS), _fill(drf, MAX_TOKENS), sa_step_seconds(b))
    info = {"source": "measured by saspec calibrate", "context_tokens": context, "repeats": repeats,
            "measured_tokens": {str(b): (tokens or {}).get(b) for b in batches}, **(notes or {})}
    return Profile(name, out, info)

