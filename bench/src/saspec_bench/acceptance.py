"""The acceptance simulator: how many tokens per target forward each drafter
and hybrid policy gives on a workload, without a model.

Greedy speculative decoding against a fixed output is exact for deterministic
drafters: at each step the drafter proposes K tokens, the target accepts the
longest prefix that matches the output plus one token of its own, and the
accepted tokens go back to the drafter.

Two ways of running it, which give identical results for the SA (tested):

* ``stepwise``: the literal loop, batched over traces with the engine API.
  Used for the n-gram baseline.
* ``positions.sa_positions`` + ``walk``: the SA's match and draft at output position
  ``pos`` depend only on the text before ``pos`` (the core processes tokens one
  at a time whatever the step boundaries), so one batched pass that feeds the
  outputs one token per ``SpecEngine.extend`` call records, for every position,
  the match length and how many draft tokens would be accepted there. Every
  selection policy is then a cheap walk over those arrays, so a threshold sweep
  costs one SA pass, not one per threshold.

The modeled neural drafter (an MTP/EAGLE stand-in) gets draft position i right
with probability p[i] given the previous ones were right. Its draws are fixed
per (seed, trace, output position), so every policy sees the same neural
drafter at the same place: comparisons are paired (``positions.neural_positions``).
"""

from __future__ import annotations

import time

import numpy as np
from saspec import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from saspec import NgramDrafter, SpecEngine
from saspec.build import DEFAULT_OCCURRENCE, OCCURRENCES
from saspec.policy import N_BUCKETS
from saspec.rules import HYBRID_THRESHOLD

from .adaptive_rule import adaptive_init, adaptive_observe, adaptive_prefers_sa
from .positions import ADAPTIVE, HYBRID, NEURAL, NONE, SA, TREE, Flat, extend_buffers, neural_positions, sa_positions

DEFAULT_P = (0.85, 0.75, 0.65, 0.6, 0.55, 0.5, 0.5, 0.5)
DEFAULT_THRESHOLDS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
DEFAULT_THRESHOLD = HYBRID_THRESHOLD

# -- policies as walks over the per-position arrays ------------------------------


@njit(cache=True)
def walk(offsets, match, sa_acc, nn_acc, k, mode, threshold, hist, prior_nn):
    """Replay greedy speculative decoding over every trace with one selection
    rule; return (steps, sa_steps, extra_verified).

    ``hist[a]`` counts steps that accepted ``a`` tokens (bonus included).
    Modes: NEURAL, SA, HYBRID (SA if match >= threshold), ADAPTIVE (the source
    with the higher expected accepted length, estimated online), TREE (SA and
    neural drafts verified together when SA has a match >= threshold), NONE.
    """
    steps = 0
    sa_steps = 0
    extra = 0
    # ADAPTIVE state: global SA acceptance by match bucket, per-request EMAs.
    g_sum = np.zeros(N_BUCKETS)
    g_cnt = np.zeros(N_BUCKETS)
    adaptive_init(g_sum, g_cnt, k)
    for tr in range(offsets.shape[0] - 1):
        pos = offsets[tr]
        end = offsets[tr + 1]
        r_nn = prior_nn
        r_sa_ratio = 1.0
        while pos < end:
            m = match[pos]
            a_sa = sa_acc[pos] if m > 0 else 0
            a_nn = nn_acc[pos]
            use_sa = False
            if mode == SA:
                use_sa = True
            elif mode == HYBRID:
                use_sa = m >= threshold
            elif mode == ADAPTIVE:
                use_sa = adaptive_prefers_sa(g_sum, g_cnt, r_sa_ratio, r_nn, m)
            if mode == NONE:
                a = 0
            elif mode == TREE:
                if m >= threshold:
                    a = max(a_sa, a_nn)
                    extra += k - min(a_sa, a_nn)
                    use_sa = a_sa > a_nn
                else:
                    a = a_nn
            elif use_sa:
                a = a_sa
            else:
                a = a_nn
            a = min(a, end - pos - 1) + 1
            if mode == ADAPTIVE:
                # After verification the next a tokens are known: both drafts
                # are scored against them (capped at a when all matched).
                r_sa_ratio, r_nn = adaptive_observe(g_sum, g_cnt, r_sa_ratio, r_nn, m, min(a_sa, a), min(a_nn, a))
            hist[a] += 1
            steps += 1
            if use_sa:
                sa_steps += 1
            pos += a
    return steps, sa_steps, extra


def walk_hist(flat: Flat, match: np.ndarray, sa_acc: np.ndarray, nn_acc: np.ndarray, k: int, mode: int,
              threshold: int, prior_nn: float) -> tuple[int, int, int, np.ndarray]:
    """:func:`walk` over every trace of ``flat`` with a fresh histogram: (steps, SA steps,
    extra verified tokens, hist), hist int64 [k + 2] counting steps by tokens accepted."""
    hist = np.zeros(k + 2, np.int64)
    steps, sa_steps, extra = walk(flat.offsets, match, sa_acc, nn_acc, k, mode, threshold, hist, prior_nn)
    return steps, sa_steps, extra, hist


def stepwise(flat: Flat, drafter: SpecEngine, k: int, hist: np.ndarray | None = None) -> int:
    """The literal loop with one drafter alone: returns the number of steps.

    All traces decode together as one batch through the engine API; a finished
    trace stays in the batch with nothing accepted.
    """
    ids = list(range(len(flat.prompts)))
    for i, p in zip(ids, flat.prompts):
        drafter.add_request(i, p)
    drafter.prepare(ids)
    b = len(ids)
    acc, lens, mout, dout = extend_buffers(b, k)
    pos = np.zeros(b, np.int64)
    remaining = flat.lengths.copy()
    steps = 0
    while remaining.any():
        drafter.extend(acc, lens, mout, dout)
        steps += _accept(dout, flat.tokens, flat.offsets, pos, remaining, acc, lens,
                         hist if hist is not None else np.zeros(k + 2, np.int64))
    return steps


@njit(cache=True)
def _accept(drafts, tokens, offsets, pos, remaining, acc, lens, hist):
    """Verify each live row's draft against its output; load the accepted
    tokens (matching prefix + the target's own token) into acc/lens."""
    k = drafts.shape[1]
    live = 0
    for b in range(drafts.shape[0]):
        if remaining[b] == 0:
            lens[b] = 0
            continue
        start = offsets[b] + pos[b]
        a = 0
        while a < k and a < remaining[b] - 1 and drafts[b, a] == tokens[start + a]:
            a += 1
        a += 1
        for j in range(a):
            acc[b, j] = tokens[start + j]
        lens[b] = a
        pos[b] += a
        remaining[b] -= a
        hist[a] += 1
        live += 1
    return live


# -- a workload's table ----------------------------------------------------------


def default_hybrid_policy(policies: tuple[str, ...]) -> str:
    """The SA occurrence rule of the hybrid rows: the engine's default, else the last one compared."""
    return DEFAULT_OCCURRENCE if DEFAULT_OCCURRENCE in policies else policies[-1]


def simulate_workload(
    flat: Flat,
    k: int = 8,
    p: tuple[float, ...] = DEFAULT_P,
    thresholds: tuple[int, ...] = DEFAULT_THRESHOLDS,
    threshold: int = DEFAULT_THRESHOLD,
    sa_policies: tuple[str, ...] = tuple(OCCURRENCES),
    hybrid_policy: str | None = None,
    seed: int = 0,
    ngram: bool = True,
    progress=None,
) -> dict:
    """All drafters and policies on one workload.

    Returns {"rows": [...], "sweep": {policy: [(T, AL), ...]}, "tokens": int,
    "seconds": {...}}. AL is output tokens per target forward pass (bonus
    token included), which is also the speed-up in target calls over no
    drafting.
    """
    if len(p) < k:
        raise ValueError(f"need a neural acceptance probability per draft position: len(p)={len(p)} < K={k}")
    p = tuple(p[:k])
    n_tok = int(flat.tokens.shape[0])
    rows: list[dict] = []
    seconds: dict[str, float] = {}
    if hybrid_policy is None:
        hybrid_policy = default_hybrid_policy(sa_policies)
    nn_acc = neural_positions(flat, p, seed)
    prior_nn = float(np.mean(nn_acc))

    def add(name, steps, sa_steps=0, extra=0, hist=None, note=""):
        row = {"drafter": name, "AL": n_tok / steps, "steps": int(steps), "sa_frac": sa_steps / steps,
               "extra_per_step": extra / steps, "note": note}
        if hist is not None:
            row["hist"] = hist[1:].tolist()
        rows.append(row)

    def run_walk(match, sa_acc, mode, thr):
        return walk_hist(flat, match, sa_acc, nn_acc, k, mode, thr, prior_nn)

    zeros = np.zeros_like(nn_acc)
    add("none", *run_walk(zeros, zeros, NONE, 0))
    add("neural", *run_walk(zeros, zeros, NEURAL, 0), note="modeled")
    if ngram:
        t0 = time.perf_counter()
        hist = np.zeros(k + 2, np.int64)
        add("ngram", stepwise(flat, NgramDrafter(parallel_threshold=2**31), k, hist), hist=hist)
        seconds["ngram"] = time.perf_counter() - t0
        if progress:
            progress.update(1)
    sweep = {}
    hybrid_arrays = None
    for policy in sa_policies:
        t0 = time.perf_counter()
        match, sa_acc = sa_positions(flat, k, policy)
        seconds[f"sa:{policy}"] = time.perf_counter() - t0
        add(f"sa:{policy}", *run_walk(match, sa_acc, SA, 1))
        sweep[policy] = [(t, n_tok / run_walk(match, sa_acc, HYBRID, t)[0]) for t in thresholds]
        if policy == hybrid_policy:
            hybrid_arrays = match, sa_acc
        if progress:
            progress.update(1)
    if hybrid_arrays is not None:
        match, sa_acc = hybrid_arrays
        add(f"hybrid:T={threshold}", *run_walk(match, sa_acc, HYBRID, threshold))
        best_t, _ = max(sweep[hybrid_policy], key=lambda x: x[1])
        add("hybrid:best-T", *run_walk(match, sa_acc, HYBRID, best_t), note=f"T={best_t}")
        add("hybrid:adaptive", *run_walk(match, sa_acc, ADAPTIVE, 0))
        add(f"tree:T={threshold}", *run_walk(match, sa_acc, TREE, threshold))
        if flat.draft_runs is not None:
            for name, res, note in draft_model_rows(flat, k, threshold, thresholds, match, sa_acc):
                add(name, *res, note=note)
    return {"rows": rows, "sweep": sweep, "tokens": n_tok, "seconds": seconds}


def draft_model_rows(flat: Flat, k: int, threshold: int, thresholds: tuple[int, ...], match: np.ndarray,
                     sa_acc: np.ndarray) -> list[tuple[str, tuple, str]]:
    """The real draft model's rows, mirroring the modeled neural drafter's:
    alone, hybrid at T and at its best T, adaptive and tree, each as (name,
    walk results (steps, sa_steps, extra, hist), note). Its acceptance at
    every position is ``min(run, K)`` (``flat.draft_runs``, see
    ``evidence.draft_runs``), exact for a greedy draft model."""
    dm_acc = np.minimum(flat.draft_runs, k).astype(np.int32)
    prior = float(np.mean(dm_acc))
    n_tok = int(flat.tokens.shape[0])
    note = flat.draft_model or ""

    def go(mode, thr):
        return walk_hist(flat, match, sa_acc, dm_acc, k, mode, thr, prior)

    best_t = max(thresholds, key=lambda t: n_tok / go(HYBRID, t)[0])
    return [("draft-model", go(NEURAL, 0), note),
            (f"hybrid:draft-model:T={threshold}", go(HYBRID, threshold), ""),
            ("hybrid:draft-model:best-T", go(HYBRID, best_t), f"T={best_t}"),
            ("hybrid:draft-model:adaptive", go(ADAPTIVE, 0), ""),
            (f"tree:draft-model:T={threshold}", go(TREE, threshold), "")]


def default_p(k: int) -> tuple[float, ...]:
    """The modeled neural drafter's default acceptance profile for K draft
    positions: :data:`DEFAULT_P`, cut to K or extended by repeating its last
    value (0.5) up to K."""
    return DEFAULT_P[:k] + (DEFAULT_P[-1],) * max(0, k - len(DEFAULT_P))


def format_results(results: dict[str, dict]) -> str:
    # No "speed-up" column: AL is the speed-up in target forwards only; modeled
    # tokens/s under a cost model are in the speed table (realsim.speed_section).
    lines = ["| workload | drafter | AL (tokens/forward) | SA steps | extra verified/step |",
             "|---|---|---|---|---|"]
    for name, res in results.items():
        for r in res["rows"]:
            label = f"{r['drafter']} ({r['note']})" if r.get("note") else r["drafter"]
            lines.append(f"| {name} | {label} | {r['AL']:.3f} | "
                         f"{r['sa_frac']:.0%} | {r['extra_per_step']:.2f} |")
    return "\n".join(lines)


