"""The served-run replay: its step accounting, its step-cost curves and curve files, its streams, the oracle
length against the fixed rules, its determinism, and a run folder read back."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from saspec_bench.served_sim import (CHAT, cold_part, compare, kind_table, load_kinds, load_run, make_drafter,
                                     repeat_stream, replay, simulate)
from saspec.policy import gpu_like
from saspec_bench.step_curves import CPU, GPU, Curve, load_curve, profile_curve


def _copy_requests(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Prompts holding a text and outputs that copy it with a few edits."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        body = rng.integers(10, 5000, 120).tolist()
        edited = list(body)
        for pos in rng.choice(len(body), 3, replace=False):
            edited[int(pos)] = 7
        out.append(([1, 2, 3] + body + [4, 5], edited + [6]))
    return out


def test_without_drafts_each_request_costs_its_prefill_and_a_step_per_further_token():
    requests = _copy_requests(3)
    res = simulate(requests, 1, fixed=0.5, per_token=0.01, min_match=10_000)
    expected = sum(0.5 + 0.01 * len(p) + (len(o) - 1) * (0.5 + 0.01) for p, o in requests)
    assert res["drafted"] == res["accepted"] == 0
    assert res["steps"] == sum(len(o) for _, o in requests)
    assert res["seconds"] == pytest.approx(expected)


@pytest.mark.parametrize("rule", [{}, {"length_rule": "per-match", "length_scale": 1.0}])
def test_a_copy_is_drafted_and_every_output_token_is_emitted_once(rule):
    requests = _copy_requests(4, seed=1)
    res = simulate(requests, 1, **rule)
    total = sum(len(o) for _, o in requests)
    # one forward per step, each emitting its accepted drafts and one token of its own
    assert res["steps"] + res["accepted"] == total
    assert res["accepted"] > total // 2
    assert 0 <= res["wasted"] == res["drafted"] - res["accepted"]
    batched = simulate(requests, 4, **rule)
    assert batched["steps"] < res["steps"] and batched["seconds"] < res["seconds"]
    assert simulate(requests, 4, **rule) == batched  # finished texts join the pool before the next step


def test_a_run_folder_is_read_as_chat_prompts_and_plain_outputs(tmp_path):
    (tmp_path / "dataset.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in ("ab", "cd")))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "0.5b-plain-r0-c8.json").write_text(json.dumps({"generated_texts": ["x", "yz"]}))
    got = load_run(tmp_path, lambda text: [ord(c) for c in text])
    assert got == [([ord(c) for c in CHAT.format("ab")], [ord(c) for c in "x<|im_end|>"]),
                   ([ord(c) for c in CHAT.format("cd")], [ord(c) for c in "yz<|im_end|>"])]
    (tmp_path / "runs" / "0.5b-plain-r0-c8.json").unlink()
    with pytest.raises(FileNotFoundError, match="no plain run"):
        load_run(tmp_path, list)


# -- the step-cost curves ---------------------------------------------------------------------------------


def test_a_curve_interpolates_its_points_and_extends_its_last_segment():
    gpu = GPU
    assert gpu(1) == gpu(8) == pytest.approx(8.71e-3)  # flat below the first point
    assert gpu(12) == pytest.approx((8.71e-3 + 8.77e-3) / 2)
    assert gpu(16) == pytest.approx(8.77e-3)
    slope = (42.3e-3 - 8.77e-3) / (1024 - 16)
    assert gpu(520) == pytest.approx(8.77e-3 + 504 * slope)
    assert gpu(2048) == pytest.approx(42.3e-3 + 1024 * slope)  # beyond the last: along the last segment
    falling = Curve("f", (1, 10, 20), (1.0, 3.0, 2.0))
    assert falling(40) == 2.0  # never falling beyond the last point
    line = Curve.linear(0.2, 0.0101)
    for n in (1, 2, 7, 300, 5000):
        assert line(n) == pytest.approx(0.2 + 0.0101 * n)
    assert CPU(100) == pytest.approx(0.2 + 0.0101 * 100) and CPU.prior == "cpu" and GPU.prior == "gpu"


@pytest.mark.parametrize("tokens, seconds, message", [
    ((), (), "at least one point"),
    ((1, 2), (1.0,), "as many seconds"),
    ((0, 2), (1.0, 2.0), "integers >= 1"),
    ((1.5, 2), (1.0, 2.0), "integers >= 1"),
    ((2, 1), (1.0, 2.0), "increasing"),
    ((1, 2), (1.0, 0.0), "finite and > 0"),
    ((1, 2), (1.0, float("nan")), "finite and > 0"),
])
def test_a_bad_curve_is_refused_naming_the_problem(tokens, seconds, message):
    with pytest.raises(ValueError, match=message):
        Curve("bad", tokens, seconds)
    with pytest.raises(ValueError, match="prior"):
        Curve("bad", (1,), (1.0,), prior="tpu")


def test_a_curve_file_is_read_as_json_csv_or_a_bare_list(tmp_path):
    saved = tmp_path / "h100.json"
    Curve("h100", (1, 64, 512), (0.01, 0.011, 0.03), "gpu", "a device run").save(saved)
    got = load_curve(saved)
    assert got == Curve("h100", (1, 64, 512), (0.01, 0.011, 0.03), "gpu", "a device run")
    assert load_curve(saved, prior="cpu").prior == "cpu"
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([[64, 0.5], [1, 0.25]]))  # any order
    assert load_curve(bare) == Curve("bare", (1, 64), (0.25, 0.5), "gpu")
    table = tmp_path / "cpu-run.csv"
    table.write_text("# prior: cpu\ntokens,seconds\n1,0.21\n# a comment\n33,0.53\n")
    got = load_curve(table)
    assert got == Curve("cpu-run", (1, 33), (0.21, 0.53), "cpu") and got(17) == pytest.approx(0.37)


@pytest.mark.parametrize("name, text, message", [
    ("dup.json", json.dumps({"points": [[1, 0.1], [1, 0.2]]}), r"\[1\] appear more than once"),
    ("nopoints.json", json.dumps({"prior": "gpu"}), "needs 'points'"),
    ("pair.json", json.dumps([[1, 0.1, 3]]), "pair"),
    ("notjson.json", "tokens,seconds\n1,2\n", "not JSON"),
    ("zero.json", json.dumps([[1, 0.0]]), "finite and > 0"),
    ("prior.json", json.dumps({"points": [[1, 0.1]], "prior": "tpu"}), "prior"),
    ("header.csv", "n,s\n1,0.1\n", "header 'tokens,seconds'"),
    ("row.csv", "tokens,seconds\n1,0.1,4\n", "row 2"),
    ("number.csv", "tokens,seconds\n1,fast\n", "'fast' is not a number"),
])
def test_a_bad_curve_file_is_refused_naming_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        load_curve(path)
    assert name in str(e.value)


def test_a_profiled_cost_is_saved_as_a_curve_file_and_read_back(tmp_path):
    clock = [0.0]

    def run_step(n: int) -> None:  # a first run slower than the rest: the profile keeps each size's minimum
        clock[0] += (0.03 if clock[0] == 0.0 else 0.01) + 0.001 * n

    curve = profile_curve(run_step, [1, 4, 16], clock=lambda: clock[0], name="profiled", prior="gpu")
    assert curve.tokens == (1, 4, 16)
    assert curve.seconds == pytest.approx((0.011, 0.014, 0.026))
    curve.save(tmp_path / "p.json")
    assert load_curve(tmp_path / "p.json") == curve


# -- the replay's streams, drafters and tables -------------------------------------------------------------


def test_a_stream_repeats_every_request_once_a_round_in_a_seeded_shuffled_order():
    stream = repeat_stream(10, 4, seed=3)
    rounds = [stream[i * 10: (i + 1) * 10] for i in range(4)]
    assert all(sorted(r) == list(range(10)) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1 and rounds[0] != list(range(10))
    assert repeat_stream(10, 4, seed=3) == stream and repeat_stream(10, 4, seed=4) != stream
    assert cold_part(stream) == rounds[0]  # four rounds: the cold start is the first one
    assert cold_part([5, 6, 7]) == [5]
    with pytest.raises(ValueError, match="at least one request"):
        repeat_stream(0, 4)
    with pytest.raises(ValueError, match="one round"):
        repeat_stream(3, 0)
    assert repeat_stream(4, 2, seed=3, shuffle=False) == [0, 1, 2, 3, 0, 1, 2, 3]  # --in-order: the run's own


def test_plain_decoding_under_a_curve_costs_each_step_what_the_curve_says():
    requests = _copy_requests(2)
    res = replay(requests, 2, GPU, lambda **kw: make_drafter("plain", prior="gpu", **kw))
    p0, p1 = (len(p) for p, _ in requests)
    n0, n1 = (len(o) for _, o in requests)
    both, alone = min(n0, n1) - 1, abs(n0 - n1)
    expected = GPU(p0 + p1) + both * GPU(2) + alone * GPU(1)
    assert res["steps"] == 1 + both + alone and res["drafted"] == 0
    assert res["seconds"] == pytest.approx(expected)


OWN = ("oracle", "K=8", "K=16", "K=32", "match-capped", "plain")


@pytest.mark.parametrize("curve", [CPU, GPU], ids=["cpu", "gpu"])
def test_the_oracle_length_is_never_below_a_fixed_rule_and_verifies_nothing_in_vain(curve):
    requests = _copy_requests(6, seed=2)
    for concurrency in (1, 3):
        res = compare(requests, concurrency, curve, OWN, repeat=2, seed=1)
        oracle = res["oracle"]["stream"]
        assert oracle["wasted"] == 0 and oracle["accepted"] > 0
        for rule in OWN[1:]:
            for part in ("stream", "cold"):
                assert res["oracle"][part]["tok_s"] >= res[rule][part]["tok_s"], (rule, part, concurrency)


def test_each_request_kind_counts_its_own_decoding_steps(tmp_path):
    """A copy drafted with K = 32 takes far fewer steps than a text with nothing to copy; the kinds' means
    add up to the replay's row-steps; the kinds come from dataset.jsonl, in load_run's order."""
    copies = _copy_requests(2, seed=4)
    fresh = [([1, 2, 3, 9], list(range(6000, 6040)))]  # an output that repeats nothing: a step per token
    requests, kinds = copies + fresh + copies, ["code-edit", "code-edit", "free-form", "code-edit", "code-edit"]
    res = replay(requests, 2, CPU, lambda **kw: make_drafter("K=32", prior="cpu", **kw), kinds=kinds)
    by_kind = res["rows_by_kind"]
    assert set(by_kind) == {"code-edit", "free-form"}
    assert by_kind["free-form"] == 39  # its first token comes with the prefill, then one a step
    assert 4 * by_kind["code-edit"] + by_kind["free-form"] == res["rows"]
    assert by_kind["code-edit"] < len(copies[0][1]) / 3
    assert "rows_by_kind" not in replay(requests, 2, CPU, lambda **kw: make_drafter("plain", prior="cpu", **kw))
    with pytest.raises(ValueError, match="kinds must name each of the 5 requests, got 4"):
        replay(requests, 2, CPU, lambda **kw: make_drafter("plain", prior="cpu", **kw), kinds=kinds[:4])
    res = compare(requests, 2, CPU, ["K=32", "plain"], repeat=2, seed=1, kinds=kinds)
    per_copy = np.mean([len(o) - 1 for _, o in copies])  # plain: a step per token after the first
    assert res["plain"]["stream"]["rows_by_kind"] == {"code-edit": pytest.approx(per_copy), "free-form": 39}
    assert "rows_by_kind" in res["K=32"]["cold"]
    table = kind_table({"cpu": {"run": {2: res}}}, ["K=32", "plain"])
    assert "code-edit / free-form" in table and "| run | cpu | 2 |" in table
    (tmp_path / "dataset.jsonl").write_text("\n".join(json.dumps(d) for d in ({"prompt": "a", "kind": "free-form"},
                                                                            {"prompt": "b"})))
    assert load_kinds(tmp_path) == ["free-form", ""]


def test_the_replay_is_deterministic_and_the_policy_gets_the_regimes_prior():
    requests = _copy_requests(5, seed=3)
    for curve in (CPU, GPU):
        first = compare(requests, 4, curve, ["policy", "match-capped"], repeat=2, seed=5)
        assert compare(requests, 4, curve, ["policy", "match-capped"], repeat=2, seed=5) == first
    made = make_drafter("policy", clock=lambda: 0.0, concurrency=2, max_len=64, prior="gpu", outputs={})
    cost = made.proposer.policy.cost
    shape = gpu_like(np.array([1.0, 100.0]))
    assert cost.seconds(100) / cost.seconds(1) == pytest.approx(shape[1] / shape[0])  # the GPU prior's shape
    made = make_drafter("policy", clock=lambda: 0.0, concurrency=2, max_len=64, prior="cpu", outputs={})
    assert made.proposer.policy.cost.seconds(100) > 10 * made.proposer.policy.cost.seconds(1)
    with pytest.raises(ValueError, match="unknown drafter 'K=0'"):
        make_drafter("K=0", clock=lambda: 0.0, concurrency=2, max_len=64, prior="cpu", outputs={})


def test_absent_peers_are_reported_and_the_tables_say_so(monkeypatch):
    import saspec_bench.served_sim as sim

    monkeypatch.setattr(sim, "peers_available", lambda: {"arctic": False, "ngram": False})
    res = sim.compare(_copy_requests(2), 2, CPU, ["policy", "K=8", "match-capped", "arctic", "ngram"])
    assert res["arctic"] == {"absent": "arctic_inference does not import"} and "absent" in res["ngram"]
    r = sim.ratios(res)
    assert r["arctic"] is None
    best = max(res[d]["stream"]["tok_s"] for d in ("K=8", "match-capped"))
    assert r["best_fixed"] == pytest.approx(res["policy"]["stream"]["tok_s"] / best)
    cold = res["policy"]["cold"]["tok_s"] / res["match-capped"]["cold"]["tok_s"]
    assert r["cold_match_capped"] == pytest.approx(cold)
    twice = sim.compare(_copy_requests(2), 1, CPU, ["policy", "K=8", "match-capped", "arctic", "ngram"])
    text = sim.table({"cpu": {"run": {2: res, 1: twice}}}, ["policy", "K=8", "match-capped", "arctic", "ngram"])
    assert "concurrency 1 / 2" in text.splitlines()[0]
    cells = text.splitlines()[-1].strip("| ").split(" | ")
    assert cells[:2] == ["run", "cpu"] and cells[5:7] == ["absent", "absent"]
    assert cells[2] == f"{twice['policy']['stream']['tok_s']:.1f} / {res['policy']['stream']['tok_s']:.1f}"
    assert cells[7] == "- / -" and cells[9] == "- / -"  # no oracle, no arctic: no ratios to them
    assert cells[8] == f"{sim.ratios(twice)['best_fixed']:.3f} / {r['best_fixed']:.3f}"  # in concurrency order


@pytest.mark.skipif(importlib.util.find_spec("arctic_inference") is None, reason="ArcticInference not built here")
def test_arctic_drafts_a_copy_the_way_vllms_suffix_method_drives_it():
    requests = _copy_requests(3, seed=4)
    res = compare(requests, 2, GPU, ["arctic", "plain"], repeat=2)
    assert res["arctic"]["stream"]["accepted"] > sum(len(o) for _, o in requests)  # most of both rounds drafted
    assert res["arctic"]["stream"]["tok_s"] > 2 * res["plain"]["stream"]["tok_s"]
