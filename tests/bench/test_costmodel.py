"""The cost model, the costed walk's charges, and the per-row draft-length op."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from saspec_bench import realsim
from saspec_bench.costmodel import BatchCosts, Profile, _fill, gpu_like_profile, lookup
from saspec_bench.positions import Flat
from saspec.rules import DRAFT_LENGTH_RULES, draft_length, draft_lengths, truncate_drafts


# -- cost profiles: the roofline's shape, the JSON round trip, the table lookup --------------------


def test_gpu_like_profile_shape_of_costs():
    prof = gpu_like_profile()
    assert "modeled" in prof.name and "NOT measured" in prof.notes["source"]
    b1, b64 = prof.batches[1], prof.batches[64]
    assert b1.target_s[32] / b1.target_s[0] < 1.05  # batch 1: memory-bound, verifying 33 tokens ~ free
    assert b64.target_s[32] / b64.target_s[0] > 3  # batch 64: compute-bound, each verified token costs
    assert np.all(np.diff(b64.target_s) >= 0)
    assert b1.draft_s[0] < b1.target_s[0]


def test_profile_json_roundtrip_and_errors(tmp_path):
    prof = gpu_like_profile(batches=(1, 8))
    prof.save(tmp_path / "p.json")
    back = Profile.load(tmp_path / "p.json")
    assert back.name == prof.name and set(back.batches) == {1, 8}
    assert np.array_equal(back.batches[8].target_s, prof.batches[8].target_s)
    obj = prof.as_json()
    obj["batches"]["1"]["target_s"] = [0.1, -1.0]
    (tmp_path / "bad.json").write_text(json.dumps(obj))
    with pytest.raises(ValueError, match="bad.json: malformed cost profile.*positive"):
        Profile.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="version"):
        Profile.from_json({"name": "x", "batches": {}})


def test_lookup_and_fill():
    t = np.array([1.0, 2.0, 4.0])
    assert [lookup(t, n) for n in (1, 3, 4, 6)] == [1.0, 4.0, 6.0, 10.0]
    filled = _fill({1: 1.0, 3: 0.5, 5: 3.0}, 7)  # the dip at 3 is noise: kept at 1.0
    assert filled.tolist() == [1.0, 1.0, 1.0, 2.0, 3.0, 3.5, 4.0]


def costs(target, draft, sa=0.0):
    return Profile("hand", {1: BatchCosts(np.array(target, float), np.array(draft, float), sa)})


def arrays(prompt_len, match, sa_acc, sa_len, runs):
    n = len(match)
    flat = Flat.of([SimpleNamespace(prompt=np.arange(prompt_len, dtype=np.int32), output=np.arange(n, dtype=np.int32))])
    flat.draft_runs = np.asarray(runs, np.int32)
    arr = realsim.Arrays.__new__(realsim.Arrays)
    arr.flat, arr.match, arr.sa_acc, arr.sa_len = flat, *(np.asarray(x, np.int32) for x in (match, sa_acc, sa_len))
    arr.neural, arr.runs = np.zeros(n, np.int32), flat.draft_runs
    arr.prompt_lens = np.array([prompt_len], np.int64)
    return arr


# -- a costed walk charges each step the target's forward and the drafter's cost -------------------


def test_costed_walk_hand_computed():
    # 10 output tokens, prompt of 5. target: 1 s + 0.1 s per extra token; draft: 0.01 s + 0.001 s per extra token
    prof = costs([1.0 + 0.1 * i for i in range(8)], [0.01 + 0.001 * i for i in range(40)], sa=0.5)
    runs = [1, 0, 3, 2, 1, 0, 0, 2, 1, 0]
    arr = arrays(5, [0] * 10, [0] * 10, [0] * 10, runs)
    res = realsim.run_costed(arr, prof, 1, "neural", k_nn=2)
    # steps at pos 0 (a=1: 2 new), 2 (a=2: 3 new), 5 (a=0), 6 (a=0), 7 (a=2 capped at rem 2: 3 new) -> 5 steps
    assert res["steps"] == 5 and res["AL"] == 2.0
    # every step verifies min(2, rem) + 1 tokens: 3, 3, 3, 3, 3 (pos 7: rem 2)
    assert res["verified_per_step"] == 3.0
    # draft model: cached starts at prompt-1 = 4. pos0: fed 1 (seq 5), cached 5+min(1,1,2)=6;
    # pos2: seq 7, fed 1, cached 7+min(3->1,..)=8; pos5: seq 10, fed 2, cached 10; pos6: seq 11, fed 1, cached 11;
    # pos7: seq 12, fed 1. Each step: first forward + 1 more single-token forward.
    fed = [1, 1, 2, 1, 1]
    assert res["draft_fed_per_step"] * 5 == pytest.approx(sum(fed) + 5)
    expect = 5 * 1.2 + sum(0.01 + 0.001 * (f - 1) + 0.01 for f in fed)
    assert res["seconds"] == pytest.approx(expect)
    assert res["tok_s"] == pytest.approx(10 / expect)
    # SA alone with the per-match rule: m=3 at pos 0 drafts ceil(1.0*3)=3 tokens, 2 accepted; the SA is charged 0.5 s a step
    arr = arrays(5, [3] + [0] * 9, [2] + [0] * 9, [8] + [0] * 9, runs)
    res = realsim.run_costed(arr, prof, 1, "sa", k_sa=8, rule="per-match", scale=1.0)
    assert res["steps"] == 8 and res["verified_per_step"] == pytest.approx(11 / 8)
    assert res["seconds"] == pytest.approx(1.3 + 7 * 1.0 + 8 * 0.5)
    with pytest.raises(ValueError, match="k_sa"):
        realsim.run_costed(arr, prof, 1, "sa", k_sa=33)
    with pytest.raises(ValueError, match="unknown mode"):
        realsim.run_costed(arr, prof, 1, "eagle")


# -- draft-length rules: numpy, the scalar rule and torch agree; bad inputs are refused ------------


def test_draft_lengths_rules_numpy():
    m = np.array([0, 1, 2, 3, 10, 40, -1], np.int32)
    assert draft_lengths(m, 32, "fixed").tolist() == [0, 32, 32, 32, 32, 32, 0]
    assert draft_lengths(m, 32, "per-match", 2.0).tolist() == [0, 2, 4, 6, 20, 32, 0]
    assert draft_lengths(m, 8, "per-match", 0.5).tolist() == [0, 1, 1, 2, 5, 8, 0]
    last = np.array([-1, 0, 0, 5, -1, 1, 3])
    assert draft_lengths(m, 32, "per-match-recent", 2.0, last).tolist() == [0, 2, 2, 6, 20, 4, 0]
    assert draft_lengths(m, 32).dtype == np.int32


def test_draft_lengths_agree_with_scalar_rule_and_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    m = rng.integers(-2, 80, 500).astype(np.int32)
    last = rng.integers(-1, 33, 500).astype(np.int32)
    for r, rule in enumerate(DRAFT_LENGTH_RULES):
        for k_max, scale in ((1, 1.0), (8, 0.7), (32, 2.0), (32, 3.5)):
            ref = [draft_length(int(a), k_max, r, scale, int(b)) for a, b in zip(m, last)]
            got = draft_lengths(m, k_max, rule, scale, last)
            assert got.tolist() == ref, (rule, k_max, scale)
            gt = draft_lengths(torch.from_numpy(m), k_max, rule, scale, torch.from_numpy(last))
            assert gt.dtype == torch.int32 and gt.tolist() == ref, (rule, k_max, scale)


def test_draft_lengths_bad_inputs():
    m = np.array([1, 2], np.int32)
    with pytest.raises(ValueError, match="unknown draft-length rule"):
        draft_lengths(m, 8, "longest")
    with pytest.raises(ValueError, match="k_max"):
        draft_lengths(m, 0)
    with pytest.raises(ValueError, match="scale"):
        draft_lengths(m, 8, "per-match", 0.0)
    with pytest.raises(ValueError, match="1-D"):
        draft_lengths(np.zeros((2, 2), np.int32), 8)
    with pytest.raises(ValueError, match="needs last_accepted"):
        draft_lengths(m, 8, "per-match-recent")
    with pytest.raises(ValueError, match="last_accepted must have shape"):
        draft_lengths(m, 8, "per-match-recent", 2.0, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="integers"):
        draft_lengths(np.array([1.5]), 8)


def test_draft_lengths_huge_scale_and_torch_dtype():
    # ceil(scale * m) beyond int64 must clamp to k_max, not wrap to a negative length
    m = np.array([10**9, 5, 0], np.int32)
    assert draft_lengths(m, 8, "per-match", 1e10).tolist() == [8, 8, 0]
    assert draft_length(10**9, 8, 1, 1e10, -1) == 8 and draft_length(3, 8, 1, 1e300, -1) == 8
    torch = pytest.importorskip("torch")
    assert draft_lengths(torch.from_numpy(m), 8, "per-match", 1e300).tolist() == [8, 8, 0]
    with pytest.raises(ValueError, match="integers"):
        draft_lengths(torch.tensor([1.5, 0.5]), 8)


def test_truncate_drafts():
    d = np.arange(12, dtype=np.int32).reshape(3, 4)
    out = truncate_drafts(d, np.array([0, 2, 4]))
    assert out.tolist() == [[-1, -1, -1, -1], [4, 5, -1, -1], [8, 9, 10, 11]]
    torch = pytest.importorskip("torch")
    assert truncate_drafts(torch.from_numpy(d), torch.tensor([0, 2, 4])).tolist() == out.tolist()
    with pytest.raises(ValueError, match="lengths"):
        truncate_drafts(d, np.array([1, 2]))


# -- the hybrid's threshold over a real draft model is the best one never slower than it -----------


def test_model_threshold_is_the_best_never_slower_one(monkeypatch):
    # Fake walks: T=4 has the best mean but is slower than the draft model alone somewhere; T=8 is the
    # best of the thresholds that never are; T=16 never is either but gains less.
    gain = {4: (3.0, 0.9), 8: (2.0, 1.01), 16: (1.5, 1.02)}

    def fake(arr, prof, b, mode, *, threshold=4, k_nn=8, **kw):
        if mode == "neural":
            return {"tok_s": 1.0}
        return {"tok_s": gain[threshold][0] if arr.name == "code" else gain[threshold][1]}

    monkeypatch.setattr(realsim, "run_costed", fake)
    arrays = {n: SimpleNamespace(name=n, runs=np.zeros(1)) for n in ("code", "chat")}
    arrays["modeled-only"] = SimpleNamespace(name="x", runs=None)
    prof = gpu_like_profile()
    study = realsim.model_threshold_study(arrays, [prof], ("per-match", 2.0), candidates=(4, 8, 16))
    assert study["best"] == 8
    assert len(study["ratios"][8]) == 2 * 2 * len(prof.batches)  # workloads with runs x K in (3, 8) x batches
    assert "T=8" in realsim.format_threshold_study(study)
    gain[8] = (2.0, 0.99)
    gain[16] = (1.5, 0.98)
    assert realsim.model_threshold_study(arrays, [prof], ("per-match", 2.0), candidates=(4, 8, 16))["best"] == 8
    assert realsim.model_threshold_study({"m": arrays["modeled-only"]}, [prof], ("per-match", 2.0)) is None
