"""The llama.cpp adapter's automaton drafter, without llama.cpp: incremental updates agree
with a drafter rebuilt over each history (extensions, new prompts, rollbacks), the draft
length follows the per-match rule, bad arguments raise, and ``import`` stays light."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from saspec.integrations.llama_cpp import SADraftModel
from saspec.rules import draft_length

PER_MATCH = 1  # index of "per-match" in saspec.rules.DRAFT_LENGTH_RULES


def fresh(history: np.ndarray, k: int = 16) -> tuple[list[int], int]:
    d = SADraftModel(k)
    out = d(history).tolist()
    return out, d.match_len


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["extend", "rollback", "new"]), st.lists(st.integers(0, 5), min_size=1, max_size=12)),
                min_size=1, max_size=12))
def test_incremental_calls_equal_a_rebuild_on_every_history(ops):
    d = SADraftModel(16)
    h = np.array([0], np.int32)
    for op, toks in ops:
        if op == "extend":
            h = np.r_[h, toks].astype(np.int32)
        elif op == "rollback":
            h = np.r_[h[: max(1, h.size // 2)], toks].astype(np.int32)
        else:
            h = np.array(toks, np.int32)
        got = d(h).tolist()
        want, m = fresh(h)
        assert got == want
        assert d.match_len == m


def test_extensions_append_and_rollbacks_rebuild():
    rng = np.random.default_rng(0)
    text = rng.integers(0, 50, 200).astype(np.int32)
    h = np.r_[text, text[:30]].astype(np.int32)
    d = SADraftModel(8)
    d(h[:100])
    for n in range(101, h.size + 1):
        d(h[:n])
    assert d.rebuilds == 1  # every later call only appended
    assert d.match_len >= 30
    d(h[:150])  # a rollback: shorter than the history held
    assert d.rebuilds == 2
    changed = h.copy()
    changed[10] += 1
    d(changed)  # same length plus, but not an extension
    assert d.rebuilds == 3
    assert d(changed).tolist() == fresh(changed, 8)[0]


def test_begin_then_propose_matches_the_call_interface():
    rng = np.random.default_rng(1)
    text = rng.integers(0, 9, 120).astype(np.int32)
    loop = SADraftModel(12)
    loop.begin(text[:40])
    for n in range(41, 121):
        got = loop.propose([int(text[n - 1])])
        assert got == fresh(text[:n], 12)[0]
    # the next turn extends the history: no rebuild
    loop.begin(np.r_[text, 3, 4].astype(np.int32))
    assert loop.rebuilds == 1


def test_draft_length_is_the_per_match_rule():
    text = np.array([5, 6, 7, 8, 9, 10, 11, 12, 13, 14] * 3 + [5, 6], np.int32)
    for k in (1, 3, 16):
        d = SADraftModel(k, min_match=1)
        out = d(text)
        assert d.match_len > 0
        assert out.size == draft_length(d.match_len, k, PER_MATCH, 2.0, -1)
        assert out.dtype == np.intc


def test_no_match_no_draft():
    d = SADraftModel()
    assert d(np.arange(20)).size == 0
    assert d.source == "none"


@pytest.mark.parametrize("bad, err", [
    (np.zeros((2, 3), np.int32), ValueError),
    (np.array([1.5, 2.0]), TypeError),
    (np.array([-1, 2]), ValueError),
    (np.array([], np.int32), ValueError),
])
def test_bad_histories_raise_and_keep_the_state(bad, err):
    d = SADraftModel()
    h = np.array([1, 2, 3, 1, 2], np.int32)
    before = d(h).tolist()
    with pytest.raises(err):
        d(bad)
    assert d(h).tolist() == before and d.rebuilds == 1


@pytest.mark.parametrize("kwargs, err", [
    ({"k": 0}, ValueError), ({"k": 2.5}, ValueError), ({"length_rule": "nope"}, ValueError),
    ({"length_scale": -1.0}, ValueError), ({"pool": object()}, TypeError), ({"occurrence": "nope"}, ValueError),
    ({"policy": "first"}, TypeError),  # the occurrence rule's former name
])
def test_bad_settings_raise(kwargs, err):
    with pytest.raises(err):
        SADraftModel(**kwargs)


def test_propose_before_begin_raises():
    with pytest.raises(RuntimeError, match="begin"):
        SADraftModel().propose([1])


def test_pool_drafts_from_an_earlier_history():
    from saspec import RequestPool

    pool = RequestPool(10_000)
    rng = np.random.default_rng(2)
    answer = rng.integers(100, 200, 60).tolist()
    first = SADraftModel(8, pool=pool)
    first.begin([1, 2, 3])
    first.propose(answer)
    first.close()  # the history joins the pool
    assert pool.flush(10.0)
    second = SADraftModel(8, pool=pool)
    second.begin([7, 8, 9] + answer[:5])
    draft = second.propose([answer[5]])
    assert second.source == "pool" and draft == answer[6:6 + len(draft)] and draft


def test_import_loads_neither_llama_cpp_nor_numba():
    code = ("import sys, saspec.integrations.llama_cpp, saspec.integrations.llama_cpp.drafter as d;"
            "print('llama_cpp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", "import sys, saspec.integrations.llama_cpp;"
                          "print('llama_cpp' in sys.modules, 'numba' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


def test_min_match_withholds_drafts_of_short_matches():
    text = np.array([1, 2, 3, 4, 5, 9, 8, 7, 1, 2], np.int32)  # ends in a 2-token match of "1 2"
    assert SADraftModel(8, min_match=1)(text).size > 0
    d = SADraftModel(8, min_match=3)
    assert d(text).size == 0 and d.match_len == 2 and d.source == "none"
    assert d(np.r_[text, 3]).tolist() == [4, 5, 9, 8, 7, 1]  # a 3-token match drafts again (ceil(2 * 3) tokens)
    with pytest.raises(ValueError, match="min_match"):
        SADraftModel(min_match=0)


def test_importing_the_package_raises_no_deprecation_warning():
    """The drafters, the loop and the server import nothing deprecated."""
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning); "
            "import saspec.integrations.llama_cpp.drafter, saspec.integrations.llama_cpp.loop, "
            "saspec.integrations.llama_cpp.server")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_the_former_hybrid_name_is_gone():
    import saspec.integrations.llama_cpp as lc
    import saspec.integrations.llama_cpp.drafter as drafter

    for module in (lc, drafter):
        with pytest.raises(AttributeError, match="HybridDrafter"):
            module.HybridDrafter
    assert "HybridDrafter" not in dir(lc)


def test_lookup_gives_the_uncut_draft_and_propose_the_rule_cut():
    """The policy is offered the automaton's whole draft at its match; propose cuts it by the rule."""
    h = np.array([1, 2, 3, 4, 5, 6, 7, 8, 1, 2], np.int32)
    a, b = SADraftModel(16, min_match=1), SADraftModel(16, min_match=1)
    a.begin(h[:-1])
    b.begin(h[:-1])
    m, whole = a.lookup(h[-1:])
    cut = b.propose(h[-1:])
    assert m == 2 and whole[:6] == [3, 4, 5, 6, 7, 8]
    assert cut == whole[: draft_length(m, 16, PER_MATCH, 2.0, -1)] and len(cut) < len(whole)
