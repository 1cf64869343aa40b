"""Whether a match's earlier occurrences went on alike: ``core.branched``, ``SpecEngine.extend``'s
``branch_out`` (own rows and pool rows, on both backends) and ``SingleSequence.branched``, against a
brute-force oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saspec import RequestPool, SpecEngine, SuffixAutomaton, core
from saspec.single import SingleSequence

K = 4


def continuations(text: list[int], m: int) -> set[int]:
    """The tokens that followed the earlier occurrences of text's last ``m`` tokens."""
    suffix = text[len(text) - m:]
    return {text[e + 1] for e in range(m - 1, len(text) - 1) if text[e - m + 1: e + 1] == suffix}


def branched_oracle(text: list[int], m: int) -> int:
    return int(m > 0 and len(continuations(text, m)) > 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=120), st.sampled_from(["first", "recent", "near-first"]))
def test_branched_is_whether_the_matched_suffix_went_on_with_several_tokens(text, occurrence):
    sa = SuffixAutomaton(occurrence=occurrence)
    for i, t in enumerate(text):
        sa.extend([t])
        m, _ = sa.match()
        assert core.branched(sa._buf) == branched_oracle(text[: i + 1], m), (text[: i + 1], m)


def test_growth_keeps_the_flag():
    rng = np.random.default_rng(1)
    text = rng.integers(0, 3, 2000).tolist()
    sa = SuffixAutomaton(text[:10])  # a small first blob: the rest grows it many times
    sa.extend(text[10:])
    m, _ = sa.match()
    assert core.branched(sa._buf) == branched_oracle(text, m)


def test_branch_out_on_both_backends_matches_the_oracle(backend):
    rng = np.random.default_rng(2)
    b, steps = 5, 60
    texts = [rng.integers(0, 4, int(rng.integers(5, 40))).tolist() for _ in range(b)]
    eng = backend.engine()
    for i, t in enumerate(texts):
        eng.add_request(i, t)
    eng.prepare(list(range(b)))
    acc = np.zeros((b, K + 1), np.int32)
    lens, mout, branch = np.zeros(b, np.int32), np.zeros(b, np.int32), np.full(b, -7, np.int32)
    dout = np.zeros((b, K), np.int32)
    seen = set()
    for _ in range(steps):
        lens[:] = rng.integers(0, K + 2, b)
        acc[:] = rng.integers(0, 4, acc.shape)
        backend.extend(eng, acc, lens, mout, dout, None, branch)
        for i in range(b):
            texts[i] += acc[i, : lens[i]].tolist()
            assert branch[i] == branched_oracle(texts[i], int(mout[i])), (i, mout[i])
            seen.add(int(branch[i]))
    assert seen == {0, 1}


def test_branch_out_is_checked_and_a_rejected_call_changes_nothing():
    eng = SpecEngine()
    eng.add_request("r", [1, 2, 3, 1, 2])
    eng.prepare(["r"])
    acc, lens = np.zeros((1, K + 1), np.int32), np.ones(1, np.int32)
    mout, dout = np.zeros(1, np.int32), np.zeros((1, K), np.int32)
    with pytest.raises(ValueError, match=r"branch_out must have shape \(1,\)"):
        eng.extend(acc, lens, mout, dout, None, np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="branch_out and match_len_out share memory"):
        eng.extend(acc, lens, mout, dout, None, mout)
    with pytest.raises(TypeError, match="branch_out must have dtype int32"):
        eng.extend(acc, lens, mout, dout, None, np.zeros(1, np.int64))
    assert eng.automaton_len("r") == 5


def test_pool_rows_report_whether_the_pool_state_branches():
    """A row drafting from the pool reports the pool's continuations of its match."""
    for pooled, expect in (([[9, 1, 2, 3, 4, 5], [8, 1, 2, 3, 7, 7]], 1), ([[9, 1, 2, 3, 4, 5], [8, 0, 2, 3, 7]], 0)):
        pool = RequestPool(1000, manual=True)
        for t in pooled:
            pool.add(t)
        pool.publish()
        pool.flush()
        pool.publish()
        eng = SpecEngine(pool=pool)
        eng.add_request("r", [6, 1])
        eng.prepare(["r"])
        acc = np.zeros((1, K + 1), np.int32)
        acc[0, :2] = (2, 3)
        lens, mout, dout = np.array([2], np.int32), np.zeros(1, np.int32), np.zeros((1, K), np.int32)
        src, branch = np.zeros(1, np.int32), np.full(1, -7, np.int32)
        eng.extend(acc, lens, mout, dout, src, branch)
        assert src[0] == 1 and mout[0] == 3 and branch[0] == expect, (pooled, src, mout, branch)
        pool.close()


def test_single_sequence_reports_the_flag():
    eng = SpecEngine()
    seq = SingleSequence(eng, [5, 1, 2, 7, 1, 2, 8, 3], K)
    seq.extend([1, 2])  # "1 2" went on with 7 and with 8
    assert seq.branched
    seq.extend([8])  # "1 2 8" went on only with 3
    assert not seq.branched
