"""The cross-request pool: drafts from earlier requests' texts are real continuations,
taken only where the pool's match is strictly longer than the row's own, with the
longest pool match where the pool stood still; eviction keeps the newest texts
within the bound; bad arguments change nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from saspec import SpecEngine
from saspec.pool import SEPARATOR, RequestPool

from oracle import pool_draft_ok, pool_match

K = 6


def buffers(b: int):
    return (np.zeros((b, K + 1), np.int32), np.zeros(b, np.int32), np.zeros(b, np.int32),
            np.zeros((b, K), np.int32), np.zeros(b, np.int32))


def phrase_text(rng: random.Random, phrases: list[list[int]], n: int) -> list[int]:
    """Text of ``n`` tokens: mostly whole phrases shared by every request, some noise."""
    out: list[int] = []
    while len(out) < n:
        if rng.random() < 0.7:
            out += rng.choice(phrases)
        else:
            out.append(rng.randrange(40))
    return out[:n]


def run_requests(seed: int, pool: RequestPool, n_requests: int, batch: int, steps: int, check: bool):
    """Requests arrive in waves of ``batch`` and decode ``steps`` steps each; with ``check``,
    every step's pool rows are checked against the oracle and the own rows against an
    engine without a pool run in lockstep. Returns how many rows drafted from the pool."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(40) for _ in range(rng.randrange(3, 9))] for _ in range(12)]
    eng, ref = SpecEngine(pool=pool, occurrence="first"), SpecEngine(occurrence="first")
    texts: dict[int, list[int]] = {}
    pooled = missed = 0
    for wave in range(0, n_requests, batch):
        ids = list(range(wave, min(wave + batch, n_requests)))
        for r in ids:
            texts[r] = phrase_text(rng, phrases, rng.randrange(1, 12))
            eng.add_request(r, texts[r])
            ref.add_request(r, texts[r])
        eng.prepare(ids)
        ref.prepare(ids)
        acc, lens, m, d, src = buffers(len(ids))
        racc, rlens, rm, rd, _ = buffers(len(ids))
        docs = [t.tolist() for t in pool.texts()]
        for step in range(steps):
            for b, r in enumerate(ids):
                new = phrase_text(rng, phrases, rng.randrange(0, K + 2))[: K + 1] if step else []
                lens[b] = len(new)
                acc[b, : len(new)] = new
                texts[r] += new
            racc[:], rlens[:] = acc, lens
            eng.extend(acc, lens, m, d, src)
            ref.extend(racc, rlens, rm, rd)
            if not check:
                continue
            for b, r in enumerate(ids):
                best, _ = pool_match(texts[r], docs)
                assert m[b] <= max(best, rm[b]), (r, step)
                if src[b]:
                    pooled += 1
                    assert m[b] > rm[b], "the pool drafts only where its match is strictly longer"
                    assert pool_draft_ok(texts[r], docs, int(m[b]), d[b].tolist(), K), (r, step, m[b], d[b])
                    assert m[b] == min(best, pool.sync_tokens + step) or pool.sync_tokens < len(texts[r])
                else:
                    assert (m[b], d[b].tolist()) == (rm[b], rd[b].tolist()), "an own row drafts as without a pool"
                    # a longer pool match whose chosen occurrence ends its text has nothing to draft
                    missed += best > rm[b] and _continues(texts[r], docs, best)
        for r in ids:
            eng.remove_request(r)
            ref.remove_request(r)
        pool.flush()
    assert missed <= pooled // 4, (missed, pooled)
    return pooled


def _continues(text, docs, m) -> bool:
    """Whether some occurrence of text's last m tokens in docs has a next token in its doc."""
    suffix = text[len(text) - m:]
    return any(doc[e - m + 1: e + 1] == suffix for doc in docs for e in range(m - 1, len(doc) - 1))


@pytest.mark.parametrize("seed", range(6))
def test_pool_drafts_are_real_continuations_and_only_where_longer(seed):
    pool = RequestPool(100_000, sync_tokens=10_000)  # no eviction, no capped sync: matches are the longest
    assert run_requests(seed, pool, n_requests=24, batch=3, steps=6, check=True) > 0


def test_pool_with_prompts_and_a_short_sync_still_drafts_real_continuations():
    pool = RequestPool(100_000, prompts=True, sync_tokens=4)
    assert run_requests(7, pool, n_requests=24, batch=4, steps=6, check=True) > 0
    assert pool.stats()["texts"] == 24


def test_eviction_keeps_the_newest_texts_within_the_bound():
    pool = RequestPool(300, prompts=True)
    eng = SpecEngine(pool=pool)
    sent = []
    for r in range(40):
        text = [r % 7] + list(range(50 + r, 70 + r))
        eng.add_request(r, text)
        eng.remove_request(r)
        pool.flush()
        sent.append(text)
        st = pool.stats()
        held = sum(len(t) + 1 for t in pool.texts())
        assert held == st["tokens"] <= 300, st
        assert [t.tolist() for t in pool.texts()] == sent[len(sent) - st["texts"]:], "the newest, in order"
    assert pool.stats()["rebuilds"] >= 2 and pool.stats()["epoch"] == pool.stats()["rebuilds"]
    # rows re-match after a rebuild and still draft real continuations (checked by run_requests)
    assert run_requests(3, RequestPool(120, prompts=True), n_requests=30, batch=2, steps=5, check=True) > 0


def test_texts_queued_faster_than_they_build_stay_within_the_bound():
    pool = RequestPool(1000, prompts=True)
    for i in range(2000):
        pool.add([i % 50] * 30)
    pool.flush()
    st = pool.stats()
    assert st["tokens"] <= 1000 and st["added"] == 2000 and st["evicted"] > 1900, st


def test_a_manual_pool_keeps_its_waiting_texts_within_the_bound():
    pool = RequestPool(500, prompts=True, manual=True)
    for i in range(100):
        pool.add([i % 50] * 30)
    pool.publish()
    pool.flush()
    pool.publish()
    assert pool.tokens <= 500 and pool.stats()["evicted"] >= 84, pool.stats()


def test_a_text_longer_than_the_pool_keeps_its_end():
    pool = RequestPool(50, prompts=True)
    pool.add(list(range(1000, 1200)))
    pool.flush()
    (t,) = pool.texts()
    assert t.tolist() == list(range(1151, 1200)) and pool.stats()["tokens"] == 50


def test_pool_memory_per_token_is_bounded():
    rng = random.Random(0)
    phrases = [[rng.randrange(3000) for _ in range(rng.randrange(3, 30))] for _ in range(300)]
    pool = RequestPool(1 << 20, prompts=True)
    for _ in range(200):
        pool.add(phrase_text(rng, phrases, 1000))
    pool.flush()
    st = pool.stats()
    assert st["tokens"] > 190_000 and st["bytes"] / st["tokens"] <= 100, st


def test_builds_run_beside_steps_and_drafts_stay_real():
    """Pool swaps land between steps while a row decodes (a manual pool: each publish
    shows the build of the texts before it, so where they land is fixed, not timed)."""
    # Texts are only added (no eviction), so every occurrence in any earlier pool is in the final one.
    rng = random.Random(5)
    phrases = [[rng.randrange(40) for _ in range(6)] for _ in range(8)]
    pool = RequestPool(1 << 20, prompts=True, sync_tokens=10_000, manual=True)
    eng = SpecEngine(pool=pool)
    eng.add_request("r", phrase_text(random.Random(1), phrases, 5))
    eng.prepare(["r"])
    text = list(phrase_text(random.Random(1), phrases, 5))
    acc, lens, m, d, src = buffers(1)
    seen, swaps, last = [], 0, pool.current[0]
    for step in range(300):
        if step % 7 == 0:
            for _ in range(2):  # 172 texts of 200 tokens by the end: no eviction
                pool.add(phrase_text(rng, phrases, 200))
            pool.publish()  # the texts of the last publish become the rows' pool
        new = phrase_text(rng, phrases, 3)
        acc[0, :3], lens[0] = new, 3
        text += new
        eng.extend(acc, lens, m, d, src)
        seen.append((len(text), int(m[0]), d[0].tolist(), int(src[0])))
        swaps += pool.current[0] is not last
        last = pool.current[0]
    pool.publish()
    pool.flush()
    docs = [t.tolist() for t in pool.texts()]
    assert pool.stats()["builds"] > 40 and pool.stats()["rebuilds"] == 0 and swaps > 40  # the row stepped across every swap
    pooled = [s for s in seen if s[3]]
    assert pooled
    for n, mm, dd, _ in pooled[:: max(1, len(pooled) // 100)]:
        assert pool_draft_ok(text[:n], docs, mm, dd, K)


def test_bad_arguments_are_rejected_without_state_change():
    with pytest.raises(ValueError, match="not both"):
        SpecEngine(pool_tokens=10, pool=RequestPool(10))
    with pytest.raises(TypeError, match="RequestPool"):
        SpecEngine(pool=object())
    with pytest.raises(ValueError, match="max_tokens"):
        RequestPool(1)
    with pytest.raises(TypeError, match="max_tokens"):
        RequestPool(2.5)
    with pytest.raises(ValueError, match="sync_tokens"):
        RequestPool(10, sync_tokens=0)
    pool = RequestPool(100)
    with pytest.raises(ValueError, match="prompt_len"):
        pool.add([1, 2], prompt_len=3)
    with pytest.raises(ValueError):
        pool.add([1, -2])
    assert pool.stats()["added"] == 0
    with pytest.raises(ValueError, match="needs a pool"):
        SpecEngine().extend(*buffers(1))
    eng = SpecEngine(pool=RequestPool(100, prompts=True))
    eng.add_request("a", [1, 2, 3, 1, 2])
    eng.prepare(["a"])
    acc, lens, m, d, src = buffers(1)
    acc[0, 0], lens[0] = 3, 1
    for bad, exc, err in ((np.zeros(2, np.int32), ValueError, "shape"), (np.zeros(1, np.int64), TypeError, "int32"),
                          (d[0, :1], ValueError, "share memory"), ([0], TypeError, "numpy")):
        with pytest.raises(exc, match=err):
            eng.extend(acc, lens, m, d, bad)
    assert eng.automaton_len("a") == 5, "a rejected call appends nothing"
    eng.extend(acc, lens, m, d, src)
    assert eng.automaton_len("a") == 6


def test_separator_is_never_drafted():
    pool = RequestPool(1000, prompts=True)
    eng = SpecEngine(pool=pool)
    eng.add_request("a", [5, 6, 7])
    eng.remove_request("a")
    pool.flush()
    eng.add_request("b", [9, 5, 6, 7])
    eng.prepare(["b"])
    acc, lens, m, d, src = buffers(1)
    eng.extend(acc, lens, m, d, src)
    assert src[0] == 0 and SEPARATOR not in d[0], "the pooled text ended: nothing to draft from it"


def test_a_manual_pool_changes_only_at_publish_and_ranks_draft_alike():
    pool = RequestPool(10_000, prompts=True, manual=True)
    pool.add([1, 2, 3, 4, 5])
    pool.flush()
    assert pool.tokens == 0 and pool.texts() == [], "nothing is built before a publish"
    pool.publish()  # starts building the first text; the engines still see the empty pool
    assert pool.tokens == 0
    pool.flush()
    assert [t.tolist() for t in pool.texts()] == [[1, 2, 3, 4, 5]] and pool.tokens == 0
    pool.publish()
    assert pool.tokens == 6
    with pytest.raises(RuntimeError, match="manual"):
        RequestPool(10).publish()
    # two "ranks": the same adds and publishes at the same steps give the same drafts, whatever the builder's timing
    rng = random.Random(2)
    phrases = [[rng.randrange(30) for _ in range(5)] for _ in range(6)]
    script = [(phrase_text(rng, phrases, 40), phrase_text(rng, phrases, 3)) for _ in range(60)]
    outs = []
    for slow in (False, True):
        pool = RequestPool(10_000, prompts=True, manual=True)
        eng = SpecEngine(pool=pool)
        eng.add_request("r", [0])
        eng.prepare(["r"])
        acc, lens, m, d, src = buffers(1)
        trace = []
        for step, (text, new) in enumerate(script):
            pool.add(text)
            if step % 4 == 0:
                pool.publish()
            if slow:
                pool.flush()  # this rank's builder is always done; the other's may not be
            acc[0, :3], lens[0] = new, 3
            eng.extend(acc, lens, m, d, src)
            trace.append((int(m[0]), d[0].tolist(), int(src[0])))
        outs.append(trace)
    assert outs[0] == outs[1] and any(t[2] for t in outs[0])
