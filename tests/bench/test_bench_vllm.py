"""``saspec bench-vllm``'s parent side (no vLLM needed): configs, summaries and the target checks."""

from __future__ import annotations

import argparse
import math

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


def test_a_run_without_plain_shows_no_identity_count():
    """Without plain in the run there is nothing to compare outputs with: the report says so ("-"), not 0."""
    runs = [dict(run("saspec-long", "code-edit", 100, 6.0, 92, 8), same_as_plain=None),
            dict(run("hybrid", "code-edit", 100, 6.5, 90, 9), same_as_plain=None),
            run("saspec", "code-edit", 100, 8.0, 80, 20)]
    summary = bv.summarize(runs)
    assert summary[("0.5b", "code-edit", "saspec-long")]["identical"] is None
    assert summary[("0.5b", "code-edit", "saspec")]["identical"] == 1
    report = bv.format_report({"date": "d", "k": 8, "long_k": 32, "cpus": 2, "cpu": "x", "argv": []}, runs)
    assert "| -/1 |" in report and "| 1/1 |" in report and "| None |" not in report


def test_proposer_cost_cells_time_saspec_without_vllm():
    from saspec_bench.commands import proposer_cost as pc

    assert pc.available(["saspec", "suffix"]) in (["saspec"], ["saspec", "suffix"])
    res = pc.cell(["saspec", "saspec-noplugin"], rows=3, context=600, steps=4, rounds=1)
    for name in ("saspec", "saspec-noplugin"):
        # timings only need to be real measurements: a cold CI cache compiles inside the first call
        assert math.isfinite(res[name]["steady_ms"]) and res[name]["steady_ms"] > 0
        assert math.isfinite(res[name]["first_ms"]) and res[name]["first_ms"] > 0
    a = pc.arrival(rows=2, context=500, arriving=2, arriving_context=900, prefill_s=0.05, steps=3)
    assert a["waited"] == 0 and a["arriving"] == 2 and a["after_prefill_ms"] > 0
    report = pc.format_report({"date": "d", "vllm": None, "cpu": "x", "cpus": 2, "k": pc.K, "step_tokens": 3,
                               "steps": 4, "rounds": 1},
                              {"proposers": ["saspec"], "cells": [{"rows": 3, "context": 2048, "saspec": res["saspec"]}],
                               "arrival": [{**a, "rows": 2, "context": 500, "arriving_context": 900, "prefill_s": 0.05}]})
    assert "| 3 x 2k |" in report and "Builds during prefill" in report


def test_proposer_cost_merges_children_and_reports_ratios():
    """Children's results merge into the best time per cell and proposer; a baseline's columns keep their
    marker, and each cost ratio is taken against the same child's denominator."""
    from saspec_bench.commands import proposer_cost as pc
    from saspec_bench.options import CliError

    def one(sd, fx, ng):
        t = lambda ms: {"steady_ms": ms, "first_ms": 10 * ms}  # noqa: E731
        return {"proposers": ["saspec-defaults", "saspec-fixed", "ngram"], "vllm": "v", "arrival": [],
                "cells": [{"rows": 1, "context": 2048, "saspec-defaults": t(sd), "saspec-fixed": t(fx),
                           "ngram": t(ng)}]}

    res = pc.merge(None, one(0.02, 0.01, 0.01))
    res = pc.merge(res, one(0.04, 0.02, 0.02), pc.BASE)
    res = pc.merge(res, one(0.01, 0.02, 0.02))  # a second round: the best of each is kept
    res = pc.merge(res, one(0.03, 0.03, 0.01), pc.BASE)
    c = res["cells"][0]
    assert len(res["cells"]) == 1
    assert res["proposers"][3:] == ["saspec-defaults@base", "saspec-fixed@base", "ngram@base"]
    assert c["saspec-defaults"]["steady_ms"] == 0.01 and c["saspec-defaults@base"]["steady_ms"] == 0.03
    assert c["ngram@base"]["first_ms"] == 0.1
    report = pc.format_report({"date": "d", "vllm": "v", "cpu": "x", "cpus": 2, "k": pc.K, "step_tokens": 3,
                               "steps": 4, "rounds": 2, "commit": "abc", "baseline_commit": "def"}, res)
    row = next(line for line in report.splitlines() if line.startswith("| 1 x 2k |"))
    # defaults / ngram 1.00x and 3.00x (@base against its own ngram), policy / fixed 1.00x and 1.50x
    assert row.endswith("| 10.0 | 10.0 | 10.0 | 30.0 | 20.0 | 10.0 | 1.00x | 3.00x | 1.00x | 1.50x |")
    assert "baseline (@base) def" in report
    assert pc._names(None) == list(pc.DEFAULT_PROPOSERS) and pc._names("ngram,saspec,ngram") == ["ngram", "saspec"]
    with pytest.raises(CliError, match="--proposers must list names"):
        pc._names("saspec,nope")


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


# -- bench-vllm --served: its pieces without vLLM --------------------------------------------------


def test_served_peer_configs_are_vllms_speculative_configs():
    from saspec_bench.commands import served_vllm as sv

    assert sv.peer_config("plain") is None
    assert sv.peer_config("ngram") == {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2,
                                       "prompt_lookup_max": 5}
    assert sv.peer_config("suffix") == {"method": "suffix", "num_speculative_tokens": 32}
    assert sv.peer_config("draft-model", "/m/d") == {"method": "draft_model", "model": "/m/d", "num_speculative_tokens": 4}
    with pytest.raises(ValueError, match="draft-model needs a draft model"):
        sv.peer_config("draft-model")
    with pytest.raises(ValueError, match="'saspec' is not a peer drafter"):
        sv.peer_config("saspec")


def test_saspec_served_configs_come_from_saspecs_own_config_functions(monkeypatch):
    import subprocess
    import sys

    from saspec_bench.commands import served_vllm as sv

    monkeypatch.delenv("SASPEC_VLLM_POOL_TOKENS", raising=False)
    spec, env = sv.saspec_config("saspec", sys.executable)  # this python has saspec; proposer_config needs no vLLM
    assert spec == {"method": "custom_class", "model": "saspec.integrations.vllm.SAProposer", "num_speculative_tokens": 32}
    assert env == {"SASPEC_VLLM_POOL_TOKENS": str(1 << 20)}
    with pytest.raises(RuntimeError, match="(?s)hybrid config failed .*needs vLLM"):
        sv.saspec_config("hybrid", sys.executable, "/m/d")  # no vLLM here: hybrid_config says so
    with pytest.raises(ValueError, match="hybrid needs a draft model"):
        sv.saspec_config("hybrid", sys.executable)
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, 'noise\n{"spec": {"method": "draft_model"}, "env": {"X": "1"}}\n', "")

    assert sv.saspec_config("hybrid", "/v/python", "/m/d", run=fake_run) == ({"method": "draft_model"}, {"X": "1"})
    assert seen[0][0] == "/v/python" and '"model": "/m/d"' in seen[0][-1]


def test_served_dataset_is_the_user_messages_of_the_bench_prompts(tmp_path):
    import json

    from saspec_bench.commands import served_vllm as sv
    from saspec_bench.workloads import chat_prompt

    chat = chat_prompt([("user", "Rename x to y in:\n\ndef f(x):\n    return x\n")])
    assert sv.user_message(chat) == "Rename x to y in:\n\ndef f(x):\n    return x\n"
    two = chat_prompt([("user", "first"), ("assistant", "ok"), ("user", "second")])
    assert sv.user_message(two) == "second"
    with pytest.raises(ValueError, match="no complete user message"):
        sv.user_message("<|im_start|>user\nunfinished")
    texts = {1: chat, 2: chat_prompt([("user", "What is a monad?")])}
    prompts = [{"id": "stdlib:a", "kind": "code-edit", "prompt_ids": [1]}, {"id": "free-0", "kind": "free-form",
                                                                           "prompt_ids": [2]}]
    rows = sv.dataset_rows(prompts, lambda ids: texts[ids[0]], 256)
    assert [r["prompt"] for r in rows] == [sv.user_message(chat), "What is a monad?"]
    assert all(r["output_tokens"] == 256 for r in rows)
    path = tmp_path / "d.jsonl"
    sv.write_dataset(path, rows)
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows


def test_served_commands_stay_on_localhost_and_ask_for_what_is_compared(tmp_path):
    from saspec_bench.commands import served_vllm as sv

    server = sv.server_command("/v/python", "/m/t", 8123, 16, {"method": "suffix", "num_speculative_tokens": 32})
    assert server[:3] == ["/v/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert server[server.index("--host") + 1] == "127.0.0.1" and server[server.index("--max-num-seqs") + 1] == "16"
    assert server[server.index("--speculative-config") + 1] == '{"method": "suffix", "num_speculative_tokens": 32}'
    assert "--speculative-config" not in sv.server_command("/v/python", "/m/t", 8123, 1, None)
    client = sv.client_command("/v/python", "/m/t", 8123, tmp_path / "d.jsonl", 12, 8, 256, tmp_path, "r.json")
    assert client[:2] == ["/v/python", "-c"] and "from vllm.benchmarks.serve import add_cli_args, main" in client[2]
    opt = {client[i]: client[i + 1] for i in range(3, len(client) - 1) if client[i].startswith("--")}
    assert opt["--backend"] == "openai-chat" and opt["--base-url"] == "http://127.0.0.1:8123"
    assert opt["--temperature"] == "0" and opt["--max-concurrency"] == "8" and opt["--num-prompts"] == "12"
    assert opt["--custom-output-len"] == "256" and opt["--dataset-name"] == "custom"
    assert {"--save-detailed", "--skip-chat-template", "--disable-shuffle"} <= set(client)


def client_result(texts, tps=40.0, errors=None):
    return {"completed": len(texts), "duration": 10.0, "total_output_tokens": 100 * len(texts),
            "output_throughput": tps, "request_throughput": 0.5, "mean_tpot_ms": 25.0, "mean_ttft_ms": 300.0,
            "output_lens": [100] * len(texts), "generated_texts": texts, "errors": errors or [""] * len(texts)}


def test_served_results_are_parsed_and_compared_with_plain():
    from saspec_bench.commands import served_vllm as sv

    got = sv.parse_client_result(client_result(["a", "b"]))
    assert (got["completed"], got["output_tok_per_s"], got["texts"], got["mean_tpot_ms"]) == (2, 40.0, ["a", "b"], 25.0)
    with pytest.raises(ValueError, match="lacks output_throughput"):
        sv.parse_client_result({k: v for k, v in client_result(["a"]).items() if k != "output_throughput"})
    with pytest.raises(ValueError, match="1 request\\(s\\) failed: timeout"):
        sv.parse_client_result(client_result(["a", ""], errors=["", "timeout"]))
    metrics = ('# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n'
               'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0\n'
               'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 96.0\n'
               'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 40.0\n'
               'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0\n')
    assert sv.spec_counters(metrics) == {"drafts": 12.0, "draft_tokens": 96.0, "accepted": 40.0}
    assert sv.spec_counters("") == {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}

    def run(method, c, texts, tps, spec=(0, 0, 0)):
        return {"size": "0.5b", "method": method, "round": 0, "concurrency": c, "completed": len(texts),
                "output_tok_per_s": tps, "texts": texts,
                "spec": dict(zip(("drafts", "draft_tokens", "accepted"), spec))}

    runs = [run("plain", 1, ["x", "y"], 12.0), run("saspec", 1, ["x", "y"], 30.0, (10, 200, 120)),
            run("plain", 8, ["x", "y"], 30.0), run("suffix", 8, ["x", "z"], 45.0, (20, 100, 80))]
    sv.count_identical(runs)
    assert [r["identical"] for r in runs] == [2, 2, 2, 1]
    report = sv.format_report({"date": "d", "cpus": 2, "argv": ["bench-vllm", "--served"], "traffic": "t",
                               "max_tokens": 256}, runs)
    assert "| 0.5b | 1 | saspec | 30.0 | 30.0 | 2.50 | 13.00 | 120 / 200 | 2/2 |" in report
    assert "| 0.5b | 8 | suffix | 45.0 | 45.0 | 1.50 | 5.00 | 80 / 100 | 1/2 |" in report


def test_served_drafters_are_visited_interleaved_and_bad_sweeps_rejected():
    from saspec_bench.commands import served_vllm as sv
    from saspec_bench.options import CliError

    assert sv.visiting_order(["plain", "ngram", "saspec"], 2) == [
        (0, "plain"), (0, "ngram"), (0, "saspec"), (1, "saspec"), (1, "ngram"), (1, "plain")]
    assert sv._concurrency("1, 8") == [1, 8]
    for bad in ("0,8", "one", ""):
        with pytest.raises(CliError, match="--concurrency must"):
            sv._concurrency(bad)
    too_many = argparse.Namespace(served_free_prompts=len(sv.FREE_FORM_PROMPTS) + 1)
    with pytest.raises(CliError, match="--served-free-prompts must be at most"):  # never silently fewer
        sv.main(too_many)


def test_a_served_server_is_stopped_with_its_process_group(tmp_path):
    """A stand-in server (python's http.server, which answers /health with 404: not ready) that
    spawns a child: the readiness wait gives up at its bound and the whole group is gone after."""
    import os
    import sys

    from saspec_bench.commands import served_vllm as sv

    port = sv.free_port()
    pidfile = tmp_path / "child.pid"
    code = (f"import subprocess, sys, http.server; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(600)']); open({str(pidfile)!r}, 'w').write(str(p.pid)); "
            f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.BaseHTTPRequestHandler).serve_forever()")
    server = sv.Server([sys.executable, "-c", code], dict(os.environ), port, tmp_path / "log", ready_timeout_s=3.0)
    with pytest.raises(RuntimeError, match="did not answer /health within 3 s"):
        server.__enter__()
    assert server.proc.poll() is not None
    child = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # the SIGKILL has been sent; the child's exit may take a moment to be reaped
            os.kill(child, 0)
            import time
            time.sleep(0.05)
    failed = sv.Server([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), port, tmp_path / "log2")
    with pytest.raises(RuntimeError, match=r"exited \(3\) before it was ready"):
        failed.__enter__()


def test_a_terminated_served_command_still_stops_its_servers():
    import os
    import signal

    from saspec_bench.commands import served_vllm as sv

    stopped = []
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sv.TerminateAsInterrupt():
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # what `timeout` sends; the handler runs before the next line
                stopped.append("not interrupted")
            finally:
                stopped.append("stopped")  # where Server.__exit__ stops the server
    assert stopped == ["stopped"] and signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("name", ["bench_vllm", "bench_llama_cpp"])
def test_the_engine_children_run_as_scripts_outside_the_package(name):
    """Each child runs its command's file as a script (``python -P FILE --child ...``) in the engine's venv;
    its imports must work there, where the file is not part of a package."""
    import subprocess
    import sys
    from pathlib import Path

    import saspec_bench.commands as commands

    path = Path(commands.__file__).with_name(f"{name}.py")
    proc = subprocess.run([sys.executable, "-P", str(path)], capture_output=True, text=True, timeout=120)
    assert "Error" not in proc.stderr and ("usage" in proc.stderr or "saspec bench" in proc.stderr), proc.stderr


def test_the_vllm_childs_process_tree_meter_loads_cpumeter_from_its_file():
    """The child loads ``saspec_bench/cpumeter.py`` by path (not through the package, which would load numba
    before vLLM starts); the meter it builds counts this process's CPU time."""
    pytest.importorskip("psutil")
    meter = bv._process_tree_meter()
    meter.start()
    share = meter.stop()
    assert share is None or share >= 0.0
