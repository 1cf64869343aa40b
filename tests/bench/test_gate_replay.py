"""The replay of the drafting policy over the shipped real outputs (``saspec_bench.gate_replay``)."""

from __future__ import annotations

import pytest

from saspec_bench.gate_replay import compute_bound, load_traces, make, plain_time, replay, summary


def test_replay_summary_counts_tokens_verified_in_vain():
    runs = [{"choices": [(5, "sa", 3), (0, "none", 0), (20, "sa", 4)], "steps": [(1.0, 2), (1.0, 1), (1.0, 5)],
             "time": 3.0}]
    s = summary(runs, [6.0])
    assert s["x_plain"] == 2.0 and s["accepted"] == 5 and s["wasted"] == 2
    assert s["drafted_long"] == 1.0 and s["drafted"] == pytest.approx(2 / 3)


def test_replay_tells_the_policy_where_a_match_branched():
    """The same trace replayed with and without the engine's branch flags: told, the policy verifies
    fewer tokens in vain on chat (a branched match's first token is priced lower)."""
    chat = [t for t in load_traces() if t["meta"]["workload"] == "chat"][:6]
    cost = lambda step, n: compute_bound(n)  # noqa: E731
    told = [replay(make("policy-cpu"), t, cost) for t in chat]
    blind = [replay(make("policy-cpu"), t, cost, branched=False) for t in chat]
    plain = [plain_time(t, cost) for t in chat]
    assert summary(told, plain)["wasted"] < summary(blind, plain)["wasted"]


def test_the_match_capped_rule_drafts_no_more_than_the_match_is_long():
    rule = make("match-capped")
    assert rule.choose(1, 8) == ("none", 0) and rule.choose(3, 8) == ("sa", 3) and rule.choose(20, 8) == ("sa", 8)
    assert rule.choose(5, 0) == ("none", 0)
