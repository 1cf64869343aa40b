"""The ``saspec`` command line as a newcomer meets it: every bad option or
input gives one line ``saspec <command>: error: ...`` on stderr and exit
status 2, never a traceback; ``--help`` shows the defaults and the trace
format; ``-k`` beyond the default acceptance profile works."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from saspec_bench.cli import main
from saspec_bench.acceptance import DEFAULT_P, default_p
from saspec_bench.commands.simulate import EPILOG
from saspec_bench.workloads import Trace, load_traces, save_traces


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of ``saspec argv``, whether it exits through
    argparse (SystemExit) or returns from main."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def assert_one_line_error(code: int, err: str, prog: str, fragment: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"{prog}: error: "), err
    assert fragment in err, err


@pytest.fixture
def traces(tmp_path):
    """A small recorded-trace file (a perfect copy task)."""
    path = tmp_path / "rec.jsonl"
    save_traces(path, [Trace(np.array([5, 6, 7, 8] * 6, np.int32), np.array([5, 6, 7, 8] * 10, np.int32), {})], "m")
    return path


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- every bad option or input is one line on stderr and exit status 2 -----------------------------


# (argv, prog, fragment of the message); "{tmp}" is the test's temporary directory,
# "{traces}" a valid trace file.
BAD = [
    # simulate: options
    (["simulate", "--workloads", "{tmp}/missing.jsonl"], "saspec simulate", "no such trace file"),
    (["simulate", "--workloads", "code-edit"], "saspec simulate", "unknown workload 'code-edit'"),
    (["simulate", "--workloads", ""], "saspec simulate", "comma-separated list of workloads"),
    (["simulate", "--thresholds", "abc"], "saspec simulate", "argument --thresholds: threshold 'abc': expected an integer"),
    (["simulate", "--thresholds", "1,,4"], "saspec simulate", "without empty items"),
    (["simulate", "--thresholds", "0,4"], "saspec simulate", "must be >= 1, got 0"),
    (["simulate", "-k", "0"], "saspec simulate", "argument -k/--k: must be in [1, 32], got 0"),
    (["simulate", "-k", "eight"], "saspec simulate", "expected an integer, got 'eight'"),
    (["simulate", "--pool-tokens", "-1"], "saspec simulate", "argument --pool-tokens: must be >= 0"),
    (["bench", "--only", "step"], "saspec bench", "argument --only: invalid choice: 'step'"),
    (["simulate", "--threshold", "-2"], "saspec simulate", "argument --threshold: must be >= 1"),
    (["simulate", "--size", "0"], "saspec simulate", "argument --size: must be >= 1, got 0"),
    (["simulate", "--p", "0.9,1.5"], "saspec simulate", "probability '1.5': must be in [0, 1]"),
    (["simulate", "--p", "0.9,nan"], "saspec simulate", "must be in [0, 1]"),
    (["simulate", "--p", "x"], "saspec simulate", "expected a number"),
    (["simulate", "--occurrences", "last"], "saspec simulate", "unknown SA occurrence rule 'last'"),
    (["simulate", "--seed", "-1"], "saspec simulate", "argument --seed: must be >= 0"),
    (["simulate", "--bogus"], "saspec simulate", "unrecognized arguments: --bogus"),
    (["simulate", "-k", "33"], "saspec simulate", "argument -k/--k: must be in [1, 32], got 33"),
    # simulate: inputs and combinations found when the command runs
    (["simulate", "--workloads", "{bad_json}"], "saspec simulate", "bad.jsonl:2: invalid JSON"),
    (["simulate", "--workloads", "{no_output}"], "saspec simulate", "no_output.jsonl:1: expected an object with"),
    (["simulate", "--workloads", "{empty}"], "saspec simulate", "empty.jsonl: no traces"),
    (["simulate", "--workloads", "{binary}"], "saspec simulate", "binary.jsonl: not a UTF-8 JSON Lines file"),
    (["simulate", "--workloads", "{tmp}/missing.jsonl.gz"], "saspec simulate", "no such trace file"),
    (["simulate", "--workloads", "{tmp}/traces.json"], "saspec simulate", "or give a trace file ending in .jsonl"),
    (["simulate", "--workloads", "{traces}", "--p", "0.9,0.8"], "saspec simulate",
     "--p gives 2 probabilities but -k is 8"),
    (["simulate", "--workloads", "{traces}", "--out", "{traces}"], "saspec simulate", "File exists"),
    (["simulate", "--workloads", "{traces},{tmp}/sub/rec.jsonl"], "saspec simulate", "two workloads would be named 'rec'"),
    # bench
    (["bench", "--quick", "--bogus"], "saspec bench", "unrecognized arguments: --bogus"),
    (["bench", "--json", "{tmp}/no/such/dir/out.json"], "saspec bench", "argument --json: directory"),
    (["bench", "--json", "{tmp}"], "saspec bench", "is a directory"),
    (["simulate", "--json", "{tmp}/no/out.json"], "saspec simulate", "argument --json: directory"),
    # models
    (["models"], "saspec models", "the following arguments are required"),
    (["models", "install", "llama"], "saspec models install", "invalid choice: 'llama'"),
    (["models", "list", "extra"], "saspec models list", "unrecognized arguments: extra"),
    # generate
    (["generate"], "saspec generate", "one of the arguments --prompt --prompt-file is required"),
    (["generate", "--prompt", "hi", "-k", "0"], "saspec generate", "argument -k/--k: must be >= 1"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "saspec generate", "must be >= 1"),
    (["generate", "--prompt", "hi", "--stop-below", "2"], "saspec generate", "must be in [0, 1], got 2"),
    (["generate", "--prompt", "hi", "--per-match", "-1"], "saspec generate", "must be >= 0"),
    (["generate", "--prompt", "hi", "--family", "llama"], "saspec generate", "invalid choice: 'llama'"),
    (["generate", "--prompt-file", "{tmp}/missing.txt"], "saspec generate", "No such file or directory"),
    (["generate", "--prompt", "  "], "saspec generate", "the prompt is empty"),
    (["generate", "--prompt-file", "{binary}"], "saspec generate", "not UTF-8 text"),
    # bench-e2e
    (["bench-e2e", "--methods", "sa,eagle"], "saspec bench-e2e", "unknown method 'eagle'"),
    (["bench-e2e", "--prompt-lookup", "8,0"], "saspec bench-e2e", "token count '0': must be >= 1"),
    (["bench-e2e", "--max-contention", "15"], "saspec bench-e2e", "must be in [0, 1], got 15"),
    (["bench-e2e", "--free-prompts", "9"], "saspec bench-e2e", "must be in [0, 8], got 9"),
    (["bench-e2e", "--retries", "-1"], "saspec bench-e2e", "must be >= 0"),
    (["bench-e2e", "--pool-tokens", "-5"], "saspec bench-e2e", "argument --pool-tokens: must be >= 0"),
    (["bench-e2e", "--code-prompts", "0", "--free-prompts", "0"], "saspec bench-e2e", "no prompts"),
    (["calibrate", "--out", "{tmp}"], "saspec calibrate", "is a directory"),
    (["record-traces", "--out", "{tmp}/no/such/dir/x.jsonl.gz"], "saspec record-traces", "does not exist"),
    # bench-vllm
    (["bench-vllm", "-k", "0"], "saspec bench-vllm", "argument -k/--k: must be >= 1"),
    (["bench-vllm", "--code-prompts", "-3"], "saspec bench-vllm", "argument --code-prompts: must be >= 0"),
    (["bench-vllm", "--models", ","], "saspec bench-vllm", "no model sizes in --models"),
    (["bench-vllm", "--pool-tokens", "0"], "saspec bench-vllm", "argument --pool-tokens: must be >= 1"),
    (["bench-vllm", "--code-prompts", "0", "--free-prompts", "0", "--multi-turn-prompts", "0"], "saspec bench-vllm",
     "no prompts"),
    # the top level
    ([], "saspec", "the following arguments are required: COMMAND"),
    (["simulat"], "saspec", "invalid choice: 'simulat'"),
]


@pytest.mark.parametrize("argv,prog,fragment", BAD, ids=[" ".join(a) or "(none)" for a, _, _ in BAD])
def test_bad_option_is_one_line_and_exit_2(argv, prog, fragment, tmp_path, traces, capsys):
    files = {"tmp": str(tmp_path), "traces": str(traces),
             "bad_json": write(tmp_path, "bad.jsonl", traces.read_text() + "{not json\n"),
             "no_output": write(tmp_path, "no_output.jsonl", '{"prompt_ids": [1, 2]}\n'),
             "empty": write(tmp_path, "empty.jsonl", "\n\n"), "binary": str(tmp_path / "binary.jsonl")}
    (tmp_path / "binary.jsonl").write_bytes(b"\x1f\x8b\x08\x00\xff\xfe not text\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rec.jsonl").write_text(traces.read_text())
    argv = [a.format(**files) for a in argv]
    assert_one_line_error(*run_cli(argv, capsys), prog, fragment)


def test_generate_without_installed_models_names_the_install_command(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    monkeypatch.setenv("SASPEC_MODELS", str(tmp_path / "empty-cache"))
    code, err = run_cli(["generate", "--prompt", "hi", "--drafter", "sa", "--threads", "1"], capsys)
    assert_one_line_error(code, err, "saspec generate", "is not installed; run `saspec models install`")


@pytest.mark.parametrize("argv,fragment", [
    (["simulate", "-k", "0"], "argument -k/--k: must be in [1, 32], got 0"),
    (["simulate", "--workloads", "{bad}"], "invalid JSON"),
])
def test_the_installed_command_exits_2_without_a_traceback(argv, fragment, tmp_path):
    """The real process: exit status and the whole of stderr."""
    bad = write(tmp_path, "bad.jsonl", "[1, 2\n")
    argv = [a.format(bad=bad) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "saspec_bench.cli", *argv], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert_one_line_error(proc.returncode, proc.stderr, "saspec simulate", fragment)
    assert proc.stdout == ""


# -- -k beyond the default acceptance profile extends it -------------------------------------------


def test_k_beyond_the_default_profile_extends_it(traces, tmp_path, capsys):
    assert default_p(3) == DEFAULT_P[:3]
    assert default_p(12) == DEFAULT_P + (DEFAULT_P[-1],) * 4
    assert main(["simulate", "--workloads", str(traces), "-k", "16", "--no-plots", "--no-ngram",
                 "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["neural_p"] == list(default_p(16))
    rows = {r["drafter"]: r for r in res["workloads"]["rec"]["rows"]}
    assert rows["sa:first"]["AL"] == 40 / 3  # a perfect copy, K=16: 17 + 17 + 6 tokens in 3 steps
    # an explicit --p longer than K is cut to K
    assert main(["simulate", "--workloads", str(traces), "-k", "2", "--p", "1,1,0", "--no-plots", "--no-ngram",
                 "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["neural_p"] == [1.0, 1.0]
    assert {r["drafter"]: r for r in res["workloads"]["rec"]["rows"]}["neural"]["AL"] == 40 / 14  # 3 per step


# -- help shows the defaults and the trace format --------------------------------------------------


def test_simulate_help_shows_defaults_and_the_trace_format(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in ("draft tokens per step (K, at most 32: the cost model's tables stop there) (default: 8)", "(default: 1,2,3,4,6,8,12,16,24,32)",
                 "(default: first,recent,near-first,near-recent)", "(default: saspec-out)",
                 "prompt_ids list of int", "output_ids list of int", "model string", "meta object",
                 "extended to K by repeating the last value"):
        assert text in out, text


def test_help_of_every_command_shows_its_defaults(capsys):
    for argv, text in ((["bench-e2e"], "(default: 0.15)"), (["generate"], "(default: 256)"),
                       (["models", "install"], "(default: qwen2.5-coder)")):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        assert text in " ".join(capsys.readouterr().out.split()), argv


def test_the_documented_example_trace_line_is_accepted(tmp_path, capsys):
    line = next(x.strip() for x in EPILOG.splitlines() if x.strip().startswith('{"prompt_ids"'))
    path = tmp_path / "example.jsonl"
    path.write_text(line + "\n")
    w = load_traces(path)
    assert len(w.traces) == 1 and w.meta["model"] == json.loads(line)["model"]
    assert main(["simulate", "--workloads", str(path), "--no-plots", "--no-ngram", "--out", str(tmp_path)]) == 0
    assert "\n| example | " in capsys.readouterr().out
    assert "| example | sa:first |" in (tmp_path / "tables.md").read_text()


def test_the_docs_document_the_trace_format():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "traces.md").read_text()
    section = page[page.index("## The format"):]
    assert re.search(r"`prompt_ids`.*`output_ids`.*`model`.*`meta`", section, re.S)
    example = next(x for x in section.splitlines() if x.startswith('{"prompt_ids"'))
    assert set(json.loads(example)) == {"prompt_ids", "output_ids", "model", "meta"}


# -- plots stay readable for several workloads -----------------------------------------------------


def test_plots_stay_readable_for_several_workloads(traces, tmp_path, capsys):
    """Panels wrap two per row, so a figure's width does not grow with the
    number of workloads (the old bar chart was 2376 px wide for four)."""
    from PIL import Image

    names = []
    for name in ("a", "b", "c"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(traces.read_text())
        names.append(str(path))
    out = tmp_path / "out"
    assert main(["simulate", "--workloads", ",".join(names), "--no-ngram", "--thresholds", "1,3,5",
                 "--out", str(out)]) == 0
    for png in ("al_vs_threshold.png", "al_by_policy.png", "accepted_distribution.png"):
        w, h = Image.open(out / png).size
        assert 600 <= w <= 1400 and 300 <= h <= 1400, (png, w, h)


def test_pick_names_the_unknown_item_and_an_empty_list():
    from saspec_bench.options import CliError, pick

    assert pick(" plain, saspec ,", ("plain", "saspec"), "--methods", "method") == ["plain", "saspec"]
    with pytest.raises(CliError, match=r"unknown method 'nope' in --methods; expected some of plain, saspec"):
        pick("plain,nope", ("plain", "saspec"), "--methods", "method")
    with pytest.raises(CliError, match="no methods in --methods"):
        pick(" , ", ("plain",), "--methods", "method")
    assert pick("", ("plain",), "--models", "model size", allow_empty=True) == []
