"""select_drafts (torch) and select_drafts_np agree at the limits of a scalar threshold, and reject bad
thresholds and length rules naming them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from saspec.rules import select_drafts, select_drafts_np

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
    from saspec.rules import DRAFT_LENGTH_RULES, check_length_rule

    assert [check_length_rule(r, 2.0) for r in DRAFT_LENGTH_RULES] == [0, 1, 2]
    assert check_length_rule("fixed", float("nan")) == 0  # fixed ignores its scale
    with pytest.raises(ValueError, match="unknown draft-length rule 'longest'"):
        check_length_rule("longest", 2.0)
    for bad in (0.0, -1.0, float("inf"), float("nan"), "two", None):
        with pytest.raises(ValueError, match="scale must be a finite number > 0"):
            check_length_rule("per-match", bad)
