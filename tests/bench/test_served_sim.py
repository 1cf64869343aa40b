"""The served-run replay: its step accounting, and a run folder read back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from saspec_bench.served_sim import CHAT, load_run, simulate


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
