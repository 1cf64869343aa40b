"""`saspec record-traces` and `saspec calibrate` end to end on tiny random models written to a temp dir."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_generate import CYCLE, PROMPTS, greedy, perturbed, tiny_model  # noqa: E402

from saspec_bench.commands import record, simulate  # noqa: E402
from saspec_bench.prompts import split_workloads  # noqa: E402
from saspec_bench.cli import main as cli  # noqa: E402
from saspec_bench.costmodel import Profile  # noqa: E402
from saspec_bench.draft_runs import compute_draft_runs  # noqa: E402
from saspec_bench.workloads import load_traces  # noqa: E402


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for name, model in (("tiny-target", tiny_model(1, CYCLE)), ("tiny-draft", tiny_model(3, perturbed(CYCLE, 0.3, 7)))):
        model.save_pretrained(root / name)
        dirs[name] = str(root / name)
    return dirs


PROMPT_LINES = [
    {"id": "a", "workload": "code-edits", "prompt_ids": PROMPTS["enter-loop"][1], "max_new_tokens": 40},
    {"id": "b", "workload": "chat", "prompt_ids": PROMPTS["loop"][1], "max_new_tokens": 25, "meta": {"x": 1}},
    {"id": "c", "workload": "code-edits", "prompt_ids": PROMPTS["random"][1], "max_new_tokens": 30},
]


def write_prompts(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def run_record(model_dirs, prompts, out, capsys):
    rc = cli(["record-traces", "--target-dir", model_dirs["tiny-target"], "--draft-dir", model_dirs["tiny-draft"],
              "--prompts", prompts, "--out", str(out), "--quiet", "--chunk", "16", "--threads", "1"])
    assert rc == 0
    return capsys.readouterr().out


# -- record-traces records, resumes, and feeds the simulator ---------------------------------------


def test_record_traces_end_to_end_and_resume(model_dirs, tmp_path, capsys):
    out = tmp_path / "real.jsonl.gz"
    first = write_prompts(tmp_path / "p1.jsonl", PROMPT_LINES[:1])
    assert "recorded 1 traces, skipped 0" in run_record(model_dirs, first, out, capsys)
    assert not record.partial_path(out).exists()
    # an interrupted run: one more trace complete in the partial file, then a truncated line
    partial = record.partial_path(out)
    with gzip.open(out, "rt") as f:
        line_a = f.readline()
    obj_b = json.loads(line_a)
    target = tiny_model(1, CYCLE)
    draft = tiny_model(3, perturbed(CYCLE, 0.3, 7))
    b = PROMPT_LINES[1]
    out_b = greedy(target, b["prompt_ids"], b["max_new_tokens"])
    runs_b = compute_draft_runs(draft, b["prompt_ids"], out_b, "tiny-draft")
    obj_b.update(prompt_ids=b["prompt_ids"], output_ids=out_b, draft_runs=runs_b.as_json(),
                 meta={"id": "b", "workload": "chat", "x": 1, "marker": "from the partial file"})
    partial.write_text(json.dumps(obj_b) + "\n" + '{"prompt_ids": [1, 2')
    everything = write_prompts(tmp_path / "p.jsonl", PROMPT_LINES)
    msg = run_record(model_dirs, everything, out, capsys)
    assert "recorded 1 traces, skipped 2" in msg and "3 traces" in msg
    assert not partial.exists()
    w = load_traces(out)
    assert [t.meta["id"] for t in w.traces] == ["a", "b", "c"]
    assert w.traces[1].meta["marker"] == "from the partial file"  # not recomputed
    assert w.meta["model"] == "tiny-target"
    for t, p in zip(w.traces, PROMPT_LINES):
        assert t.output.tolist() == greedy(target, p["prompt_ids"], p["max_new_tokens"])
        assert t.draft_runs == compute_draft_runs(draft, p["prompt_ids"], t.output, "tiny-draft")
        assert t.meta["workload"] == p["workload"]
        assert t.meta["id"] == "b" or t.meta["target_forwards"] >= 1  # b was written by hand
    # nothing left to do: a rerun records nothing and rewrites the same traces
    assert "recorded 0 traces, skipped 3" in run_record(model_dirs, everything, out, capsys)
    assert load_traces(out).traces == w.traces

    # the simulator: the file as a trace workload, and as the default "real" workload split by kind
    groups = split_workloads(out)
    assert {k: len(v) for k, v in groups.items()} == {"real:code-edits": 2, "real:chat": 1}
    rc = cli(["simulate", "--workloads", str(out), "--no-plots", "--no-ngram", "--occurrences", "first",
              "--out", str(tmp_path / "sim")])
    assert rc == 0
    screen = capsys.readouterr().out
    assert "The draft model is the real one (tiny-draft, teacher-forced runs)" in " ".join(screen.split())
    assert "\n| real | " in screen and screen.rstrip().endswith(f"results: {tmp_path / 'sim' / 'results.json'}")
    text = (tmp_path / "sim" / "tables.md").read_text()
    assert "| draft-model (tiny-draft) |" in text and "hybrid:draft-model:T=4" in text
    assert "| real | draft-model K=3 |" in text and ") over the draft model alone" in text
    assert "hybrid threshold over the real draft model: T=" in text
    res = json.loads((tmp_path / "sim" / "results.json").read_text())
    assert {r["drafter"] for r in res["workloads"]["real"]["rows"]} >= {"draft-model", "tree:draft-model:T=4"}


def test_real_workload_is_default_only_when_the_file_exists(tmp_path, monkeypatch, model_dirs, capsys):
    missing = tmp_path / "none.jsonl.gz"
    monkeypatch.setattr(simulate, "REAL_OUTPUTS_PATH", missing)
    assert simulate.REAL not in simulate.default_workloads()
    assert simulate.load_workloads([simulate.REAL], None, 0) == {}
    assert "no recorded data" in capsys.readouterr().out
    out = tmp_path / "real.jsonl.gz"
    run_record(model_dirs, write_prompts(tmp_path / "p.jsonl", PROMPT_LINES[:2]), out, capsys)
    monkeypatch.setattr(simulate, "REAL_OUTPUTS_PATH", out)
    assert simulate.default_workloads()[-2:] == (simulate.REAL, simulate.CROSS)  # the cross-request file ships too
    flats = simulate.load_workloads([simulate.REAL], None, 0)
    assert set(flats) == {"real:code-edits", "real:chat"}
    assert all(f.draft_runs is not None and f.draft_model == "tiny-draft" for f in flats.values())


# -- bad prompts and options end the command with exit 2 -------------------------------------------


def test_record_traces_bad_inputs(model_dirs, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "workload": "chat", "prompt_ids": [], "max_new_tokens": 3}) + "\n")
    args = ["record-traces", "--target-dir", model_dirs["tiny-target"], "--draft-dir", model_dirs["tiny-draft"]]
    assert cli(args + ["--prompts", str(bad), "--out", str(tmp_path / "x.jsonl.gz")]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    dup = write_prompts(tmp_path / "dup.jsonl", [PROMPT_LINES[0], PROMPT_LINES[0]])
    assert cli(args + ["--prompts", dup, "--out", str(tmp_path / "x.jsonl.gz")]) == 2
    assert "repeated id" in capsys.readouterr().err
    big = write_prompts(tmp_path / "big.jsonl", [{**PROMPT_LINES[0], "prompt_ids": [1, 999]}])
    assert cli(args + ["--prompts", big, "--out", str(tmp_path / "x.jsonl.gz")]) == 2
    assert "outside the models' vocabulary" in capsys.readouterr().err
    assert cli(args + ["--prompts", big, "--out", str(tmp_path / "x.jsonl")]) == 2
    assert ".jsonl.gz" in capsys.readouterr().err


# -- calibrate writes a cost profile ---------------------------------------------------------------


def test_calibrate_writes_a_profile(model_dirs, tmp_path, capsys):
    out = tmp_path / "prof.json"
    rc = cli(["calibrate", "--target-dir", model_dirs["tiny-target"], "--draft-dir", model_dirs["tiny-draft"],
              "--batches", "1,4", "--context", "32", "--tokens", "1,3,9", "--repeats", "1", "--threads", "1",
              "--out", str(out), "--name", "tiny"])
    assert rc == 0
    prof = Profile.load(out)
    assert prof.name == "tiny" and set(prof.batches) == {1, 4}
    for c in prof.batches.values():
        assert c.target_s.shape == (33,) and np.all(c.target_s > 0) and c.sa_step_s > 0
    assert cli(["calibrate", "--tokens", "1,40", "--out", str(out)]) == 2
    assert "at most 33" in capsys.readouterr().err


def test_cross_request_prompts_repeat_one_task_over_many_inputs():
    from saspec_bench import cross_requests as cr
    from saspec_bench.tokenizers import get_tokenizer

    tok = get_tokenizer()
    prompts = cr.cross_request_prompts(tok)
    by = {w: [p for p in prompts if p["workload"] == w] for w in cr.WORKLOADS}
    assert [len(by[w]) for w in cr.WORKLOADS] == [cr.JSON_COUNT, cr.EDIT_TURNS, cr.TESTS_COUNT]
    assert len({p["id"] for p in prompts}) == len(prompts)
    for w, ps in by.items():
        assert [p["meta"]["arrival"] for p in ps] == list(range(len(ps))), w
        assert len({p["meta"].get("unit", p["meta"].get("turn")) for p in ps}) == len(ps), f"{w}: distinct inputs"
    turns = [p["prompt_ids"] for p in by["agent-edit"]]
    for a, b in zip(turns, turns[1:]):  # each turn is the conversation so far plus one more edit
        assert len(b) > len(a)
    ask = tok.decode(by["json-extract"][0]["prompt_ids"])
    assert '{"name": str' in ask and "{{" not in ask
    assert cr.cross_request_prompts(tok) == prompts, "deterministic"
