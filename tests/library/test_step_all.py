"""The CPU backend's one-call step (``extend.step_all``): the same results and the same refusals as the
checked path, with a pool, branch flags, growth marks and rows that fill up inside a step."""

from __future__ import annotations

import numpy as np
import pytest

from saspec import RequestPool, SpecEngine
from saspec import extend as kx
from saspec import host

K = 4
NAMES = ("accepted", "accepted_lens", "match_len_out", "draft_out", "source_out", "branch_out")


def _publish(pool: RequestPool) -> None:
    """Make what was added to the manual ``pool`` the rows' pool."""
    pool.publish()
    pool.flush(timeout=60.0)
    pool.publish()


def test_the_one_call_step_matches_the_checked_path():
    """Two engines over one pool step the same rows with the same tokens: one on the fast path, one
    on the checked path (a read-only ``accepted`` misses the exact types). Every output agrees at every
    step, whether the caller gives ``source_out`` and ``branch_out`` or not, while texts join the pool,
    rows are marked to grow ahead and a row whose blob holds its hint fills up inside a step."""
    rng = np.random.default_rng(3)
    pool = RequestPool(4000, manual=True)
    fast, checked = SpecEngine(pool=pool), SpecEngine(pool=pool)
    rids = [0, 1, 2, 3]
    for r in rids:
        prompt = rng.integers(0, 5, 40)  # a small alphabet: long matches, some that branch
        hint = 8 if r == 3 else None  # room for 8 more tokens, never marked: it fills up inside a step
        for eng in (fast, checked):
            eng.add_request(r, prompt, expected_new_tokens=hint)
    pooled = 0
    for step in range(240):
        if step % 40 == 20:
            pool.add(rng.integers(0, 5, 300))
            _publish(pool)
            pooled += 1
        b = len(rids)
        acc = rng.integers(0, 5, (b, K + 1)).astype(np.int32)
        lens = rng.integers(0, K + 2, b).astype(np.int32)
        give_src, give_branch = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
        got = []
        for eng, read_only in ((fast, False), (checked, True)):
            a, n = acc.copy(), lens.copy()
            a.flags.writeable = not read_only
            m, d = np.full(b, -7, np.int32), np.full((b, K), -7, np.int32)
            s, br = np.full(b, -7, np.int32), np.full(b, -7, np.int32)
            eng.prepare(rids)
            eng.extend(a, n, m, d, s if give_src else None, br if give_branch else None)
            got.append((m.tolist(), d.tolist(), s.tolist(), br.tolist()))
        assert got[0] == got[1], (step, got)
    for eng in (fast, checked):
        eng._backend.wait_growth()
    assert [fast.automaton_len(r) for r in rids] == [checked.automaton_len(r) for r in rids]
    st_fast, st_checked = fast.stats(), checked.stats()
    assert st_fast["slow_steps"] == 0 and st_checked["slow_steps"] == 240
    assert st_fast["grown_in_step"] > 0 and st_fast["grown_ahead"] > 0, st_fast
    assert pooled and fast.request_pool.tokens > 0
    pool.close()


def _pool_engine() -> tuple[SpecEngine, RequestPool]:
    pool = RequestPool(1000, manual=True)
    pool.add([9, 1, 2, 3, 4, 5])
    _publish(pool)
    eng = SpecEngine(pool=pool)
    eng.add_request("a", [1, 2, 3, 1, 2])
    eng.add_request("b", [6, 6, 6])
    eng.prepare(["a", "b"])
    return eng, pool


def _arrays(b: int = 2) -> list[np.ndarray]:
    return [np.zeros((b, K + 1), np.int32), np.ones(b, np.int32), np.full(b, -7, np.int32),
            np.full((b, K), -7, np.int32), np.full(b, -7, np.int32), np.full(b, -7, np.int32)]


@pytest.mark.parametrize("i, j", [(4, 0), (4, 1), (4, 2), (4, 3), (5, 0), (5, 1), (5, 2), (5, 3), (5, 4)])
def test_row_outputs_sharing_memory_are_refused_before_the_step(i, j):
    """``source_out`` or ``branch_out`` overlapping an earlier argument by one word: refused naming
    both, nothing appended, no output written."""
    eng, pool = _pool_engine()
    arrays = _arrays()
    base = np.zeros(64, np.int32)
    first = base[: arrays[j].size].reshape(arrays[j].shape)
    second = base[arrays[j].size - 1: arrays[j].size - 1 + arrays[i].size]
    first[...] = arrays[j]
    second[...] = arrays[i]
    arrays[j], arrays[i] = first, second
    before = [x.copy() for x in arrays]
    with pytest.raises(ValueError, match=f"{NAMES[i]} and {NAMES[j]} share memory"):
        eng.extend(*arrays)
    assert eng.automaton_len("a") == 5 and eng.automaton_len("b") == 3
    for name, x, y in zip(NAMES, arrays, before):
        if name not in (NAMES[i], NAMES[j]):  # the two overlap: writing one would show in the other
            assert np.array_equal(x, y), name
    pool.close()


@pytest.mark.parametrize("which", [4, 5])
def test_row_outputs_of_the_wrong_length_are_refused_first(which):
    """A ``source_out`` or ``branch_out`` of the wrong length is named before a bad step argument
    after it would be (``extend``'s order), and nothing changes."""
    eng, pool = _pool_engine()
    arrays = _arrays()
    arrays[which] = np.zeros(3, np.int32)
    arrays[1][0] = K + 2  # out of range: refused too, but named after
    with pytest.raises(ValueError, match=rf"{NAMES[which]} must have shape \(2,\) for batch 2, got \(3,\)"):
        eng.extend(*arrays)
    assert eng.automaton_len("a") == 5 and arrays[2].tolist() == [-7, -7]
    arrays[which] = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match=r"accepted_lens\[0\]"):
        eng.extend(*arrays)
    arrays[1][0] = 1
    eng.extend(*arrays)
    assert eng.automaton_len("a") == 6
    pool.close()


def test_a_step_with_a_pool_and_branch_flags_is_one_jitted_call(monkeypatch):
    """With native int32 arrays, a pool (empty or not) and branch flags, the step runs none of the
    checked path's Python checks nor a separate kernel for the marks or the pool."""
    pool = RequestPool(1000, manual=True)
    eng = SpecEngine(pool=pool)
    eng.add_request("a", [1, 2, 3, 1, 2])
    eng.prepare(["a"])
    arrays = _arrays(1)
    arrays[0][0, 0] = 3
    eng.extend(*arrays)  # compiles (or loads) the kernel before the hooks go in

    def called(*args, **kwargs):
        raise AssertionError("the fast path left its one jitted call")

    for name in ("check_no_overlap", "as_int32_array"):
        monkeypatch.setattr(host, name, called)
    for name in ("check_source", "check_step", "rows_past_mark", "pool_rows"):
        monkeypatch.setattr(kx, name, called)
    for pooled in (False, True):
        if pooled:
            pool.add([9, 1, 2, 3, 4, 5])
            _publish(pool)
        arrays[0][0, 0] = 1 + eng.automaton_len("a") % 3
        eng.extend(*arrays)
        eng.extend(*arrays[:4], None, arrays[5])
        eng.extend(*arrays[:4], arrays[4], None)
    assert arrays[4][0] in (0, 1) and arrays[5][0] in (0, 1)
    assert eng.stats()["slow_steps"] == 0
    pool.close()
