"""The policy's and the cost model's inputs are checked where they enter: a timing must be a real
number (a bool or None raises naming ``seconds``; a value not finite or not > 0 is ignored and
counted, as documented), a cost shape or profile point outside [MIN_COST, MAX_COST] (a denormal
one made every cost NaN, and the policy then never drafted) is refused, a timing whose ratio to
the shape leaves that range is ignored so that no finite timing makes a cost NaN, and
``max_tokens`` is bounded."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saspec.policy import DraftPolicy, StepCost
from saspec import step_cost

K = 8


def _batch():
    """One row with a long match and a full offer, and what it emitted (its buffers)."""
    match = np.array([24], np.int32)
    offered = np.array([K], np.int32)
    drafts = np.arange(K, dtype=np.int32)[None]
    new = np.zeros((1, K + 1), np.int32)
    lens = np.array([K + 1], np.int32)
    return match, offered, drafts, new, lens


def _timed(p: DraftPolicy) -> tuple[int, int, int]:
    s = p.stats
    return s["steps"], s["timed"], s["ignored_timings"]


@pytest.mark.parametrize("seconds", [True, False, None, "0.1", np.bool_(True), [0.1]])
def test_observe_step_takes_only_a_real_number_of_seconds(seconds):
    p = DraftPolicy(K)
    before = (_timed(p), p.cost.step)
    with pytest.raises(TypeError, match="seconds"):
        p.observe_step(10, seconds)
    assert (_timed(p), p.cost.step) == before


@pytest.mark.parametrize("seconds", [True, None, "0.1"])
def test_step_takes_only_a_real_number_of_seconds(seconds):
    p = DraftPolicy(K)
    p.step(*_batch(), 0.01, False)
    before = (_timed(p), p.cost.step)
    with pytest.raises(TypeError, match="seconds"):
        p.step(*_batch(), seconds, True)
    assert (_timed(p), p.cost.step) == before


@pytest.mark.parametrize("seconds", [0, 0.0, -1.0, math.nan, math.inf, np.float32(math.nan)])
def test_a_timing_not_finite_or_not_positive_is_ignored_and_counted(seconds):
    p = DraftPolicy(K)
    p.observe_step(10, seconds)
    p.step(*_batch(), 0.01, False)
    p.step(*_batch(), seconds, True)
    assert p.stats["timed"] == 0 and p.stats["ignored_timings"] == 2


@pytest.mark.parametrize("seconds", [0.02, 3, np.float32(0.02), np.int64(2)])
def test_real_timings_of_any_numeric_type_are_taken(seconds):
    p = DraftPolicy(K)
    p.observe_step(10, seconds)
    assert p.stats["timed"] == 1


@pytest.mark.parametrize("value", [1e-320, 5e-324, 1e-200, 1e200, 1e308])
def test_a_shape_outside_the_cost_range_is_refused(value):
    with pytest.raises(ValueError, match=r"shape must be finite and in \[1e-150, 1e\+150\]"):
        StepCost(lambda n: np.full(n.shape, value), max_tokens=64)
    with pytest.raises(ValueError, match="seconds must be finite"):
        StepCost.from_points([1, 64], [value, 2 * value], max_tokens=64)


def test_the_denormal_prior_of_the_report_is_refused_instead_of_turning_costs_to_nan():
    with pytest.raises(ValueError, match="seconds"):
        StepCost.from_points([1, 100], [1e-320, 2e-320])


@settings(max_examples=60, deadline=None)
@given(st.floats(-140, 140),
       st.lists(st.tuples(st.integers(1, 200), st.floats(min_value=5e-324, max_value=1.7e308)), min_size=1,
                max_size=30))
def test_no_finite_timing_makes_a_cost_or_a_rate_nan(exponent, timings):
    scale = 10.0 ** exponent
    cost = StepCost(lambda n: scale * (4.0 + n), max_tokens=128)
    decisions = []
    p = DraftPolicy(K, cost=cost, log=decisions.append)
    for tokens, seconds in timings:
        p.observe_step(tokens, seconds)
    costs = cost.seconds(np.arange(1, 300))
    assert np.all(np.isfinite(costs)) and np.all(costs > 0), costs
    p.step(*_batch(), float("nan"), False)
    assert math.isfinite(decisions[-1].rate) and math.isfinite(decisions[-1].plain_rate), decisions[-1]


@pytest.mark.parametrize("max_tokens", [2**20 + 1, 10**8, 2**63])
def test_max_tokens_is_bounded(max_tokens):
    with pytest.raises(ValueError, match="max_tokens must be at most"):
        StepCost(max_tokens=max_tokens)


def test_the_bound_is_the_documented_constant():
    assert step_cost.MAX_STEP_TOKENS == 2**20
    assert StepCost(max_tokens=4096).max_tokens == 4096


def test_neural_timings_and_step_tokens_are_checked_like_step_timings():
    from saspec.policy import DraftPolicy

    p = DraftPolicy(4)
    for bad in (True, None, "1"):
        with pytest.raises(TypeError, match="seconds"):
            p.observe_neural(bad, read=4, drafted=2)
    with pytest.raises(TypeError, match="tokens"):
        p.observe_step(2.5, 0.01)
    with pytest.raises(TypeError, match="tokens"):
        p.observe_step(True, 0.01)
    p.observe_neural(float("nan"), read=4, drafted=2)  # not finite: ignored, as before
    assert p.neural_ratio() == p.neural_cost



def test_step_takes_branched_in_any_integer_form_alike_and_refuses_a_wrong_shape():
    """``branched`` as None (zeros), an int32 array (passed on as is), or any other integer form (converted)
    gives the same lengths and evidence; an int32 array of another shape raises naming it, changing nothing."""
    rng = np.random.default_rng(3)
    b = 6
    flags = (rng.random(b) < 0.5).astype(np.int32)
    matches = [rng.integers(0, 30, b).astype(np.int32) for _ in range(12)]
    forms = {"int32": lambda: flags, "int64": lambda: flags.astype(np.int64), "list": lambda: flags.tolist(),
             "strided": lambda: np.repeat(flags, 2)[::2], "none": lambda: None,
             "zeros": lambda: np.zeros(b, np.int32)}
    runs = {}
    for name, form in forms.items():
        p, out = DraftPolicy(K), []
        for step, match in enumerate(matches):
            drafts = (np.arange(K, dtype=np.int32)[None] + match[:, None]) % 5
            out.append(p.step(match, np.minimum(match, K).astype(np.int32), drafts, drafts[:, :4] % 3,
                              np.full(b, 3, np.int32), 0.01, step > 0, form()).copy())
        runs[name] = (np.stack(out), p._bk.copy())
    for name, want in (("int64", "int32"), ("list", "int32"), ("strided", "int32"), ("none", "zeros")):
        assert np.array_equal(runs[name][0], runs[want][0]) and np.array_equal(runs[name][1], runs[want][1])
    assert not np.array_equal(runs["int32"][1], runs["zeros"][1])  # the flags mattered
    p = DraftPolicy(K)
    p.step(*_batch(), 0.01, False)
    stats, bk, tokens = p.stats, p._bk.copy(), p.last_tokens
    with pytest.raises(ValueError, match="branched"):
        p.step(*_batch(), 0.01, True, np.zeros(2, np.int32))
    assert p.stats == stats and p.last_tokens == tokens and np.array_equal(p._bk, bk)
