"""Cross-request pool in ``saspec simulate``: SA-only greedy acceptance in arrival order.

Each workload's traces run one after another through one ``SpecEngine`` (K
draft tokens per step, the accepted prefix plus one token of the target's own
appended, as in ``simulate.stepwise``); each finished request is removed, so
with a pool its text joins it before the next one arrives. Compared per
workload: no pool, a pool of the outputs, a pool of prompts and outputs. AL is
output tokens per step (target forward), so the ratio of two ALs is the ratio
of forwards saved; ``pool_rows`` is the share of steps that drafted from the
pool, ``pool_accepted`` the share of accepted tokens that came from it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from saspec import RequestPool, SpecEngine
from .positions import Flat, extend_buffers

VARIANTS = ("off", "outputs", "prompts+outputs")


def accepted_prefix(draft, out: np.ndarray, q: int) -> int:
    """How many leading ``draft`` tokens greedy verification accepts at output position ``q``
    (they equal ``out[q:]``; the last output token is always the target's own)."""
    limit = min(len(draft), out.shape[0] - q - 1)
    a = 0
    while a < limit and draft[a] == out[q + a]:
        a += 1
    return a


def arrival_order(flat: Flat, k: int, pool: RequestPool | None, occurrence: str) -> dict[str, Any]:
    """Replay ``flat``'s traces in order on one engine (with ``pool`` if given)."""
    eng = SpecEngine(pool=pool, occurrence=occurrence)
    acc, lens, mout, dout = extend_buffers(1, k)
    src = np.zeros(1, np.int32)
    steps = pool_steps = accepted = pool_accepted = 0
    for i, prompt in enumerate(flat.prompts):
        out = flat.tokens[flat.offsets[i]: flat.offsets[i + 1]]
        eng.add_request(i, prompt)
        eng.prepare([i])
        lens[0] = 0
        q = 0
        while q < out.shape[0]:
            if pool is None:
                eng.extend(acc, lens, mout, dout)
            else:
                eng.extend(acc, lens, mout, dout, src)
            a = accepted_prefix(dout[0], out, q)
            new = out[q: q + a + 1]
            acc[0, : new.shape[0]] = new
            lens[0] = new.shape[0]
            q += new.shape[0]
            steps += 1
            accepted += a
            if pool is not None and src[0]:
                pool_steps += 1
                pool_accepted += a
        eng.remove_request(i)
        if pool is not None:
            pool.flush()  # arrival order: the next request sees this one
    tokens = int(flat.tokens.shape[0])
    res = {"requests": len(flat.prompts), "tokens": tokens, "steps": steps, "al": tokens / max(steps, 1),
           "pool_rows": pool_steps / max(steps, 1), "pool_accepted": pool_accepted / max(accepted, 1)}
    if pool is not None:
        res["pool"] = pool.stats()
    return res


def pool_comparison(flats: dict[str, Flat], k: int, pool_tokens: int, occurrence: str) -> dict[str, dict]:
    """Per workload and variant (``VARIANTS``), ``arrival_order``'s results."""
    out = {}
    for name, flat in flats.items():
        out[name] = {v: arrival_order(flat, k, None if v == "off" else RequestPool(pool_tokens, prompts=v != "outputs"),
                                      occurrence) for v in VARIANTS}
    return out


def format_pool_table(results: dict[str, dict], k: int, pool_tokens: int, occurrence: str) -> str:
    lines = [f"Cross-request pool: SA only, K = {k}, occurrence rule {occurrence}, arrival order, pool of {pool_tokens} tokens",
             "",
             "| workload | requests | AL off | AL pool: outputs (x off) | AL pool: prompts + outputs (x off) "
             "| pool rows / accepted from the pool (outputs) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        off, o, po = (r[v]["al"] for v in VARIANTS)
        lines.append(f"| {name} | {r['off']['requests']} | {off:.3f} | {o:.3f} ({o / off:.3f}x) | {po:.3f} ({po / off:.3f}x) "
                     f"| {r['outputs']['pool_rows']:.1%} / {r['outputs']['pool_accepted']:.1%} |")
    return "\n".join(lines)
