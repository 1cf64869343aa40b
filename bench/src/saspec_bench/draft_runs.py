"""Exact acceptance of a real greedy draft model on a fixed output, from one forward.

In greedy speculative decoding against a fixed (greedy target) output, the
accepted text after ``p`` output tokens is exactly ``prompt + output[:p]``.
A greedy draft model proposes ``d_0 = argmax f(prompt + output[:p])``, then
``d_1 = argmax f(prompt + output[:p] + [d_0])`` and so on. While the drafts are
right (``d_j == output[p + j]``), the context of the next draft token *is*
the output prefix, so draft token ``j`` equals the draft model's teacher-forced
argmax at output position ``p + j``. Hence the number of accepted draft tokens
at position ``p`` with draft length ``L`` is::

    accepted(p, L) = min(L, run[p])
    run[p] = number of consecutive j >= 0 with argmax[p + j] == output[p + j]

where ``argmax[q]`` is the draft model's prediction for output token ``q``
from ``prompt + output[:q]``. One (chunked) forward over ``prompt + output``
gives ``argmax`` at every position, so the runs of a whole trace cost one
teacher-forced pass instead of one draft loop per simulated policy.

What is exact and what is not:

* exact (up to floating-point ties, see below) for a greedy draft model
  without a confidence stop (``ModelDrafter(stop_below=0)``), for any draft
  length and any rule deciding *when* the draft model drafts (the hybrid):
  the draft at a position depends only on the accepted text, never on the
  history of steps;
* the draft model's *cost* (forwards, catch-up tokens) depends on the step
  history; the simulator models it (``realsim.walk_real``), it is not stored;
* a confidence stop (``stop_below > 0``) is not represented: it needs the
  draft model's probabilities of tokens past the first rejection;
* floating point: the loop's draft model runs incrementally with a KV cache
  while this pass runs in chunks, so logits differ in the last bits; where
  the top two logits are that close, the argmax can differ. Run both in fp32
  (the default here) to keep such ties rare; tests use models with clear
  margins.

Runs are stored capped at ``max_run`` (default 64 > any K the simulator uses),
as uint8, next to the trace (``workloads.save_traces``' ``draft_runs`` field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .lm import cache_kwarg, new_cache

DEFAULT_MAX_RUN = 64
DEFAULT_CHUNK = 256


@dataclass(frozen=True, eq=False)
class DraftRuns:
    """A draft model's accepted-run length at every output position of one trace.

    Attributes:
        model: the draft model's name, e.g. ``qwen2.5-coder-0.5b-instruct``.
        runs: uint8 array [O] (read-only), ``runs[p]`` in ``[0, min(max_run, O - p)]``:
            how many draft tokens proposed at output position ``p`` are
            accepted before the first wrong one, capped at ``max_run``.
        max_run: the cap, in [1, 255].
    """

    model: str
    runs: np.ndarray
    max_run: int = DEFAULT_MAX_RUN

    def __post_init__(self) -> None:
        check_runs(self.runs, self.max_run, "runs")
        arr = np.array(self.runs, dtype=np.uint8)
        arr.setflags(write=False)
        object.__setattr__(self, "runs", arr)
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("draft_runs model must be a non-empty string")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DraftRuns):
            return NotImplemented
        return self.model == other.model and self.max_run == other.max_run and np.array_equal(self.runs, other.runs)

    __hash__ = None  # type: ignore[assignment]

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "max_run": int(self.max_run), "runs": self.runs.tolist()}


def check_runs(runs: Any, max_run: int, what: str = "runs") -> None:
    """Raise ``ValueError`` unless ``runs`` is a consistent run array.

    A run array is 1-D, integer, with ``0 <= runs[p] <= min(max_run, O - p)``
    and, where ``runs[p] > 0`` and ``p + 1 < O``, ``runs[p] == min(max_run,
    runs[p + 1] + 1)`` (a run that starts at p continues at p + 1)."""
    if isinstance(max_run, bool) or not isinstance(max_run, (int, np.integer)) or not 1 <= max_run <= 255:
        raise ValueError(f"{what}: max_run must be an int in [1, 255], got {max_run!r}")
    arr = np.asarray(runs)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{what} must be a 1-D array of ints")
    a = arr.astype(np.int64)
    n = a.size
    room = np.minimum(max_run, n - np.arange(n))
    bad = np.flatnonzero((a < 0) | (a > room))
    if bad.size:
        p = int(bad[0])
        raise ValueError(f"{what}[{p}] = {int(a[p])} outside [0, {int(room[p])}] "
                         f"(max_run {max_run}, {n - p} output tokens left)")
    if n > 1:
        nxt = np.minimum(max_run, a[1:] + 1)
        bad = np.flatnonzero((a[:-1] > 0) & (a[:-1] != nxt))
        if bad.size:
            p = int(bad[0])
            raise ValueError(f"{what}[{p}] = {int(a[p])} is inconsistent with {what}[{p + 1}] = {int(a[p + 1])} "
                             f"(a run continuing at the next position must be min(max_run, next + 1))")


def runs_from_argmax(argmax: Any, output: Any, max_run: int = DEFAULT_MAX_RUN) -> np.ndarray:
    """uint8 [O]: ``run[p]`` = consecutive ``j >= 0`` with ``argmax[p+j] == output[p+j]``, capped at ``max_run``.

    ``argmax`` and ``output`` are int arrays [O]; ``argmax[q]`` is the draft
    model's prediction for ``output[q]`` given everything before it."""
    argmax, output = np.asarray(argmax), np.asarray(output)
    if argmax.shape != output.shape or argmax.ndim != 1:
        raise ValueError(f"argmax and output must be 1-D of one shape, got {argmax.shape} and {output.shape}")
    if not 1 <= max_run <= 255:
        raise ValueError(f"max_run must be in [1, 255], got {max_run}")
    eq = argmax == output
    runs = np.zeros(output.size, np.uint8)
    r = 0
    for p in range(output.size - 1, -1, -1):
        r = min(max_run, r + 1) if eq[p] else 0
        runs[p] = r
    return runs


def teacher_forced_argmax(model: Any, prompt: Sequence[int], output: Sequence[int],
                          chunk: int = DEFAULT_CHUNK) -> np.ndarray:
    """int32 [O]: the draft model's greedy prediction for each output token.

    ``model`` is a Hugging Face causal LM (``model(input_ids, past_key_values,
    use_cache, logits_to_keep)``); ``prompt`` (non-empty) and ``output``
    (non-empty) are token ids. The text ``prompt + output[:-1]`` is fed in
    chunks of ``chunk`` tokens through one KV cache (memory: logits of at most
    ``chunk`` rows at a time); position ``q``'s prediction comes from the
    logits row of token ``len(prompt) + q - 1``. Runs in the model's dtype
    under ``torch.inference_mode``.
    """
    import torch

    prompt = [int(t) for t in prompt]
    output = [int(t) for t in output]
    if not prompt:
        raise ValueError("prompt is empty: the first output token has no context to be predicted from")
    if not output:
        raise ValueError("output is empty")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    text = prompt + output[:-1]
    first = len(prompt) - 1  # text index whose logits predict output[0]
    device = next(model.parameters()).device
    kw = cache_kwarg(model)
    out = np.empty(len(output), np.int32)
    with torch.inference_mode():
        cache = new_cache(model)
        for s in range(0, len(text), chunk):
            e = min(len(text), s + chunk)
            keep = e - max(s, first)  # rows of this chunk at or after `first`
            ids = torch.tensor([text[s:e]], dtype=torch.long, device=device)
            logits = model(input_ids=ids, use_cache=True, logits_to_keep=max(keep, 1), **{kw: cache}).logits[0]
            if keep > 0:
                q0 = max(s, first) - first
                out[q0:q0 + keep] = torch.argmax(logits[-keep:].float(), dim=-1).cpu().numpy()
    return out


def compute_draft_runs(model: Any, prompt: Sequence[int], output: Sequence[int], model_name: str,
                       max_run: int = DEFAULT_MAX_RUN, chunk: int = DEFAULT_CHUNK) -> DraftRuns:
    """The :class:`DraftRuns` of ``model`` (named ``model_name``) on one trace."""
    argmax = teacher_forced_argmax(model, prompt, output, chunk)
    return DraftRuns(model_name, runs_from_argmax(argmax, np.asarray(output), max_run), max_run)
