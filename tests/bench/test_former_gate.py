"""CostGate drafts only where a draft pays, and cannot lock itself out.

The unit tests state timings directly. The replay tests run the gate over the
shipped real outputs of Qwen2.5-Coder-1.5B (code edits, HumanEval edits,
chat) with a real ``SpecEngine`` and an injected clock
(``saspec_bench.gate_replay``): a step's time is a function of its forward
size (and, where stated, of a seeded burst), so every run is deterministic and
nothing reads the real time.
"""

from __future__ import annotations

import numpy as np
import pytest

from saspec_bench.former_gate import PROBE_WAIT, CostGate, best_draft_length, expected_tokens
from saspec_bench.gate_replay import bursts, load_traces, plain_time, replay
from saspec_bench.gate_replay import cheap as CHEAP
from saspec_bench.gate_replay import dear as DEAR
from saspec_bench.gate_replay import flattening as CONCAVE

TRACES = load_traces()
KINDS = sorted({t["meta"]["workload"] for t in TRACES})


# -- the rule: the most expected tokens per second -----------------------------------


def test_best_draft_length_is_the_brute_force_argmax():
    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(1, 33))
        q = float(rng.random())
        vc = np.concatenate([[1.0], 1.0 + np.cumsum(rng.random(k) * rng.choice([0.02, 0.3, 1.2]))])
        dc = float(rng.choice([0.0, 0.1, 0.5]))
        gains = [1.0] + [sum(q ** i for i in range(d + 1)) / (vc[d] + d * dc) for d in range(1, k + 1)]
        d, g = best_draft_length(q, k, vc, dc)
        assert g == pytest.approx(max(gains))
        assert d == int(np.argmax(gains))  # the first (shortest) best
    assert expected_tokens(0.5, 3) == pytest.approx(1.875)
    assert best_draft_length(0.99, 8, np.arange(1.0, 10.0), 0.0)[0] == 0  # every token costs a forward: never pays


def test_warm_up_times_a_plain_step_twice_then_probes_with_the_sa_draft():
    g = CostGate(8)
    assert g.choose(2, 8) == ("none", 0)
    g.observe_forward(40, 5.0)  # larger than any verify (a prefill): ignored
    g.observe_forward(1, 0.9)  # a cold first step
    assert not g.timed and g.choose(2, 8) == ("none", 0)
    g.observe_forward(1, 0.3)
    assert g.timed and not g.probed and g.verify_cost()[0] == 1.0
    assert g.choose(0, 0) == ("none", 0)  # no SA draft to probe with: wait for one
    assert g.choose(2, 8) == ("probe", 1)  # one token of the SA's draft: what does a 2-token verify cost?
    g.observe_forward(2, 0.31)
    assert g.probed and g.verify_cost()[1] == pytest.approx(0.31 / 0.3)  # the unit is the fast plain step
    source, n = g.choose(20, 8)
    assert source == "sa" and n >= 7  # a long match, and verifying looks cheap (the 5-8 token size is tried first)
    assert g.stats["warm-up"] == 4 and g.stats["sa"] == 1


def test_during_the_warm_up_a_near_certain_copy_is_drafted_in_full():
    g = CostGate(8)
    assert g.choose(20, 8) == ("sa", 8)  # q("sa", 20) >= WARM_COPY: accepted, any verify pays for itself
    assert g.choose(2, 8) == ("none", 0)  # a short match waits for the unit of cost
    assert g.stats["warm-up"] == 2 and not g.timed


def test_the_probe_guesses_when_the_sa_never_drafts():
    g = CostGate(4)
    for _ in range(2):
        g.choose(0, 0)
        g.observe_forward(1, 0.3)
    waits = [g.choose(0, 0) for _ in range(PROBE_WAIT + 1)]
    assert waits[:-1] == [("none", 0)] * PROBE_WAIT and waits[-1] == ("probe", 1)


def test_where_each_verified_token_costs_a_forward_no_draft_pays():
    g = CostGate(8)
    for s in (0.3, 0.3):
        g.choose(2, 8)
        g.observe_forward(1, s)
    assert g.choose(2, 8) == ("probe", 1)
    g.observe_forward(2, 0.6)
    vc = g.verify_cost()
    assert vc[1] == pytest.approx(2.0) and vc[8] == pytest.approx(9.0)  # extrapolated along the timed segment
    assert [g.choose(m, 8)[0] for m in (1, 2)] == ["none", "none"]  # short matches: nothing pays, nothing to try


def test_a_size_timed_once_is_doubted_and_a_flat_curve_is_found():
    g = CostGate(8, verify_cost=None)
    for n, s in ((1, 0.3), (1, 0.3), (3, 0.32), (3, 0.32), (8, 0.9)):
        g.observe_forward(n, s)
    vc = g.verify_cost()
    # a bucket costs its estimate over its span (3-4 tokens); the 8-token forward was timed once and is dearer
    # than the line from the 3-4 token bucket (at least the prior's 0.1 units per token): maybe slow
    assert vc[2] == vc[3] == pytest.approx(0.32 / 0.3) and vc[7] == pytest.approx((0.32 + 4 * 0.1 * 0.3) / 0.3)
    g.observe_forward(8, 0.5)
    assert g.verify_cost()[7] == pytest.approx(0.5 / 0.3)  # timed twice: its fastest


def test_a_verify_never_costs_more_than_a_larger_one():
    """A small size timed in a burst long ago must not make the size drafted
    every step since look dear; the size timed more recently stands."""
    g = CostGate(8)
    for n, s in [(1, 1.0)] * 2 + [(2, 5.0)] * 2 + [(9, 2.0)] * 5:
        g.choose(20, 8)
        g.observe_forward(n, s)
    vc = g.verify_cost()
    assert vc[8] == pytest.approx(2.0) and vc[1] == pytest.approx(2.0) and np.all(np.diff(vc[1:]) >= 0)
    for _ in range(2):  # and now the small size again, dearer than the large one was
        g.choose(20, 8)
        g.observe_forward(2, 3.0)
    vc = g.verify_cost()
    assert vc[1] == pytest.approx(3.0) and vc[8] == pytest.approx(3.0)


# -- acceptance ----------------------------------------------------------------------


def test_an_offer_is_scored_against_the_tokens_that_follow():
    g = CostGate(8, verify_cost=1.0 + 0.1 * np.arange(9), draft_cost=0.4)
    hits, misses = g._sa_hits.copy(), g._sa_misses.copy()
    g.offer(3, [5, 6, 7, 8])
    g.offer(9, [1, 2])  # one offer at a time: this one is not taken
    g.observe_tokens([5, 6])  # a plain step's token and the next: the offer is still open
    assert np.array_equal(g._sa_hits, hits)
    g.observe_tokens([7, 0])  # three matched, then a miss
    b = 3
    assert g._sa_hits[b] == hits[b] + 3 and g._sa_misses[b] == misses[b] + 1
    g.offer(3, [4, 4])
    g.observe_tokens([4, 4, 9])  # matched in full: no miss
    assert g._sa_hits[b] == hits[b] + 5 and g._sa_misses[b] == misses[b] + 1
    g.offer(3, [1])
    g.withdraw_offer()  # its sequence ended
    g.observe_tokens([2])
    assert g._sa_misses[b] == misses[b] + 1
    g.offer(0, [1])  # no match: nothing to score
    g.offer(3, [])
    assert g._offer is None


def test_sa_acceptance_is_learnt_on_steps_that_do_not_draft():
    """Where verifying is dear the gate decodes plainly, yet it keeps scoring
    the automaton's drafts against the text that followed them: on a long
    copy its estimate rises to what the copy shows."""
    g = CostGate(8, verify_cost=np.arange(1.0, 10.0), draft_cost=0.0)
    text = list(range(50)) * 3
    q0 = g.q("sa", 20)
    for i in range(60, 120):  # the third repeat: each step's SA draft is the next 8 tokens
        g.offer(20, text[i : i + 8])
        assert g.choose(20, 8) == ("none", 0)
        g.observe_tokens([text[i]])
    assert g.q("sa", 20) > max(q0, 0.97)


def test_sa_acceptance_at_unseen_matches_follows_the_sequence():
    """Acceptance seen at some match lengths moves the estimate at others:
    chat, whose drafts miss, lowers it everywhere."""
    g, fresh = CostGate(8), CostGate(8)
    for _ in range(30):
        g.observe("sa", 2, 4, 0)
    assert g.q("sa", 40) < fresh.q("sa", 40) and g.q("sa", 2) < 0.3


def test_draft_model_acceptance_is_learnt():
    g = CostGate(8, verify_cost=1.0 + 0.1 * np.arange(9), draft_cost=0.4)
    for _ in range(20):
        g.observe("sa", 2, 4, 0)
        g.observe("draft", 0, 4, 4)
    assert g.q("draft") > 0.95
    assert g.choose(2, 8, 8)[0] == "draft"  # the SA keeps missing at this match, the draft model does not
    assert g.choose(0, 0, 0) == ("none", 0)


def test_a_draft_model_far_behind_the_text_must_pay_for_its_catch_up():
    """Starting the draft model after a long prompt, or after many SA steps, costs a catch-up over the tokens
    it has not read; the gate charges it (over a few steps) before choosing the draft model."""
    g = CostGate(8, verify_cost=1.0 + 0.1 * np.arange(9), draft_cost=0.4)
    g.observe_forward(1, 0.3)
    g.observe_draft_forward(0.3 * 10.0, read=1000)  # a 1000-token prompt read at 1/100 of a forward per token
    assert g.choose(0, 0, 8, model_behind=30)[0] == "draft"  # a short prompt: worth reading
    assert g.choose(0, 0, 8, model_behind=4000)[0] == "none"  # 40 forwards' worth of reading: not for one step
    with pytest.raises(ValueError, match="read"):
        g.observe_draft_forward(0.1, read=0)


# -- bad inputs ----------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 0.0, -1.0, "0.3", None, True])
def test_timings_must_be_finite_and_positive(seconds):
    g = CostGate(4)
    g.observe_forward(1, 0.3)
    before = (g.verify_cost().copy(), g.draft_cost(), g.timed)
    with pytest.raises(ValueError, match="seconds"):
        g.observe_forward(1, seconds)
    with pytest.raises(ValueError, match="seconds"):
        g.observe_draft_forward(seconds)
    after = (g.verify_cost(), g.draft_cost(), g.timed)
    assert np.array_equal(before[0], after[0]) and before[1:] == after[1:]


def test_bad_settings_and_observations_are_rejected():
    for kwargs, what in (({}, "k_max"), ({"window": 0}, "window"), ({"retry_after": 0}, "retry_after"),
                         ({"retry_after": 8, "max_retry_after": 4}, "max_retry_after"),
                         ({"model_prior": 1.5}, "model_prior"), ({"prior_weight": 0}, "prior_weight"),
                         ({"clock": 3.0}, "clock"), ({"draft_cost": 0.3}, "draft_cost is fixed only"),
                         ({"verify_cost": np.ones(5)}, "verify_cost"),
                         ({"verify_cost": [1.0, float("nan"), 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]}, "verify_cost")):
        with pytest.raises(ValueError, match=what):
            CostGate(0 if what == "k_max" else 8, **kwargs)
    g = CostGate(4)
    with pytest.raises(ValueError, match="n_tokens"):
        g.observe_forward(0, 0.3)
    with pytest.raises(ValueError, match="unknown source"):
        g.observe("eagle", 1, 2, 1)
    with pytest.raises(ValueError, match="accepted"):
        g.observe("sa", 1, 2, 3)
    with pytest.raises(ValueError, match="unknown source"):
        g.q("eagle")


def test_fixed_costs_need_only_the_unit():
    fixed = CostGate(4, verify_cost=[1.0, 1.1, 1.2, 1.3, 1.4])
    fixed.observe_forward(1, 0.01)  # the unit the draft model's cost is measured in
    fixed.observe_forward(3, 5.0)  # the verify costs stay fixed
    fixed.observe_draft_forward(0.1)
    assert fixed.draft_cost() == pytest.approx(10.0)
    assert fixed.choose(0, 0, 4) == ("none", 0)  # a draft token costs 10 forwards
    assert fixed.verify_cost().tolist() == [1.0, 1.1, 1.2, 1.3, 1.4]


# -- replayed over real outputs, with an injected clock -----------------------------


def _by_kind(cost_for, **gate_kwargs) -> dict[str, list[dict]]:
    return {kind: [replay(CostGate(8, **gate_kwargs), t, cost_for(i)) for i, t in enumerate(TRACES)
                   if t["meta"]["workload"] == kind] for kind in KINDS}


def _long_steps_drafted(runs: list[dict], long: int = 16) -> float:
    steps = [c for r in runs for c in r["choices"] if c[0] >= long]
    return sum(c[2] > 0 for c in steps) / len(steps)


def test_cheap_verification_still_drafts_long_matches_under_bursts_of_load():
    runs = _by_kind(lambda i: bursts(lambda n: CHEAP(n), seed=i))
    for kind, rs in runs.items():
        assert _long_steps_drafted(rs) >= 0.9, kind


def test_where_every_verified_token_costs_a_forward_the_gate_costs_at_most_3_percent():
    for kind, rs in _by_kind(lambda i: lambda step, n: DEAR(n)).items():
        per_token = sum(r["time"] for r in rs) / sum(r["tokens"] for r in rs)
        assert per_token <= 1.03, (kind, per_token)  # plain decoding: 1.0 per token


def test_bursts_of_load_do_not_make_a_dear_verify_look_cheap():
    """Where every verified token costs a forward, with 20 % of steps 2-5x
    slower (for plain decoding too): four slow plain steps in a row must not
    make the verify timed before them look cheaper than a plain step."""
    for kind in KINDS:
        chosen = [(i, t) for i, t in enumerate(TRACES) if t["meta"]["workload"] == kind]
        gated = sum(replay(CostGate(8), t, bursts(DEAR, seed=i))["time"] for i, t in chosen)
        plain = sum(plain_time(t, bursts(DEAR, seed=i)) for i, t in chosen)
        assert plain / gated >= 0.97, (kind, plain / gated)


def test_a_cost_curve_that_flattens_is_found():
    """fp32 ``F.linear`` on x86 costs about a forward per row up to 4 rows and
    little more after: a gate that extrapolated the 2-token step's slope would
    never try a long draft, and decode plainly."""
    for kind, rs in _by_kind(lambda i: lambda step, n: CONCAVE(n)).items():
        if kind != "chat":
            speedup = sum(r["tokens"] for r in rs) / sum(r["time"] for r in rs)
            assert speedup > 1.7 and _long_steps_drafted(rs) > 0.95, (kind, speedup)


def test_a_cold_first_step_changes_nothing_after_ten_steps():
    for i, t in enumerate(TRACES[::4]):
        warm = replay(CostGate(8), t, lambda step, n: CHEAP(n))
        cold = replay(CostGate(8), t, lambda step, n: CHEAP(n) * (3.0 if step == 0 else 1.0))
        assert cold["choices"][10:] == warm["choices"][10:], i


def test_one_outlier_moves_no_decision():
    trace = max(TRACES, key=lambda t: len(t["output_ids"]))
    steady = replay(CostGate(8), trace, lambda step, n: CHEAP(n))["choices"]
    for factor in (10.0, 0.1):
        for at in (30, 31, 45):
            odd = replay(CostGate(8), trace, lambda step, n: CHEAP(n) * (factor if step == at else 1.0))["choices"]
            assert odd == steady, (factor, at)


def test_a_burst_never_turns_drafting_off_for_the_rest_of_a_sequence():
    """Every forward 3x slower for the warm-up and the ten steps after it (a
    busy machine at the start, or a cold process): drafting resumes once the
    machine is quiet. With verification that stays dear it does not."""
    copies = [t for t in TRACES if t["meta"]["workload"] != "chat"]
    for i, t in enumerate(copies[::5]):
        runs = replay(CostGate(8), t, lambda step, n: CHEAP(n) * (3.0 if step < 13 else 1.0))
        late = [c for c in runs["choices"][13 + 2 * 8:] if c[0] >= 16]  # two re-try periods later
        if len(late) >= 10:
            assert sum(c[2] > 0 for c in late) / len(late) >= 0.9, i


def test_a_gate_that_drafts_where_verifying_turned_dear_recovers():
    """Verification cheap for 40 steps, then dear (another job took the
    accelerator): the gate's own timings show it, and from two re-try periods
    later it costs about what plain decoding costs, 1.0 per token."""
    per_token = []
    for t in TRACES:
        steps = replay(CostGate(8), t, lambda step, n: CHEAP(n) if step < 40 else DEAR(n))["steps"][40 + 2 * 8:]
        if len(steps) >= 30:
            per_token.append(sum(s for s, _ in steps) / sum(n for _, n in steps))
    assert len(per_token) >= 20 and np.mean(per_token) <= 1.03 and max(per_token) <= 1.15, per_token


def test_a_draft_call_times_its_draft_tokens_in_step_and_its_reading_in_a_catch_up():
    g = CostGate(8)
    g.observe_forward(1, 0.3)
    for _ in range(4):
        g.observe_draft_call(0.4, read=1, drafted=4)  # in step with the text: 0.1 s per draft token
    assert g._draft_seconds() == pytest.approx(0.1)
    g.observe_draft_call(1.3, read=100, drafted=4)  # a catch-up: 0.013 s per token read, its drafts included
    assert g._catchup_seconds() == pytest.approx(0.013)
    assert g._draft_seconds() == pytest.approx(0.1)  # the catch-up does not move the draft-token cost
    with pytest.raises(ValueError, match="drafted"):
        g.observe_draft_call(0.1, read=1, drafted=0)

