"""`saspec bench`: host ingestion, per-decode-step cost and memory, with the
n-gram baseline measured in the same run.

Prompts are synthetic token streams that stand in for the two shapes that
matter: *random* (ids uniform over Qwen2.5's 151,936-token vocabulary: no
repeats, the automaton's cheapest case for matching but a wide alphabet for the
table) and *code-like* (blocks of 2,000 tokens, each a copy of one base block
with 1% of its tokens mutated: long repeats with many branch points, which is
what makes suffix structures expensive).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .. import NgramDrafter, SpecEngine, SuffixAutomaton

VOCAB = 151_936


def random_prompt(n: int, seed: int = 0) -> np.ndarray:
    """int32 [n], ids uniform in [0, VOCAB)."""
    return np.random.default_rng(seed).integers(0, VOCAB, n, dtype=np.int32)


def code_like_prompt(n: int, seed: int = 0, block: int = 2000, vocab: int = 5000, mutate: float = 0.01) -> np.ndarray:
    """int32 [n]: a base block of ``block`` tokens repeated, each copy with a
    fraction ``mutate`` of its positions replaced by random ids."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, vocab, block, dtype=np.int32)
    copies = []
    for _ in range(-(-n // block)):
        b = base.copy()
        idx = rng.integers(0, block, max(1, int(block * mutate)))
        b[idx] = rng.integers(0, vocab, idx.size)
        copies.append(b)
    return np.concatenate(copies)[:n]


def warm_up() -> None:
    """Compile (or load from cache) every kernel the benchmarks time, growth included."""
    tokens = code_like_prompt(3000)
    for policy in ("first", "near-first"):
        SuffixAutomaton(policy=policy).extend(tokens)
    for drafter in (SpecEngine(), NgramDrafter(), SpecEngine(parallel_threshold=1), NgramDrafter(parallel_threshold=1)):
        drafter.add_request(0, tokens[:10])
        drafter.prepare([0])
        acc = np.zeros((1, 600), np.int32)
        acc[0] = tokens[:600]
        drafter.extend(acc, np.array([600], np.int32), np.zeros(1, np.int32), np.zeros((1, 599), np.int32))


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` runs, in seconds (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_ingest(sizes: list[int], policies: list[str], repeat: int = 3) -> list[dict]:
    """Tokens per second of building an automaton from a prompt."""
    SuffixAutomaton([1, 2, 1], policy=policies[0])  # compile
    rows = []
    for kind, make in (("random", random_prompt), ("code-like", code_like_prompt)):
        for n in sizes:
            tokens = make(n)
            for policy in policies:
                t = best_time(lambda: SuffixAutomaton(tokens, policy=policy), repeat if n < 500_000 else 1)
                sa = SuffixAutomaton(tokens, policy=policy)
                rows.append(
                    {
                        "prompt": kind,
                        "tokens": n,
                        "policy": policy,
                        "Mtok_per_s": n / t / 1e6,
                        "bytes_per_token": sa.nbytes / n,
                        "states_per_token": sa.num_states / n,
                        "edges_per_token": sa.num_edges / n,
                    }
                )
    return rows


def _accepted_stream(prompts: list[np.ndarray], k: int, accepted: int, steps: int, mode: str) -> np.ndarray:
    """int32 [steps, B, k+1]: each step's accepted tokens per row.

    ``copy``: each row copies its own prompt from a random offset, jumping to
    a new offset every 16 steps (copy-heavy decoding, the case SA drafting is
    for); ``random``: uniform random ids (every step starts new branches, the
    automaton's most expensive case).
    """
    rng = np.random.default_rng(0)
    out = np.zeros((steps, len(prompts), k + 1), np.int32)
    for i, p in enumerate(prompts):
        if mode == "random":
            out[:, i, :accepted] = rng.integers(0, VOCAB, (steps, accepted))
            continue
        pos = 0
        for s in range(steps):
            if s % 16 == 0 or pos + accepted > len(p):
                pos = int(rng.integers(0, len(p) - accepted))
            out[s, i, :accepted] = p[pos : pos + accepted]
            pos += accepted
    return out


def _step_loop(drafter: SpecEngine, prompts: list[np.ndarray], acc: np.ndarray) -> float:
    """Mean seconds per ``extend`` call over the steps in ``acc`` [steps, B, K+1],
    each row accepting as many tokens as ``acc`` has non-padding columns."""
    steps, b, k1 = acc.shape
    for i, p in enumerate(prompts):
        drafter.add_request(i, p)
    drafter.prepare(list(range(b)))
    lens = np.full(b, ACCEPTED, np.int32)
    mout = np.zeros(b, np.int32)
    dout = np.zeros((b, k1 - 1), np.int32)
    drafter.extend(acc[0], lens, mout, dout)  # compile / warm
    t0 = time.perf_counter()
    for s in range(1, steps):
        drafter.extend(acc[s], lens, mout, dout)
    return (time.perf_counter() - t0) / (steps - 1)


ACCEPTED = 3
SERIAL = 2**31  # a parallel_threshold no batch reaches


def bench_step(
    batches: list[int], contexts: list[int], k: int = 8, steps: int = 200, modes: tuple[str, ...] = ("copy", "random")
) -> list[dict]:
    """Microseconds per request-step of ``extend`` (Python call included), with
    3 accepted tokens per row and K draft tokens, for the SA engine and the
    n-gram baseline on the same batch and the same tokens."""
    rows = []
    for ctx in contexts:
        for b in batches:
            prompts = [code_like_prompt(ctx, seed=i) for i in range(b)]
            n_steps = steps if ctx * b <= 2_000_000 else max(40, steps // 5)
            for mode in modes:
                acc = _accepted_stream(prompts, k, ACCEPTED, n_steps, mode)
                t_sa = _step_loop(SpecEngine(parallel_threshold=SERIAL), prompts, acc)
                t_par = _step_loop(SpecEngine(parallel_threshold=1), prompts, acc) if b >= 8 else float("nan")
                t_ng = _step_loop(NgramDrafter(parallel_threshold=SERIAL), prompts, acc[: max(5, n_steps // 4)])
                rows.append(
                    {
                        "context": ctx,
                        "batch": b,
                        "tokens": mode,
                        "sa_us_per_request_step": t_sa / b * 1e6,
                        "sa_parallel_us_per_request_step": t_par / b * 1e6,
                        "ngram_us_per_request_step": t_ng / b * 1e6,
                        "ngram_over_sa": t_ng / t_sa,
                    }
                )
    return rows


def bench_memory(n: int = 200_000) -> list[dict]:
    """Host bytes per token after ``add_request``, from ``stats()`` and from the
    arrays' own ``nbytes``."""
    rows = []
    for kind, make in (("random", random_prompt), ("code-like", code_like_prompt)):
        eng = SpecEngine()
        eng.add_request(kind, make(n))
        st = eng.stats()
        real = sum(int(eng._blobs[s].nbytes) for s in eng._slot.values())
        rows.append({"prompt": kind, "tokens": st["tokens"], "stats_bytes": st["bytes"], "nbytes": real,
                     "bytes_per_token": st["bytes"] / st["tokens"]})
    return rows


def format_table(rows: list[dict]) -> str:
    """Rows of dicts as a Markdown table, floats to 3 significant digits."""
    if not rows:
        return ""
    cols = list(rows[0])
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def run(quick: bool = False) -> dict[str, list[dict]]:
    """All three benchmarks; ``quick`` shrinks them to a smoke run."""
    from ..build import DEFAULT_POLICY

    warm_up()
    if quick:
        return {
            "ingest": bench_ingest([1000, 20_000], [DEFAULT_POLICY], repeat=1),
            "step": bench_step([1, 8], [1000], steps=20),
            "memory": bench_memory(20_000),
        }
    return {
        "ingest": bench_ingest([1000, 20_000, 200_000, 1_000_000], [DEFAULT_POLICY, "first"]),
        "step": bench_step([1, 8, 64, 256], [1000, 8000, 32000]),
        "memory": bench_memory(200_000),
    }
