"""Host memory per request: small for short requests, bounded for long ones,
and growth by geometric re-allocation (amortized O(1) per token)."""

from __future__ import annotations

import numpy as np
import pytest

from saspec import SpecEngine
from saspec_bench.synthetic import code_like_prompt, random_prompt


# -- bytes per token, and growth by geometric re-allocation ----------------------------


def bytes_per_token(prompt):
    eng = SpecEngine()
    eng.add_request("r", prompt)
    st = eng.stats()
    assert st["tokens"] == len(prompt)
    return st["bytes"] / st["tokens"]


@pytest.mark.parametrize("make", [random_prompt, code_like_prompt])
def test_short_request_holds_at_most_120_bytes_per_token(make):
    assert bytes_per_token(make(500)) <= 120


@pytest.mark.parametrize("make", [random_prompt, code_like_prompt])
def test_long_request_holds_at_most_100_bytes_per_token(make):
    assert bytes_per_token(make(200_000)) <= 100


def test_decoding_grows_geometrically():
    """3 tokens per step from 500 to 15,500 tokens: each blob re-allocation
    copies the automaton, so the sizes must grow geometrically (their sum, the
    words ever copied, stays within a constant factor of the final size)."""
    rng = np.random.default_rng(0)
    eng = SpecEngine()
    eng.add_request("r", code_like_prompt(500))
    eng.prepare(["r"])
    acc = np.zeros((1, 9), np.int32)
    lens = np.array([3], np.int32)
    match = np.zeros(1, np.int32)
    draft = np.zeros((1, 8), np.int32)
    sizes = [eng.stats()["bytes"]]
    for _ in range(5000):
        acc[0, :3] = rng.integers(0, 5000, 3)  # random tokens: the most states and edges per token
        eng.extend(acc, lens, match, draft)
        b = eng.stats()["bytes"]
        if b != sizes[-1]:
            sizes.append(b)
    st = eng.stats()
    assert st["tokens"] == 15_500
    assert st["bytes"] / st["tokens"] <= 120
    assert len(sizes) <= 12 and sum(sizes) <= 4 * sizes[-1]
    assert all(b > a for a, b in zip(sizes, sizes[1:]))


# -- the engine's arena: mid-size blobs packed onto huge pages -------------------------

from saspec import arena as arenas, build  # noqa: E402

needs_arena = pytest.mark.skipif(not arenas.ADVISES_HUGE_PAGES, reason="the arena packs blobs only where madvise exists (Linux)")


def test_size_classes_waste_at_most_an_eighth():
    for nbytes in list(range(arenas.ARENA_MIN, arenas.ARENA_MAX, 4_092)) + [arenas.ARENA_MIN, arenas.ARENA_MAX - 4]:
        size = arenas.size_class(nbytes)
        assert nbytes <= size <= 1.125 * nbytes and size % 8192 == 0, nbytes
    assert arenas.size_class(100_000) == arenas.size_class(arenas.size_class(100_000))


def _span(blob):
    return blob.ctypes.data, blob.ctypes.data + arenas.blob_bytes(blob)


@needs_arena
def test_arena_blocks_are_disjoint_reused_only_when_unseen():
    arena = arenas.BlobArena()
    words = 40_000  # 160 kB
    a, b = arena(words), arena(words)
    assert a.shape == (words,) and a.dtype == np.int32 and a.flags.c_contiguous and a.flags.writeable
    (a0, a1), (b0, b1) = _span(a), _span(b)
    assert a1 <= b0 or b1 <= a0  # disjoint
    assert arenas.blob_bytes(a) == arenas.size_class(4 * words) < 1.125 * a.nbytes
    a[:] = 1
    b[:] = 2
    assert (a == 1).all()
    view = a[10:20]
    addr = a.ctypes.data
    del a
    c = arena(words)  # a's block is still seen through `view`
    assert c.ctypes.data != addr
    del view
    d = arena(words)  # now it is free again
    assert d.ctypes.data == addr
    assert arena.reserved_bytes == arenas.ARENA_CHUNK


@needs_arena
def test_arena_reuses_a_somewhat_larger_free_block():
    arena = arenas.BlobArena()
    big = arena(100_000)
    addr, size = big.ctypes.data, arenas.blob_bytes(big)
    del big
    too_small = arena(int(100_000 / arenas.ARENA_REUSE) - 2_000)  # the free block is over ARENA_REUSE times larger
    assert too_small.ctypes.data != addr
    smaller = arena(80_000)
    assert smaller.ctypes.data == addr and arenas.blob_bytes(smaller) == size  # counted as the block it holds
    del smaller
    again = arena(100_000)
    assert again.ctypes.data == addr


@needs_arena
def test_arena_used_bytes_count_the_blocks_still_seen():
    arena = arenas.BlobArena()
    a, b = arena(40_000), arena(100_000)
    both = arenas.blob_bytes(a) + arenas.blob_bytes(b)
    assert arena.used_bytes == both
    view = a[5:9]
    del a
    assert arena.used_bytes == both  # still seen through `view`
    del view, b
    assert arena.used_bytes == 0
    c = arena(80_000)  # b's block, reused
    assert arena.used_bytes == arenas.blob_bytes(c) == arenas.size_class(400_000)


def test_address_is_the_blobs_data_pointer():
    """``arenas.address`` reads arena blobs' addresses from their block; it must
    agree with numpy for those, reused ones, and blobs outside the arena."""
    arena = arenas.BlobArena()
    blobs = [arena(w) for w in (arenas.ARENA_MIN // 4, 30_000, 1000, arenas.ARENA_MAX // 4, 30_000)]
    del blobs[1]
    blobs.append(arena(29_000))  # the freed block, if the arena is in use
    blobs += [arenas.empty_blob(100), arenas.empty_blob(arenas.HUGE_PAGE // 4 + 5)]
    for blob in blobs:
        assert arenas.address(blob) == blob.ctypes.data


@needs_arena
def test_arena_chunks_start_on_huge_pages_and_other_sizes_bypass_it():
    arena = arenas.BlobArena()
    first = arena(arenas.ARENA_MIN // 4)
    assert first.ctypes.data % arenas.HUGE_PAGE == 0  # the first block of a chunk
    small, big = arena(1000), arena(arenas.ARENA_MAX // 4)
    assert not arenas.is_arena_blob(small) and not arenas.is_arena_blob(big)
    assert arenas.blob_bytes(small) == small.nbytes
    blobs = [arena(900_000) for _ in range(20)]  # 3.6 MB each: past one chunk
    assert arena.reserved_bytes > arenas.ARENA_CHUNK
    spans = sorted(_span(x) for x in blobs + [first])
    assert all(p[1] <= q[0] for p, q in zip(spans, spans[1:]))


@needs_arena
def test_arena_under_threads_never_hands_out_a_live_block():
    import threading

    arena = arenas.BlobArena()
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        live = []
        for _ in range(300):
            if live and rng.random() < 0.5:
                live.pop(int(rng.integers(len(live))))
            else:
                x = arena(int(rng.integers(16_384, 200_000)))
                x[[0, -1]] = seed  # both ends: a shared block would be overwritten by another thread
                live.append(x)
            if any(x[0] != seed or x[-1] != seed for x in live):
                errors.append(seed)
                return

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_engine_reports_blocks_and_keeps_results():
    """Mid-size requests live in the engine's arena; ``stats`` counts their
    blocks, and a request re-added after another was removed (reusing its
    block) drafts like a fresh engine."""
    eng = SpecEngine()
    p1, p2 = code_like_prompt(4000, seed=1), code_like_prompt(4000, seed=2)
    eng.add_request("a", p1)
    bytes_a = eng.stats()["bytes"]
    assert 4000 * 70 < bytes_a <= 1.125 * 4000 * 100
    addr_a = eng._backend.slots.blobs[eng._slot["a"]].ctypes.data
    eng.remove_request("a")
    eng.add_request("b", p2)
    if arenas.ADVISES_HUGE_PAGES:  # the arena is in use: b takes the block a left
        assert eng._backend.slots.blobs[eng._slot["b"]].ctypes.data == addr_a
    ref = SpecEngine()
    ref.add_request("b", p2)
    out = []
    for e in (eng, ref):
        e.prepare(["b"])
        acc = np.array([[int(p2[100]), int(p2[101]), 0, 0, 0, 0, 0, 0, 0]], np.int32)
        m, d = np.zeros(1, np.int32), np.zeros((1, 8), np.int32)
        e.extend(acc, np.array([2], np.int32), m, d)
        out.append((int(m[0]), d.tolist()))
    assert out[0] == out[1] and out[0][0] > 0
