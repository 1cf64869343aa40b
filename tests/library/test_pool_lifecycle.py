"""The cross-request pool's lifecycle and limits: a failed build never breaks removal, a
pool closes (and an unreferenced one is collected with its thread), eviction is strictly
oldest first, a long text is kept as a copy of its tail, ``stats`` counts every automaton
held, the separator's id never joins two pooled texts, and the bounds match the docs."""

from __future__ import annotations

import gc
import logging
import tracemalloc
import weakref

import numpy as np
import pytest

from saspec import SpecEngine, build
from saspec.pool import SEPARATOR, RequestPool

K = 4


def arrays(b: int):
    return (np.zeros((b, K + 1), np.int32), np.zeros(b, np.int32), np.zeros(b, np.int32),
            np.zeros((b, K), np.int32), np.zeros(b, np.int32))


def _fail_first_build(pool: RequestPool) -> list[int]:
    """Make ``pool``'s first build raise ``MemoryError``; returns the list it counts calls in."""
    real, calls = pool._build, []

    def build_once_failing(*args):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("a build that runs out of memory")
        return real(*args)

    pool._build = build_once_failing
    return calls


def test_a_failed_pool_build_is_reported_and_removal_still_frees_the_slot(caplog):
    pool = RequestPool(1000)
    calls = _fail_first_build(pool)
    eng = SpecEngine(pool=pool)
    for r in "abc":
        eng.add_request(r, [1, 2, 3, 4, 5])
    eng.prepare(["a", "b", "c"])
    acc, lens, m, d, src = arrays(3)
    acc[:, :2], lens[:] = (6, 7), 2  # each request's output: [6, 7]
    eng.extend(acc, lens, m, d, src)
    with caplog.at_level(logging.ERROR, logger="saspec"):
        eng.remove_request("a")  # its build fails in the background
        assert pool.flush(30) is True  # reported, not raised
    assert calls == [1] and pool.stats()["failed_builds"] == 1 and pool.stats()["failed_texts"] == 1
    assert any("request pool failed" in rec.getMessage() for rec in caplog.records)
    eng.remove_request("b")  # removal completes: the slot is freed and the batch forgotten
    assert "b" not in eng and len(eng) == 1 and eng.batch is None and eng.stats()["requests"] == 1
    eng.add_request("d", [7, 8, 9])  # takes a freed slot
    eng.prepare(["c", "d"])
    acc, lens, m, d, src = arrays(2)
    eng.extend(acc, lens, m, d, src)
    pool.flush(30)
    assert [t.tolist() for t in pool.texts()] == [[6, 7]]  # the pool keeps building: b's output
    eng.remove_request("c")
    pool.flush(30)
    assert len(pool.texts()) == 2 and pool.stats()["builds"] == 2


def test_close_stops_the_builder_and_engines_close_the_pool_they_own():
    pool = RequestPool(100)
    pool.add([1, 2, 3])
    pool.flush(30)
    thread = pool._thread
    pool.close()
    assert pool.closed and not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        pool.add([4, 5])
    assert [t.tolist() for t in pool.texts()] == [[1, 2, 3]]  # what was built stays readable
    pool.close()  # idempotent

    with RequestPool(100) as p:
        p.add([1, 2])
        p.flush(30)
    assert p.closed and not p._thread.is_alive()

    shared = RequestPool(100)
    with SpecEngine(pool_tokens=100) as own, SpecEngine(pool=shared) as other:
        for e in (own, other):
            e.add_request("r", [1, 2, 1])
            e.remove_request("r")
    assert own.request_pool.closed and not shared.closed  # a shared pool is its caller's to close
    own.add_request("s", [1, 2])
    own.remove_request("s")  # a closed pool takes no text; removal still completes
    assert len(own) == 0
    shared.close()


def test_dropped_engines_leave_no_pool_and_no_thread_behind():
    refs = []
    for i in range(40):
        eng = SpecEngine(pool_tokens=1000)
        eng.add_request(i, np.arange(50) % 7)
        eng.prepare([i])
        acc, lens, m, d, src = arrays(1)
        lens[0] = 3  # an output of three tokens, which the pool takes
        eng.extend(acc, lens, m, d, src)
        eng.remove_request(i)
        assert eng.request_pool.flush(30)
        refs.append((weakref.ref(eng.request_pool), eng.request_pool._thread))
        del eng
    gc.collect()
    assert [r() for r, _ in refs] == [None] * 40
    for _, thread in refs:
        thread.join(30)
    assert not any(t.is_alive() for _, t in refs)


def test_eviction_is_strictly_oldest_first_with_queued_texts():
    """A 40-token pool holding a built 16-token text, then 22, 28 and 19 queued: keeping
    19 drops 28 and 22, so the older 16 goes too."""
    pool = RequestPool(40, manual=True)
    texts = [list(range(100 + 100 * i, 100 + 100 * i + n)) for i, n in enumerate((16, 22, 28, 19))]
    pool.add(texts[0])
    pool.publish()
    pool.flush(30)
    for t in texts[1:]:
        pool.add(t)
    pool.publish()
    pool.flush(30)
    assert [t.tolist() for t in pool.texts()] == [texts[3]]
    assert pool.stats()["evicted"] == 3


def test_a_text_longer_than_the_pool_is_kept_as_a_copy_of_its_tail():
    pool = RequestPool(100)
    big = np.arange(4_000_000, dtype=np.int64) % 1000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pool.add(big)
        pool.flush(30)
        del big
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert [t.shape[0] for t in pool.texts()] == [99]
    assert kept < 1 << 20, f"the pool keeps {kept} bytes for a 99-token text"


def test_stats_count_both_automata_of_a_manual_pool():
    pool = RequestPool(10_000, manual=True)
    pool.add(np.arange(2000) % 50)
    pool.publish()
    pool.flush(30)  # built, not yet published: the engines still see the empty pool
    latest = pool._latest[0]
    assert pool.current[0] is not latest
    texts = 4 * 2000
    assert pool.stats()["bytes"] >= latest.nbytes + pool.current[0].nbytes + texts


def test_the_separator_id_never_joins_two_pooled_texts():
    pool = RequestPool(1000)
    pool.add([1, 2, 3])
    pool.add([7, 8, 9])
    pool.flush(30)
    eng = SpecEngine(pool=pool)
    eng.add_request("r", [5, 1, 2, 3])
    eng.prepare(["r"])
    acc, lens, m, d, src = arrays(1)
    eng.extend(acc, lens, m, d, src)  # the row now follows [1 2 3] in the pool
    acc[0, 0], lens[0] = SEPARATOR, 1
    eng.extend(acc, lens, m, d, src)
    assert src[0] == 0 and d[0].tolist()[:3] != [7, 8, 9], "a match through the separator drafts the next text"


def test_max_tokens_is_capped_at_the_offset_limit():
    RequestPool(build.MAX_REQUEST_TOKENS)
    with pytest.raises(ValueError, match="max_tokens"):
        RequestPool(build.MAX_REQUEST_TOKENS + 1)
    with pytest.raises(ValueError, match=r"max_tokens must be an int in \[2, "):
        RequestPool(1)
    assert "[2, ``build.MAX_REQUEST_TOKENS``]" in RequestPool.__doc__


class _CountingList(list):
    visits = 0

    def __iter__(self):
        for x in list.__iter__(self):
            _CountingList.visits += 1
            yield x


def test_manual_add_does_not_walk_its_waiting_list():
    pool = RequestPool(1 << 20, manual=True)
    pool._waiting = _CountingList()
    for _ in range(300):
        pool.add([1, 2, 3])
    assert _CountingList.visits == 0 and pool.stats()["pending"] == 300
