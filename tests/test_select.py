"""select_drafts (torch) and select_drafts_np agree at the limits of a scalar threshold."""

from __future__ import annotations

import math

import numpy as np
import pytest

from saspec.select import (N_BUCKETS, AdaptiveSelector, adaptive_init, match_bucket, select_drafts,
                            select_drafts_np)

MATCH = [0, 1, 2, 2**31 - 2, 2**31 - 1]


def expected_use(threshold: float) -> list[bool]:
    """The rule stated directly: SA where match >= threshold and match > 0."""
    return [m > 0 and m >= threshold for m in MATCH]


LIMITS = [
    -(2**63) - 1, -(2**63), -(2**31) - 1, -(2**31), -1, 0, 1, 2, 2.5, 2**31 - 2, 2**31 - 1.5, 2**31 - 1, 2**31,
    2**31 + 0.5, 2**32, 2**63 - 1, 2**63, 2**64, 10**30, 1e300, -1e300, math.inf, -math.inf,
]


def _inputs(lib, dtype):
    b, k = len(MATCH), 3
    neural = lib.full((b, k), 7) if lib is np else lib.full((b, k), 7, dtype=dtype)
    sa = np.arange(b * k).reshape(b, k) + 100
    match = np.array(MATCH, dtype=np.int32 if dtype is None else np.int64)
    if lib is np:
        return neural, sa, match
    return neural, lib.from_numpy(sa), lib.from_numpy(np.array(MATCH, np.int32))


@pytest.mark.parametrize("threshold", LIMITS, ids=repr)
def test_scalar_threshold_limits_numpy(threshold):
    neural, sa, match = _inputs(np, None)
    drafts, use = select_drafts_np(neural, sa, match, threshold)
    assert use.tolist() == expected_use(threshold)
    assert np.array_equal(drafts, np.where(use[:, None], sa, neural))


def test_torch_match_len_and_threshold_device_are_checked():
    torch = pytest.importorskip("torch")
    neural, sa, match = _inputs(torch, torch.int32)
    with pytest.raises(ValueError, match="match_len must hold integers"):
        select_drafts(neural, sa, match.to(torch.float32), 2)
    with pytest.raises(ValueError, match="threshold must be on match_len's device"):
        select_drafts(neural, sa, match, torch.tensor(2, device="meta"))


@pytest.mark.parametrize("threshold", LIMITS, ids=repr)
def test_scalar_threshold_limits_torch(threshold):
    torch = pytest.importorskip("torch")
    neural, sa, match = _inputs(torch, torch.int32)
    drafts, use = select_drafts(neural, sa, match, threshold)
    assert use.tolist() == expected_use(threshold)
    assert torch.equal(drafts, torch.where(use.unsqueeze(1), sa, neural))
    # int64 match lengths too
    drafts64, use64 = select_drafts(neural, sa, match.to(torch.int64), threshold)
    assert use64.tolist() == expected_use(threshold)


@pytest.mark.parametrize("threshold", [np.int64(2**31), np.uint64(2**63), np.float32(3.0), np.int32(-5), True])
def test_numpy_scalar_thresholds(threshold):
    torch = pytest.importorskip("torch")
    neural, sa, match = _inputs(torch, torch.int32)
    _, use = select_drafts(neural, sa, match, threshold)
    _, use_np = select_drafts_np(neural.numpy(), sa.numpy(), match.numpy(), threshold)
    assert use.tolist() == use_np.tolist() == expected_use(float(threshold))


@pytest.mark.parametrize("threshold", [math.nan, float("nan"), np.float64("nan")])
def test_nan_threshold_is_rejected(threshold):
    torch = pytest.importorskip("torch")
    neural, sa, match = _inputs(torch, torch.int32)
    with pytest.raises(ValueError, match="NaN"):
        select_drafts(neural, sa, match, threshold)
    with pytest.raises(ValueError, match="NaN"):
        select_drafts_np(neural.numpy(), sa.numpy(), match.numpy(), threshold)


@pytest.mark.parametrize("threshold", ["4", None, [1, 2], object()])
def test_non_numeric_threshold_is_rejected(threshold):
    torch = pytest.importorskip("torch")
    neural, sa, match = _inputs(torch, torch.int32)
    with pytest.raises((TypeError, ValueError), match="threshold"):
        select_drafts(neural, sa, match, threshold)
    with pytest.raises((TypeError, ValueError), match="threshold"):
        select_drafts_np(neural.numpy(), sa.numpy(), match.numpy(), threshold)


def test_check_length_rule_names_the_problem():
    from saspec.select import DRAFT_LENGTH_RULES, check_length_rule

    assert [check_length_rule(r, 2.0) for r in DRAFT_LENGTH_RULES] == [0, 1, 2]
    assert check_length_rule("fixed", float("nan")) == 0  # fixed ignores its scale
    with pytest.raises(ValueError, match="unknown draft-length rule 'longest'"):
        check_length_rule("longest", 2.0)
    for bad in (0.0, -1.0, float("inf"), float("nan"), "two", None):
        with pytest.raises(ValueError, match="scale must be a finite number > 0"):
            check_length_rule("per-match", bad)


# -- the cost gate ---------------------------------------------------------------------

from saspec.select import CostGate, best_draft_length, expected_tokens  # noqa: E402


def test_best_draft_length_is_the_brute_force_argmax():
    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(1, 33))
        q = float(rng.random())
        vc = np.concatenate([[1.0], 1.0 + np.cumsum(rng.random(k) * rng.choice([0.02, 0.3, 1.2]))])
        dc = float(rng.choice([0.0, 0.1, 0.5]))
        gains = [1.0] + [sum(q ** i for i in range(d + 1)) / (vc[d] + d * dc) for d in range(1, k + 1)]
        d, g = best_draft_length(q, k, vc, dc)
        assert g == pytest.approx(max(gains))
        assert d == int(np.argmax(gains))  # the first (shortest) best
    assert expected_tokens(0.5, 3) == pytest.approx(1.875)
    assert best_draft_length(0.99, 8, np.arange(1.0, 10.0), 0.0)[0] == 0  # every token costs a forward: never pays


def test_gate_asks_for_a_plain_step_until_it_has_a_unit_of_cost():
    g = CostGate(8)
    assert not g.timed and g.choose(20, 8, 8) == ("none", 0)
    g.observe_forward(40, 5.0)  # larger than any verify: ignored
    assert not g.timed
    g.observe_forward(1, 0.3)
    assert g.timed and not g.probed
    assert g.choose(20, 8, 8) == ("probe", 1)  # one cheap token first: what does a multi-token verify cost?
    g.observe_forward(2, 0.33)
    assert not g.probed and g.choose(20, 8, 8) == ("probe", 1)  # a second timing, in case the first was slow
    g.observe_forward(2, 0.34)
    assert g.probed
    source, n = g.choose(20, 8, 8)
    assert source == "sa" and n == 8  # a long match, and verifying more tokens looks cheap


def test_gate_learns_costs_and_stops_drafting_where_verify_is_dear():
    g = CostGate(8)
    g.observe_forward(1, 0.3)
    g.observe_forward(2, 0.6)  # one more token costs a whole forward (bf16 without native matmuls)
    g.observe_forward(2, 0.61)
    vc = g.verify_cost()
    assert vc[1] == pytest.approx(2.0) and np.all(np.diff(vc) >= 0) and vc[8] == pytest.approx(9.0)
    for m in (1, 4, 30):
        assert g.choose(m, 8, 8) == ("none", 0)
    flat = CostGate(8)
    flat.observe_forward(1, 0.3)
    flat.observe_forward(3, 0.32)
    flat.observe_forward(3, 0.33)
    flat.observe_forward(8, 0.9)  # timed once, and dearer than the line through the 3-token forwards: maybe slow
    vc = flat.verify_cost()
    assert vc[2] == vc[3] == pytest.approx(0.32 / 0.3) and vc[7] == pytest.approx(1 + 7 * (0.02 / 0.3) / 2)
    flat.observe_forward(8, 0.5)
    vc = flat.verify_cost()  # timed twice: its fastest
    assert vc[2] == vc[3] == pytest.approx(0.32 / 0.3) and vc[7] == pytest.approx(0.5 / 0.3)
    assert flat.choose(1, 8)[0] == "sa"  # verifying a few tokens is nearly free: even a short match pays


def test_gate_learns_acceptance():
    g = CostGate(8, verify_cost=1.0 + 0.1 * np.arange(9), draft_cost=0.4)
    q0 = g.q("sa", 2)
    for _ in range(20):
        g.observe("sa", 2, 4, 0)
    assert g.q("sa", 2) < 0.25 < q0
    assert g.q("sa", 20) == pytest.approx(CostGate(8).q("sa", 20))  # other buckets untouched
    for _ in range(20):
        g.observe("draft", 0, 4, 4)
    assert g.q("draft") > 0.95
    assert g.choose(2, 8, 8)[0] == "draft"  # the SA keeps missing at this match, the draft model does not
    assert g.choose(0, 0, 0) == ("none", 0)


def _gate_run(slow: dict[int, float], steps: int = 40, q: float = 0.93, k: int = 32) -> list[int]:
    """Draft lengths a gate chooses over ``steps`` steps of a long, reliable
    SA match when a forward over n tokens costs 1 + 0.1 (n - 1) units, except
    that the first forward of each size in ``slow`` takes ``slow[n]`` times
    longer (a busy machine, a first call of a shape)."""
    rng = np.random.default_rng(0)
    slow, g, lens = dict(slow), CostGate(k), []
    for _ in range(steps):
        source, d = g.choose(20, k)
        d = 0 if source == "none" else d
        g.observe_forward(d + 1, 0.3 * (1 + 0.1 * d) * slow.pop(d + 1, 1.0))
        acc = 0
        while acc < d and rng.random() < q:
            acc += 1
        if d:
            g.observe("sa", 20, d, acc)
        lens.append(d)
    return lens


@pytest.mark.parametrize("slow", [{}, {2: 1.5}, {2: 3.0}, {2: 2.0, 16: 3.0, 32: 3.0}, {n: 2.0 for n in range(2, 34)}])
def test_gate_is_not_steered_by_one_slow_forward(slow):
    # A slow first probe used to set the cost line for good: 1.5x held the
    # drafts at 3 tokens for the whole output, 3x stopped drafting.
    lens = _gate_run(slow)
    assert min(lens[15:]) >= 7, lens


def test_gate_rejects_bad_settings_and_observations():
    with pytest.raises(ValueError, match="k_max"):
        CostGate(0)
    with pytest.raises(ValueError, match="verify_cost"):
        CostGate(8, verify_cost=np.ones(5))
    with pytest.raises(ValueError, match="verify_cost"):
        CostGate(2, verify_cost=[1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="draft_cost is fixed only"):
        CostGate(2, draft_cost=0.3)
    with pytest.raises(ValueError, match="model_prior"):
        CostGate(2, model_prior=1.5)
    with pytest.raises(ValueError, match="window"):
        CostGate(2, window=0)
    g = CostGate(4)
    with pytest.raises(ValueError, match="unknown source"):
        g.observe("eagle", 1, 2, 1)
    with pytest.raises(ValueError, match="accepted"):
        g.observe("sa", 1, 2, 3)
    with pytest.raises(ValueError, match="unknown source"):
        g.q("eagle")


def test_gate_edges_found_in_review():
    with pytest.raises(ValueError, match="prior_weight"):
        CostGate(4, prior_weight=0)
    g = CostGate(4)
    g.observe_forward(1, 0.01)
    g.observe_forward(8, 0.08)  # in the last size bucket (5-8) but larger than any verify (5 tokens): ignored
    assert not g.probed and g.verify_cost()[4] == pytest.approx(1.4)
    g.observe_forward(5, 0.03)
    g.observe_forward(5, 0.031)
    assert g.probed and g.verify_cost()[4] == pytest.approx(3.0)
    fixed = CostGate(4, verify_cost=[1.0, 1.1, 1.2, 1.3, 1.4])
    fixed.observe_forward(1, 0.01)  # the unit the draft model's cost is measured in
    fixed.observe_forward(3, 5.0)  # the verify costs stay fixed
    fixed.observe_draft_forward(0.1)
    assert fixed.draft_cost() == pytest.approx(10.0)
    assert fixed.choose(0, 0, 4) == ("none", 0)  # a draft token costs 10 forwards
    assert fixed.verify_cost().tolist() == [1.0, 1.1, 1.2, 1.3, 1.4]


def test_adaptive_selector_checks_rows_before_updating():
    sel = AdaptiveSelector(8)
    with pytest.raises(ValueError, match="match_len has 1 rows, expected 3"):
        sel.choose(["x", "y", "z"], np.array([5]))
    before = sel._g_sum.copy()
    with pytest.raises(ValueError, match="verified has 1 rows, expected 2"):
        sel.observe(["x", "y"], np.array([5, 6]), np.zeros((2, 8)), np.zeros((2, 8)), [np.zeros(3)])
    assert np.array_equal(sel._g_sum, before) and sel._req == {}
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        AdaptiveSelector(0)
    g_sum, g_cnt = np.zeros(N_BUCKETS), np.zeros(N_BUCKETS)
    adaptive_init(g_sum, g_cnt, 32)
    assert g_sum[match_bucket(5)] == 2.5 and g_sum[match_bucket(16)] == 8.0 and g_sum[match_bucket(100)] == 16.0

