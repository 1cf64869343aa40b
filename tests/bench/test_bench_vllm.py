"""``saspec bench-vllm``'s parent side (no vLLM needed): configs, summaries and the target checks."""

from __future__ import annotations

import numpy as np
import pytest

from saspec_bench.commands import bench_vllm as bv


# -- each method is one vLLM speculative_config ----------------------------------------------------


def test_speculative_configs():
    assert bv.speculative_config("plain", 8) is None
    assert bv.speculative_config("ngram", 8) == {"method": "ngram", "num_speculative_tokens": 8}
    assert bv.speculative_config("ngram-2-5-long", 8, 32) == {
        "method": "ngram", "num_speculative_tokens": 32, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert bv.speculative_config("saspec-long", 8, 24) == {
        "method": "custom_class", "model": bv.SASPEC_CLASS, "num_speculative_tokens": 24}
    with pytest.raises(ValueError, match="unknown method 'eagle'"):
        bv.speculative_config("eagle", 8)


def run(method, kind, n_tokens, wall, accepted, drafts, pid="p"):
    return {"size": "0.5b", "kind": kind, "method": method, "id": pid, "tokens": list(range(n_tokens)),
            "wall_s": wall, "prefill_s": 1.0, "num_drafts": drafts, "num_draft_tokens": 8 * drafts,
            "num_accepted_tokens": accepted, "contention": 0.0, "same_as_plain": True}


# -- the targets compare each saspec method with the best n-gram row -------------------------------


def test_targets_compare_each_saspec_method_with_the_best_ngram_row():
    runs = [run("plain", "code-edit", 100, 20.0, 0, 0), run("ngram", "code-edit", 100, 10.0, 80, 20),
            run("ngram-2-5-long", "code-edit", 100, 8.0, 90, 10), run("saspec", "code-edit", 100, 10.0, 80, 20),
            run("saspec-long", "code-edit", 100, 6.0, 92, 8),
            run("plain", "free-form", 50, 10.0, 0, 0), run("saspec-long", "free-form", 50, 10.5, 2, 4)]
    lines = bv.target_checks(bv.summarize(runs))
    assert lines == [
        "- 0.5b code edits: saspec / ngram-2-5-long = 0.80x tok/s (decode 0.78x; target >= 1.15x), mean acceptance "
        "length 5.00 vs 10.00: MISSED",
        "- 0.5b code edits: saspec-long / ngram-2-5-long = 1.33x tok/s (decode 1.40x; target >= 1.15x), mean "
        "acceptance length 12.50 vs 10.00: met",
        "- 0.5b free-form: saspec-long / plain = 0.95x tok/s (target >= 0.97x): MISSED",
    ]
    multi = [run("ngram", "multi-turn-edit", 100, 10.0, 70, 20), run("saspec-long", "multi-turn-edit", 100, 8.0, 92, 8)]
    assert bv.target_checks(bv.summarize(multi)) == [
        "- 0.5b multi-turn code edits: saspec-long / ngram = 1.25x tok/s (decode 1.29x; target >= 1.15x), mean "
        "acceptance length 12.50 vs 4.50: met"]
    report = bv.format_report({"date": "d", "k": 8, "long_k": 32, "cpus": 2, "cpu": "x", "argv": []}, runs)
    assert "K = 8 (*-long: 32)" in report and "| 0.5b | code-edit | saspec-long | 1 | 100 | 16.67 |" in report


def test_proposer_cost_cells_time_saspec_without_vllm():
    from saspec_bench.commands import proposer_cost as pc

    assert pc.available(["saspec", "suffix"]) in (["saspec"], ["saspec", "suffix"])
    res = pc.cell(["saspec", "saspec-noplugin"], rows=3, context=600, steps=4, rounds=1)
    for name in ("saspec", "saspec-noplugin"):
        assert 0 < res[name]["steady_ms"] < 1e3 and 0 < res[name]["first_ms"] < 1e4
    a = pc.arrival(rows=2, context=500, arriving=2, arriving_context=900, prefill_s=0.05, steps=3)
    assert a["waited"] == 0 and a["arriving"] == 2 and a["after_prefill_ms"] > 0
    report = pc.format_report({"date": "d", "vllm": None, "cpu": "x", "cpus": 2, "k": pc.K, "step_tokens": 3,
                               "steps": 4, "rounds": 1},
                              {"proposers": ["saspec"], "cells": [{"rows": 3, "context": 2048, "saspec": res["saspec"]}],
                               "arrival": [{**a, "rows": 2, "context": 500, "arriving_context": 900, "prefill_s": 0.05}]})
    assert "| 3 x 2k |" in report and "Builds during prefill" in report


def test_proposer_cost_rejects_bad_lists():
    from saspec_bench.commands import proposer_cost as pc
    from saspec_bench.options import CliError

    with pytest.raises(CliError, match="--batches must list integers >= 1"):
        pc._ints("0,8", "--batches")
    with pytest.raises(CliError, match="--contexts must be comma-separated integers"):
        pc._ints("2k", "--contexts")
    with pytest.raises(CliError, match="--arrival-prefill-s must list seconds"):
        pc._seconds("-1")


def test_cross_request_prompts_come_from_the_recording_in_arrival_order(tmp_path, monkeypatch):
    from saspec_bench.options import CliError
    from saspec_bench.prompts import cross_request_prompts
    from saspec_bench.workloads import Trace, save_traces

    path = tmp_path / "cross.jsonl.gz"
    with pytest.raises(CliError, match="no recorded cross-request"):
        cross_request_prompts("json-extract", path)
    traces = [Trace(np.array([1, 2, i], np.int32), np.arange(5 + i, dtype=np.int32), {"workload": "json-extract"})
              for i in range(3)]
    save_traces(path, traces, "m")
    got = cross_request_prompts("json-extract:2", path)
    assert [(p["id"], p["kind"], p["prompt_ids"], p["max_new"]) for p in got] == [
        ("json-extract:00", "cross:json-extract", [1, 2, 0], 5), ("json-extract:01", "cross:json-extract", [1, 2, 1], 6)]
    assert len(cross_request_prompts("json-extract", path)) == 3
    with pytest.raises(CliError, match="unknown cross-request workload 'chat'"):
        cross_request_prompts("chat", path)
    with pytest.raises(CliError, match="N must be"):
        cross_request_prompts("json-extract:0", path)
