"""The drafting policy: choices under modeled engines, with an injected clock and seeded outcomes.

A modeled engine: each step the automaton offers ``offered`` tokens at a match of ``match``; each draft token
is accepted with probability ``q`` (seeded); a step verifying ``n`` tokens takes ``cost(n)`` seconds times a
load factor. The policy sees only what an integration gives it: offers, timings, emitted tokens.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from saspec.policy import (AUTOMATON, N_BUCKETS, NEURAL, NONE, CatchUpShare, DraftPolicy, PolicySettings, SequencePolicy,
                           StepCost, cpu_like, gpu_like, linear, match_bucket)
from saspec.step_cost import DEAR_TIMINGS, PER_TOKEN_SLACK

K = 8


def run(policy: SequencePolicy, steps: int, cost, *, q: float = 0.9, match: int = 24, offered: int = K,
        load=lambda step: 1.0, q_nn: float | None = None, nn_forward: float = 0.0, nn_slow=lambda call: 1.0,
        seed: int = 0, remaining: int = 10_000) -> dict:
    """Decode ``steps`` steps on a modeled engine; returns tokens, seconds and each step's choice."""
    rng = np.random.default_rng(seed)
    t = tokens = 0.0
    choices, behind, calls, per_step = [], 1, 0, []
    for step in range(steps):
        draft = list(range(100 + step * 40, 100 + step * 40 + offered))
        policy.offer(match, draft)
        source, d = policy.choose(match, offered, K if q_nn is not None else 0, behind, remaining=remaining)
        true_run = 0  # how far the automaton's draft is right: the text that follows
        while true_run < offered and rng.random() < q:
            true_run += 1
        if source == "draft":
            accepted = 0
            while accepted < d and rng.random() < q_nn:
                accepted += 1
            s = nn_forward * (cost(behind) / cost(1) + d - 1) * nn_slow(calls)
            calls += 1
            t += s
            policy.observe_draft_call(s, read=behind, drafted=d)
            policy.observe("draft", 0, d, accepted)
            behind = 1
            emitted = [-3] * (accepted + 1)
        else:
            accepted = min(d, true_run) if source == "sa" else 0
            behind += accepted + 1
            emitted = (draft[:true_run] + [-1])[: accepted + 1]
        s = cost(1 + d) * load(step)
        t += s
        policy.observe_forward(1 + d, s)
        policy.observe_tokens(emitted)
        emitted = len(emitted)
        tokens += emitted
        choices.append((source, d))
        per_step.append((emitted, t))
    (_, t_half) = per_step[steps // 2 - 1]
    late = (tokens - sum(e for e, _ in per_step[: steps // 2])) / (t - t_half)
    return {"rate": tokens / t, "late_rate": late, "choices": choices, "tokens": tokens, "seconds": t}


def drafting_share(choices, source="sa") -> float:
    half = choices[len(choices) // 2:]
    return sum(1 for s, d in half if s == source and d > 0) / len(half)


def best_rate(q: float, cost, k: int = K) -> float:
    """The best fixed draft length's tokens per second on the modeled engine (the oracle)."""
    return max(sum(q ** i for i in range(d + 1)) / cost(1 + d) for d in range(k + 1))


CPU = lambda n: 4.0 + n  # compute-bound: each verified token costs about a row's own  # noqa: E731
GPU = lambda n: 10.0 + 0.01 * n  # memory-bound: flat  # noqa: E731
DEAR = lambda n: float(n)  # every verified token costs a forward  # noqa: E731


def test_gpu_like_drafts_long_at_batch_1_and_cpu_like_shrinks_the_budget_at_concurrency():
    m, off = np.full(8, 24), np.full(8, 32)
    gpu = DraftPolicy(32, cost=StepCost(gpu_like, max_tokens=8 * 33))
    lengths, src = gpu.decide(m[:1], off[:1])
    assert lengths[0] == 32 and src[0] == AUTOMATON
    lengths, _ = gpu.decide(m, off)
    assert lengths.min() > 8
    cpu = DraftPolicy(32, cost=StepCost(cpu_like, max_tokens=8 * 33))
    one, _ = cpu.decide(m[:1], off[:1])
    eight, _ = cpu.decide(m, off)
    assert 0 < eight.max() < one[0]  # where a step costs about its tokens, rows draft only their likeliest


@pytest.mark.parametrize("rows", [8, 32])
def test_gpu_like_drafts_near_certain_copies_in_full_past_the_knee(rows):
    """Under a GPU-like step (8.7 ms flat to 16 tokens, then 0.033 ms a token, as published for a 14B model on
    an H200) rows of near-certain copies draft their whole offer at concurrency, before any timing and after
    steps timed on that curve: past its knee a step still pays its fixed part (the weight reads), so a draft
    token costs its own compute, not a row's share of the fixed part."""
    def seconds(n):
        return 8.7e-3 + 3.3e-5 * max(n - 16, 0)

    m, off = np.full(rows, 2000), np.full(rows, 32)
    p = DraftPolicy(32, cost=StepCost(gpu_like, max_tokens=rows * 33))
    full = []
    for _ in range(20):
        lengths, _ = p.decide(m, off)
        full.append(lengths.min() == 32)
        p.observe_step(rows + int(lengths.sum()), seconds(rows + int(lengths.sum())))
    # the second step tries the plain step's size, not timed yet (StepCost: no lock-in), then drafts in full again
    assert full[0] and all(full[2:])


def _expected_rate(policy: DraftPolicy, match: np.ndarray, lengths: np.ndarray) -> float:
    """The expected tokens per cost unit of a step drafting ``lengths``, by the policy's own estimates."""
    e = len(match) + sum(np.cumprod([policy.q_automaton(m + i, b) for i in range(d)]).sum()
                         for b, (m, d) in enumerate(zip(match, lengths)))
    return e / policy.cost.seconds(len(match) + int(lengths.sum()))


@pytest.mark.parametrize("shape", [cpu_like, linear(11.0, 1.0)])
def test_at_concurrency_the_shortest_step_near_the_best_rate_is_taken(shape):
    """Where the rate is flat near its best (a compute-bound step), the policy drafts fewer tokens for at most
    ``step_tolerance`` of the rate; one row alone drafts for the best rate."""
    m, off = np.full(4, 40), np.full(4, 32)
    best = DraftPolicy(32, cost=StepCost(shape, max_tokens=4 * 33), settings=PolicySettings(step_tolerance=0.0))
    near = DraftPolicy(32, cost=StepCost(shape, max_tokens=4 * 33), settings=PolicySettings(step_tolerance=0.02))
    lb, ln = best.decide(m, off)[0].copy(), near.decide(m, off)[0].copy()
    assert 0 < ln.sum() < 0.85 * lb.sum()
    rb, rn = _expected_rate(best, m, lb), _expected_rate(near, m, ln)
    assert (1 - 0.02) * rb <= rn <= rb
    one_best, one_near = best.decide(m[:1], off[:1])[0].copy(), near.decide(m[:1], off[:1])[0].copy()
    assert np.array_equal(one_best, one_near) and one_best[0] > 0


def test_rows_with_stronger_evidence_get_longer_drafts_and_rows_without_a_match_none():
    p = DraftPolicy(16, cost=StepCost(linear(8.0, 1.0), max_tokens=4 * 17))
    lengths, src = p.decide(np.array([64, 3, 0, 12]), np.array([16, 16, 0, 16]))
    assert lengths[2] == 0 and src[2] == NONE
    assert lengths[0] >= lengths[3] >= lengths[1]


@pytest.mark.parametrize("cost,q", [(CPU, 0.9), (GPU, 0.9), (GPU, 0.5), (CPU, 0.97)])
def test_drafts_where_drafting_pays_and_comes_close_to_the_best_fixed_length(cost, q):
    out = run(SequencePolicy(K, cost=StepCost(cpu_like)), 400, cost, q=q)
    assert drafting_share(out["choices"]) > 0.9
    assert out["rate"] > 0.85 * best_rate(q, cost)


def test_does_not_draft_where_every_verified_token_costs_a_forward_and_copies_are_poor():
    out = run(SequencePolicy(K, cost=StepCost(gpu_like)), 400, DEAR, q=0.3, match=2)
    assert drafting_share(out["choices"]) < 0.1  # a GPU-like prior must not keep it drafting
    assert out["late_rate"] > 0.85 * best_rate(0.3, DEAR)  # re-tries of what it does not choose cost a little


def test_near_certain_long_copies_draft_from_the_first_step_under_linear_cost():
    policy = SequencePolicy(32, cost=StepCost(cpu_like))
    out = run(policy, 200, lambda n: float(n) + 1.0, q=0.93, match=200, offered=32)
    assert out["choices"][0][0] == "sa" and out["choices"][0][1] > 8  # no warm-up of plain steps
    assert drafting_share(out["choices"]) > 0.95


@pytest.mark.parametrize("cost,q,drafts", [(CPU, 0.9, True), (DEAR, 0.3, False)])
def test_a_cold_start_or_a_burst_moves_nothing_for_good(cost, q, drafts):
    cold = run(SequencePolicy(K), 300, cost, q=q, match=24 if drafts else 2,
               load=lambda s: 10.0 if s < 3 else 1.0)
    burst = run(SequencePolicy(K), 300, cost, q=q, match=24 if drafts else 2,
                load=lambda s: 4.0 if 40 <= s < 70 else 1.0)
    for out in (cold, burst):
        share = drafting_share(out["choices"])
        assert share > 0.9 if drafts else share < 0.1


def test_a_burst_that_slows_only_plain_steps_does_not_lock_drafting_in():
    policy = SequencePolicy(K, cost=StepCost(linear(0.0, 1.0)))
    slow_plain = {"on": True}

    def cost(n):
        return DEAR(n) * (5.0 if (n == 1 and slow_plain["on"]) else 1.0)

    out = run(policy, 40, cost, q=0.3, match=2)
    slow_plain["on"] = False
    after = run(policy, 300, cost, q=0.3, match=2, seed=1)
    assert drafting_share(after["choices"]) < 0.1


def test_a_competing_process_never_locks_drafting_out_nor_in():
    rng = np.random.default_rng(7)
    slow = {s: rng.uniform(2, 5) if rng.random() < 1 / 3 else 1.0 for s in range(600)}
    pays = run(SequencePolicy(K), 600, CPU, q=0.9, load=lambda s: slow[s])
    assert drafting_share(pays["choices"]) > 0.9
    poor = run(SequencePolicy(K, cost=StepCost(gpu_like)), 600, DEAR, q=0.3, match=2, load=lambda s: slow[s])
    assert drafting_share(poor["choices"]) < 0.1


def test_a_slow_first_neural_call_does_not_shut_the_draft_model_out():
    # The automaton offers nothing, the draft model accepts 85%, its first call is 100x slow.
    out = run(SequencePolicy(K), 600, CPU, q=0.0, match=0, offered=0, q_nn=0.85, nn_forward=0.5,
              nn_slow=lambda call: 100.0 if call == 0 else 1.0)
    assert drafting_share(out["choices"], "draft") > 0.9
    plain = 1 / CPU(1)
    assert out["rate"] > 1.5 * plain


def test_a_poor_draft_model_is_dropped():
    out = run(SequencePolicy(K), 1500, DEAR, q=0.0, match=0, offered=0, q_nn=0.05, nn_forward=0.5)
    share = drafting_share(out["choices"], "draft")
    assert share < 0.1


def test_the_catch_up_over_a_long_stretch_is_charged_where_the_automaton_wins():
    # A draft model that is 400 tokens behind, against an automaton copy that is nearly sure: the automaton.
    p = SequencePolicy(K)
    p.offer(200, list(range(K)))
    assert p.choose(200, K, K, 400, remaining=300)[0] == "sa"


def test_a_catch_up_share_charges_a_gap_over_the_runs_it_serves_and_a_prompt_over_the_request():
    policy = DraftPolicy(K, cost=StepCost(cpu_like))
    m, off = np.zeros(1, np.int64), np.zeros(1, np.int64)  # no automaton offer: in step, the neural drafter is best
    sure = np.array([200], np.int64), np.array([K], np.int64)  # a sure automaton copy: it is not
    share = CatchUpShare()
    gap = share.share(policy, m, off, K, None, behind=101, in_step=1)  # a 100-token gap, runs of 1 so far
    assert gap == 1.0  # charged whole: it would serve one neural step
    first = share.share(policy, m, off, K, None, behind=101, in_step=1, first=100)  # the prompt, never read
    own = policy.cost.seconds(1) / policy.cost.seconds(101)  # the forward it would run in step: charged whole
    assert own < first < own + 0.02  # the rest served by the request's neural steps to come
    for _ in range(3):  # runs of 20 steps whose best choice is the neural drafter, between automaton copies
        for _ in range(20):
            share.share(policy, m, off, K, None, behind=2, in_step=2)
        share.share(policy, *sure, K, None, behind=2, in_step=2)
    assert share.run_len > 5
    assert share.share(policy, m, off, K, None, behind=101, in_step=1) < 0.3  # a gap now serves a run
    assert share.share(policy, m, off, 0, None, behind=101, in_step=1) == 1.0  # no neural drafter this step


def test_a_policy_serving_sequences_in_turn_charges_each_prompt_as_a_first_read(monkeypatch):
    """Once the neural drafter has drafted, what it is behind is a gap; after ``begin`` (a new sequence, as
    the llama.cpp loop and transformers' ``generate`` call it) it is the new prompt again."""
    firsts = []
    decide = CatchUpShare.decide

    def spy(self, *args, **kw):
        firsts.append(kw.get("first", 0))
        return decide(self, *args, **kw)

    monkeypatch.setattr(CatchUpShare, "decide", spy)
    p = SequencePolicy(K)
    assert p.choose(0, 0, K, 1)[0] == "draft"  # no automaton offer, the drafter in step: it drafts
    p.choose(0, 0, K, 40)
    p.begin()
    p.choose(0, 0, K, 300)
    assert firsts == [1, 0, 300]


def test_a_step_timed_at_zero_or_nan_seconds_is_ignored():
    p = SequencePolicy(K)
    for s in (0.0, -1.0, math.nan, math.inf):
        p.observe_forward(3, s)
        p.observe_draft_call(s, read=2, drafted=2)
    assert p.stats["ignored_timings"] == 4 and p.stats["timed"] == 0
    assert p.choose(24, K)[0] == "sa"


@pytest.mark.parametrize("field,value", [("prior_weight", math.inf), ("prior_weight", math.nan), ("prior_weight", 0),
                                         ("neural_prior", math.nan), ("neural_prior", 1.0), ("neural_prior", -0.1),
                                         ("neural_cost", math.inf), ("neural_memory", 0.0), ("row_memory", 1.5),
                                         ("window", 0), ("max_age", 0), ("quantile", 0.9), ("prior_weight", True),
                                         ("step_tolerance", 0.5), ("step_tolerance", -0.01), ("step_tolerance", "x"),
                                         ("rate_memory", 1.0), ("rate_memory", -0.1), ("rate_memory", math.nan)])
def test_invalid_settings_are_rejected(field, value):
    with pytest.raises(ValueError, match=field):
        DraftPolicy(K, settings=PolicySettings(**{field: value}))


def test_invalid_shapes_and_arguments_are_rejected():
    with pytest.raises(ValueError, match="k_max"):
        DraftPolicy(0)
    with pytest.raises(ValueError, match="shape"):
        StepCost(lambda n: np.full(n.shape, np.inf), max_tokens=8)
    with pytest.raises(ValueError, match="offered"):
        DraftPolicy(K).decide(np.zeros(3, np.int64), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="accepted"):
        SequencePolicy(K).observe("draft", 0, 2, 3)


def test_profile_takes_the_minimum_of_repeats_and_a_cold_first_run_sets_nothing():
    clock = {"t": 0.0, "calls": 0}

    def run_step(n):
        clock["calls"] += 1
        clock["t"] += (10.0 if clock["calls"] == 1 else 1.0) * (4 + n)

    cost = StepCost.profile(run_step, [1, 2, 4, 8, 16], repeats=3, clock=lambda: clock["t"], max_tokens=32)
    assert clock["calls"] == 15
    assert cost.seconds(1) == pytest.approx(5.0) and cost.seconds(8) == pytest.approx(12.0)
    assert cost.seconds(32) == pytest.approx(36.0)  # extended along the last segment


def test_one_timing_moves_no_knot_and_a_lasting_change_is_learnt():
    cost = StepCost(linear(4.0, 1.0), max_tokens=64, window=8, max_age=32)
    for _ in range(10):
        cost.observe(1, 5.0)
    cost.observe(9, 1000.0)  # one slow timing
    assert cost.seconds(9) == pytest.approx(13.0)
    for _ in range(8):
        cost.observe(8, 36.0)  # verifying 8 tokens now costs 3x: learnt
    assert cost.seconds(8) == pytest.approx(36.0)
    for _ in range(40):
        cost.observe(1, 5.0)  # no more 8-token steps: their timings age out, what they said fades
    assert 12.0 < cost.seconds(8) < 0.75 * 36.0
    for _ in range(600):
        cost.observe(1, 5.0)
    assert cost.seconds(8) == pytest.approx(12.0, rel=0.02)


def test_a_size_not_timed_lately_keeps_its_cost_whichever_sizes_were_timed_since():
    # An engine whose fixed part is worth about 21 tokens, under the prior shape 4 + n: the correction falls
    # threefold from 1 token to 33. Code edits verify full drafts (now and then a shorter one), then prose
    # verifies one to four tokens a step: the global scale moves threefold, what the long sizes cost does not.
    def truth(n):
        return 0.144 + 0.0069 * n

    cost = StepCost(cpu_like)
    rng = np.random.default_rng(0)
    code = [33 if rng.random() < 0.7 else int(rng.choice([6, 8, 12, 16, 24])) for _ in range(150)]
    prose = [int(rng.choice([1, 1, 1, 2, 4])) if rng.random() < 0.95 else int(rng.choice([6, 16])) for _ in range(400)]
    sizes = np.array([6, 8, 12, 16, 24, 33])
    worst = 1.0
    for i, n in enumerate(code + prose):
        cost.observe(n, truth(n) * float(rng.uniform(1.0, 1.1)))
        if i >= 40:
            err = cost.seconds(sizes) / truth(sizes)
            worst = max(worst, float(np.max(np.maximum(err, 1 / err))))
    assert worst < 1.5  # remembered against the global scale: 1.9-2.6x off


def test_few_timings_that_make_a_token_dearer_than_at_a_smaller_size_are_believed_only_when_more_say_so():
    cost = StepCost(linear(4.0, 1.0), max_tokens=64, window=8, max_age=32)
    for _ in range(10):
        cost.observe(1, 5.0)
    believed = cost.seconds(2)
    for _ in range(DEAR_TIMINGS - 1):
        cost.observe(2, 60.0)  # a competing process: each of the few 2-token steps happened to be 10x slow
    assert cost.seconds(2) == pytest.approx(believed)  # two 1-token steps would cost 10: noise
    assert cost.seconds(9) == pytest.approx(13.0)  # nor every size above it, through "never cheaper with more"
    cost.observe(2, 5.5)  # one fast one: believed at once
    assert cost.seconds(2) == pytest.approx(5.5)
    for _ in range(DEAR_TIMINGS):
        cost.observe(2, 18.0)  # verifying 2 tokens now costs 3x: learnt on DEAR_TIMINGS fresh timings
    assert cost.seconds(2) == pytest.approx(18.0)
    plausible = StepCost(linear(4.0, 1.0), max_tokens=64, window=8, max_age=32)
    for _ in range(10):
        plausible.observe(1, 5.0)
    assert plausible.seconds(4) == pytest.approx(8.0)
    for _ in range(2):
        plausible.observe(4, 19.0)  # a forward per token: a token no dearer than in a 1-token step, taken at once
    assert plausible.seconds(4) == pytest.approx(19.0)


def test_a_ramp_into_a_cost_curve_that_turns_up_finds_the_turn_and_remembers_it():
    # vLLM on a CPU at 64 rows verifies a token dearer in steps of hundreds of tokens than in small ones. The policy
    # ramped to a new, larger size each step, so no size above the plain step was timed twice, each dear timing
    # alone was noise, and the line through the cheap sizes was believed up to steps that verified slower than
    # plain decoding.
    def truth(n):
        return 0.08 + 0.0095 * n * (1.25 if n > 200 else 1.0)

    cost = StepCost(cpu_like, max_tokens=4096, window=16, max_age=64)
    for _ in range(10):
        cost.observe(64, truth(64))
    for _ in range(3):
        cost.observe(128, truth(128))
    line = cost.seconds(1536)
    assert line == pytest.approx(truth(128) / 128 * 1536, rel=0.1)  # the line: ~25% under the truth
    cost.observe(250, truth(250) * 3.0)  # one dear timing above: noise, or the turn; nothing moves yet
    assert cost.seconds(1536) == pytest.approx(line)
    cost.observe(380, truth(380))  # a second agrees: the turn
    assert cost.seconds(1536) == pytest.approx(truth(1536), rel=0.05)
    assert cost.seconds(128) == pytest.approx(truth(128), rel=0.05)  # the sizes timed twice keep their cost
    for _ in range(70):  # only plain steps: every timing above 64 ages out (max_age)...
        cost.observe(64, truth(64))
    assert cost.seconds(1536) > 1.12 * line  # ...and the turn is remembered, fading
    for _ in range(2000):
        cost.observe(64, truth(64))
    assert cost.seconds(1536) < 1.01 * cost.seconds(64) / 64 * 1536  # faded: tried again, no lock-out


def test_sizes_slowed_by_a_competing_process_raise_the_line_above_them_a_bounded_share():
    cost = StepCost(cpu_like, max_tokens=4096, window=16, max_age=64)
    for _ in range(10):
        cost.observe(64, 0.68)
    for _ in range(3):
        cost.observe(128, 1.29)
    line = cost.seconds(1024)
    cost.observe(250, 5 * 2.4)  # two new sizes, each 5x slow
    cost.observe(380, 5 * 3.6)
    assert line < cost.seconds(1024) <= PER_TOKEN_SLACK * line * 1.0001


def test_two_slow_timings_of_a_short_draft_do_not_lock_drafting_out():
    # A flat-cost engine (a tiny model) beside a competing process: its first two 1-token drafts were timed 10x
    # slow. Believed, they made every larger size as dear, and no draft followed until they aged out, not even
    # on a 40-token match whose every draft token is accepted.
    policy = DraftPolicy(8, cost=StepCost(cpu_like, max_tokens=9))
    drafts = np.arange(8, dtype=np.int32).reshape(1, -1)
    last, slow_left, chosen = 0, 2, []
    for step in range(60):
        slow = last == 1 and slow_left > 0
        slow_left -= slow
        seconds = (1.0 + 0.01 * (1 + last)) * (10.0 if slow else 1.0)
        new = drafts + 100 if step <= 20 else drafts  # a 1-token match whose drafts miss, then a long copy
        emitted = 1 if step <= 20 else last + 1
        lengths = policy.step(np.array([1 if step < 20 else 40], np.int32), np.array([8], np.int32), drafts, new,
                              np.array([emitted], np.int32), seconds, step > 0)
        last = int(lengths[0])
        chosen.append(last)
    assert slow_left == 0  # both slow timings were taken
    assert sum(chosen[30:]) == 8 * 30


def test_rows_keep_their_request_evidence_across_moves_and_every_decision_is_logged():
    seen = []
    p = DraftPolicy(4, cost=StepCost(gpu_like, max_tokens=16), log=seen.append)
    p.rows(["a", "b"])
    p.decide(np.array([5, 5]), np.array([4, 4]))
    drafts = np.array([[1, 2, 3, 4], [1, 2, 3, 4]])
    for _ in range(20):  # "a" always misses its first token, "b" always copies
        p.observe(np.array([5, 5]), np.array([4, 4]), drafts, np.array([[9, 9, 9, 9], [1, 2, 3, 4]]),
                  np.array([1, 4]))
    qa, qb = p.q_automaton(5, 0), p.q_automaton(5, 1)
    assert qa < 0.3 < 0.8 < qb
    p.rows(["b", "a"])
    assert p.q_automaton(5, 0) == pytest.approx(qb) and p.q_automaton(5, 1) == pytest.approx(qa)
    assert len(seen) == 1 and seen[0].lengths.shape == (2,)
    assert p.stats["steps"] == 1 and p.stats["automaton_rows"] + p.stats["none_rows"] == 2


def test_neural_rows_are_chosen_where_the_automaton_is_weak():
    p = DraftPolicy(8, cost=StepCost(gpu_like, max_tokens=64), settings=PolicySettings(neural_prior=0.8, neural_cost=0.02))
    lengths, src = p.decide(np.array([100, 0, 1]), np.array([8, 0, 8]), neural_k=4)
    assert src[0] == AUTOMATON and src[1] == NEURAL and lengths[1] > 0
    assert p.neural_k >= lengths[1]


def test_decisions_go_to_the_logger_where_the_environment_asks(monkeypatch, caplog):
    import logging

    from saspec.policy import LOG_ENV, env_log

    monkeypatch.delenv(LOG_ENV, raising=False)
    assert env_log() is None
    monkeypatch.setenv(LOG_ENV, "1")
    p = DraftPolicy(4, cost=StepCost(gpu_like, max_tokens=16), log=env_log())
    with caplog.at_level(logging.INFO, logger="saspec.policy"):
        p.decide(np.array([30, 0]), np.array([4, 0]))
    assert "2 rows (automaton 1, neural 0, none 1), 4 draft tokens" in caplog.text


def test_step_in_one_call_equals_observe_step_observe_and_decide():
    """``DraftPolicy.step`` (one jitted call, the offers kept by the policy) makes the same choices and
    keeps the same counters as the three calls it folds, on a batch whose rows change request midway."""
    rng = np.random.default_rng(5)
    one, three = DraftPolicy(K), DraftPolicy(K)
    b = 6
    prev = None
    for step in range(120):
        if step == 60:
            b = 9  # a new batch: nothing of the last step is scored or timed
            prev = None
        match = rng.integers(-1, 40, b).astype(np.int32)
        offered = rng.integers(0, K + 1, b).astype(np.int32)
        drafts = rng.integers(0, 5, (b, K)).astype(np.int32)
        new = rng.integers(0, 5, (b, K + 1)).astype(np.int32)
        lens = rng.integers(0, K + 2, b).astype(np.int32)
        branched = (rng.random(b) < 0.4).astype(np.int32)
        seconds = float(rng.choice([0.0, math.nan, 0.01 * (1 + rng.random())]))
        same = prev is not None
        if same:
            three.observe_step(b + three.last_tokens, seconds)
            three.observe(*prev[:3], new, lens, prev[3])
        want, _ = three.decide(match, offered, branched=branched)
        got = one.step(match, offered, drafts, new, lens, seconds, same, branched)
        assert np.array_equal(got, want), step
        assert one.stats == three.stats
        assert np.array_equal(one.p_bucket, three.p_bucket)
        prev = (match.copy(), np.minimum(offered, K), drafts.copy(), branched.copy())
    assert one.stats["timed"] > 20 and one.stats["ignored_timings"] > 20


@pytest.mark.parametrize("k_max", [8, 32])
def test_each_row_takes_the_prefix_of_its_chances_above_one_threshold(k_max):
    """Whatever the kernel's shortcuts (four tokens off one product, the threshold's end found by
    bisection), every automaton row's length is the prefix of its draft whose cumulative chance, the
    product of :meth:`DraftPolicy.q_automaton` along the match, lies in a bin at or above one threshold
    shared by the step; the rate it expects is the step's expected tokens over its modelled seconds."""
    rng = np.random.default_rng(11)
    decisions = []
    policy = DraftPolicy(k_max, cost=StepCost(linear(6.0, 1.0), max_tokens=64 * (k_max + 1)),
                         log=decisions.append)
    b = 24
    for step in range(200):
        match = rng.integers(-2, 300, b).astype(np.int32)
        offered = rng.integers(0, k_max + 1, b).astype(np.int32)
        drafts = rng.integers(0, 3, (b, k_max)).astype(np.int32)
        new = drafts.copy()
        new[rng.random((b, k_max)) < rng.choice([0.0, 0.03, 0.3])] += 1
        lens = rng.integers(0, k_max + 1, b).astype(np.int32)
        branched = (rng.random(b) < 0.3).astype(np.int32)
        lengths = policy.step(match, offered, drafts, new, lens, 0.01, True, branched).copy()
        bins = []  # per row, the bin of each candidate token: the cumulative chance times N_BINS, floored
        expected = float(b)  # the tokens the step emits on average: every row's own, and its draft's chances
        for r in range(b):
            d = min(offered[r], k_max) if match[r] > 0 else 0
            p, row = 1.0, []
            for i in range(d):
                p *= policy.q_automaton(match[r] + i, r, branched=bool(branched[r]) and i == 0)
                row.append(min(int(p * 64), 63))
                expected += p if i < lengths[r] else 0.0
            bins.append(row)
            assert all(x >= y for x, y in zip(row, row[1:]))  # chances fall along a row
            assert lengths[r] <= d
        seconds = float(policy.cost.seconds(b + int(lengths.sum())))
        assert decisions[-1].rate == pytest.approx(expected / seconds, rel=1e-9), step
        drafted = [r for r in range(b) if lengths[r] > 0]
        if not drafted:
            continue
        # the threshold: no lower than the lowest bin a row took, above every bin a row left out
        low = min(bins[r][lengths[r] - 1] for r in drafted)
        left = [bins[r][lengths[r]] for r in range(b) if lengths[r] < len(bins[r])]
        assert not left or max(left) < low, step


def test_a_step_below_the_running_rate_drafts_only_what_pays_at_it():
    """Two policies see the same offers, emitted tokens (a decode of the first policy's drafts) and fixed
    cost; the first keeps a running rate. Each step its rows draft no more than the other's, the running rate
    is the decayed tokens emitted over the decayed steps priced at their mean size, and where the choices
    differ its step earns more tokens less the running rate times the seconds; at short matches (a low step
    rate) it leaves out deep tokens of small chance, never those within the match."""
    rng = np.random.default_rng(3)
    cost = lambda: StepCost(linear(6.0, 1.0), max_tokens=8 * (K + 1))  # noqa: E731
    with_rate = DraftPolicy(K, cost=cost())
    without = DraftPolicy(K, cost=cost(), settings=PolicySettings(rate_memory=0.0))
    g = PolicySettings().rate_memory
    tok_sum = size_sum = steps = 0.0
    b, short_steps = 4, 0
    prev = None  # the last step's offers, how far each was right, and the first policy's lengths
    for step in range(400):
        new, lens = np.zeros((b, K + 1), np.int32), np.zeros(b, np.int32)
        if prev is not None:  # what the target emitted: the accepted drafts, then its own token
            drafts0, run0, got0 = prev
            for r in range(b):
                acc = min(got0[r], run0[r])
                new[r, :acc] = drafts0[r, :acc]
                new[r, acc] = drafts0[r, acc] if acc < run0[r] else -1
                lens[r] = acc + 1
        long_copy = step % 50 < 25  # a stretch of long copies, then one of short matches
        match = (rng.integers(40, 200, b) if long_copy else rng.integers(1, 4, b)).astype(np.int32)
        drafts = rng.integers(0, 50, (b, K + 1)).astype(np.int32)
        # short matches that often run a few tokens past the match: deep tokens whose chance lies between the
        # step's own rate and the running rate, where the two rules differ
        run = np.where(rng.random(b) < 0.9, K, rng.integers(0, K, b)) if long_copy else rng.geometric(0.25, b) - 1
        got = with_rate.step(match, np.full(b, K, np.int32), drafts, new, lens, 0.0, True).copy()
        base = without.step(match, np.full(b, K, np.int32), drafts, new, lens, 0.0, True).copy()
        lam = with_rate.running_rate  # the step's own: it adds the last step before it chooses
        if prev is not None:  # the last step's tokens emitted (no more than it verified) and its size
            size = b + int(prev[2].sum())
            tok_sum, size_sum, steps = tok_sum * g + min(lens.sum(), size), size_sum * g + size, steps * g + 1
        want = tok_sum / (steps * float(with_rate.cost.seconds(round(size_sum / steps)))) if steps else 0.0
        assert lam == pytest.approx(want, rel=1e-12), step
        prev = (drafts, run, got)
        # it only cuts: never below the other's tokens within the match
        assert np.all(got <= base) and np.all(got >= np.minimum(base, match)), step
        if np.array_equal(got, base):
            continue

        def net(lengths):
            tokens = float(b)
            for r in range(b):
                p = 1.0
                for i in range(lengths[r]):
                    p *= with_rate.q_automaton(match[r] + i, r)
                    tokens += p
            return tokens - lam * float(with_rate.cost.seconds(b + int(lengths.sum())))
        assert net(got) >= net(base) - 1e-9, step
        short_steps += int(match.max() < 40)
    assert short_steps >= 5
    assert without.running_rate == 0.0


def test_tokens_a_step_did_not_verify_add_nothing_to_the_running_rate():
    # A caller that hands over more tokens than the step verified (its own tokens, a stream that is not a
    # decode): counted, ten plain steps of 3 tokens a row would set a rate no draft could reach, and the
    # policy would never draft again on the long, fully accepted copies that follow.
    b = 4
    policy = DraftPolicy(K, cost=StepCost(linear(6.0, 1.0), max_tokens=b * (K + 1)))
    drafts = np.arange(b * K, dtype=np.int32).reshape(b, K)
    chosen = []
    for step in range(60):
        match = np.full(b, 0 if step < 10 else 40, np.int32)
        lengths = policy.step(match, np.full(b, K, np.int32), drafts, drafts, np.full(b, 3, np.int32), 0.0, True)
        chosen.append(int(lengths.sum()))
        most = b * (K + 1) / float(policy.cost.seconds(b * (K + 1)))  # every token verified, at the largest step
        assert policy.running_rate <= most + 1e-12
    assert sum(chosen[:10]) == 0 and min(chosen[12:]) > 0


def test_a_batch_that_outgrows_the_state_keeps_every_count_and_estimate():
    """The state lives in buffers sized by the rows seen; a larger batch moves it into new buffers, with
    the bucket estimates, the counters, each request's evidence and the learnt cost unchanged."""
    rng = np.random.default_rng(3)
    p = DraftPolicy(K, cost=StepCost(cpu_like, max_tokens=64 * (K + 1)))
    ids = ["a", "b"]
    p.rows(ids)
    drafts = np.tile(np.arange(K, dtype=np.int32), (2, 1))
    for step in range(30):  # "a" copies, "b" misses
        match = np.array([20, 20], np.int32)
        new = np.stack([np.arange(K + 1), np.full(K + 1, 99)]).astype(np.int32)
        p.step(match, np.full(2, K, np.int32), drafts, new, np.array([K, 1], np.int32), 0.01 + 0.001 * step,
               step > 0)
    before = (p.stats, p.p_bucket.copy(), p.q_automaton(20, 0), p.q_automaton(20, 1), p.cost.seconds(np.arange(1, 40)))
    assert before[2] > before[3] + 0.2  # each request has its own evidence
    big = ids + [f"r{i}" for i in range(40)]
    p.rows(big)
    assert p.stats == before[0] and np.array_equal(p.p_bucket, before[1])
    assert p.q_automaton(20, 0) == before[2] and p.q_automaton(20, 1) == before[3]
    assert np.array_equal(p.cost.seconds(np.arange(1, 40)), before[4])
    b = len(big)
    got = p.step(rng.integers(0, 30, b).astype(np.int32), np.full(b, K, np.int32), np.zeros((b, K), np.int32),
                 np.zeros((b, K + 1), np.int32), np.ones(b, np.int32), 0.02, False)
    assert got.shape == (b,) and p.stats["steps"] == before[0]["steps"] + 1


def test_step_rejects_arrays_of_other_rows_and_changes_nothing():
    """Each array with rows other than match_len's (the rows are checked inside the jitted step, before it
    reads or writes anything), and offered or new_lens of another rank."""
    p = DraftPolicy(K)
    m = np.ones(3, np.int32)
    good = dict(offered=m, drafts=np.zeros((3, K), np.int32), new=np.zeros((3, K), np.int32), new_lens=m,
                branched=np.zeros(3, np.int32))
    p.step(m, good["offered"], good["drafts"], good["new"], good["new_lens"], 0.1, False, good["branched"])
    before = (p.stats, p.p_bucket.copy(), p.cost.knot_ratio.copy(), p.cost.step, p.last_tokens)
    bad = [("offered", np.ones(2, np.int32), "same rows"), ("drafts", np.zeros((2, K), np.int32), "same rows"),
           ("new", np.zeros((4, K), np.int32), "same rows"), ("new_lens", np.ones(2, np.int32), "same rows"),
           ("branched", np.zeros(2, np.int32), r"branched must have shape \(3,\)"),
           ("offered", np.ones((3, 1), np.int32), "1-D"), ("new_lens", np.ones((3, 1), np.int32), "1-D")]
    for name, value, message in bad:
        args = {**good, name: value}
        with pytest.raises(ValueError, match=message):
            p.step(m, args["offered"], args["drafts"], args["new"], args["new_lens"], 0.1, True, args["branched"])
        assert p.stats == before[0] and np.array_equal(p.p_bucket, before[1]), name
        assert np.array_equal(p.cost.knot_ratio, before[2]) and p.cost.step == before[3], name
        assert p.last_tokens == before[4], name


def test_a_branched_match_drafts_less_and_its_first_token_is_learnt_apart():
    """At the same match length, a row whose match went on with several tokens earlier drafts less
    (its first token's prior odds are a quarter); scoring teaches the branched first token apart from
    the unbranched buckets, so a text where branched guesses miss and copies hit leaves copies alone."""
    policy = DraftPolicy(K, cost=StepCost(cpu_like, max_tokens=64 * (K + 1)))
    b = 8
    match = np.full(b, 3, np.int32)
    offered = np.full(b, K, np.int32)
    branched = np.array([0, 1] * (b // 2), np.int32)
    lengths, _ = policy.decide(match, offered, branched=branched)
    assert lengths[branched == 1].sum() < lengths[branched == 0].sum()
    assert policy.q_automaton(3, branched=True) < 0.6 * policy.q_automaton(3)
    plain_q = policy.q_automaton(3)
    drafts = np.tile(np.arange(K, dtype=np.int32), (b, 1))
    new = drafts.copy()[:, : K]
    new[branched == 1, 0] = 99  # every branched guess misses at once, every copy runs whole
    for step in range(40):
        policy.step(match, offered, drafts, new, np.full(b, K, np.int32), 0.01, step > 0, branched)
    assert policy.q_automaton(3, branched=True) < 0.05
    assert policy.q_automaton(3) >= plain_q  # the copies' own bucket is not pulled down by the branched misses


def test_tokens_beyond_the_match_length_are_learnt_apart():
    """Rows whose copies end where their match length runs out (a 3-token match, the fourth token always
    wrong: a short phrase said again) teach the policy to stop at the match's length there, even where
    verifying is nearly free, and leave the buckets of rows that match longer alone: a 6-token match's own
    first tokens keep their estimate."""
    policy = DraftPolicy(K, cost=StepCost(gpu_like, max_tokens=64 * (K + 1)))
    b = 8
    match, offered = np.full(b, 3, np.int32), np.full(b, K, np.int32)
    drafts = np.tile(np.arange(K, dtype=np.int32), (b, 1))
    new = drafts.copy()
    new[:, 3] = 99  # the copy holds for the match's 3 tokens, then the text goes its own way
    before = policy.p_bucket[6], policy.p_bucket[7]  # the first tokens of a 6- and a 7-token match
    first = policy.decide(match, offered)[0].copy()
    assert first.max() > 3  # before any evidence the m + i buckets say the copy runs on
    for step in range(40):
        lengths = policy.step(match, offered, drafts, new, np.full(b, K, np.int32), 0.01, step > 0)
    assert lengths.max() <= 3
    assert (policy.p_bucket[6], policy.p_bucket[7]) == before  # within a longer match: untouched


def test_a_one_token_match_teaches_its_bucket_and_leaves_the_row_factor_alone():
    """A one-token match's offer is a guess at the next token, not a copy: its misses teach the one-token
    bucket but leave the row's factor (what its copies are worth) where it was; a two-token match's misses
    move it."""
    policy = DraftPolicy(K, cost=StepCost(cpu_like, max_tokens=4 * (K + 1)))
    b = 2
    offered = np.full(b, K, np.int32)
    drafts = np.tile(np.arange(K, dtype=np.int32), (b, 1))
    new = np.full((b, K), 99, np.int32)  # every guess misses at once
    lens = np.ones(b, np.int32)
    one_q, copy_q = policy.q_automaton(1), policy.q_automaton(64, row=0)
    for step in range(30):
        policy.step(np.array([1, 2], np.int32), offered, drafts, new, lens, 0.01, step > 0)
    assert policy.q_automaton(1) < 0.5 * one_q  # the bucket learnt the misses
    assert policy.q_automaton(64, row=0) == copy_q  # row 0 (one-token matches): its factor untouched
    odds = lambda q: q / (1.0 - q)  # noqa: E731  (the factor scales a bucket's odds)
    assert odds(policy.q_automaton(64, row=1)) < 0.7 * odds(copy_q)  # row 1 (two-token matches): its factor fell


def test_sequence_policy_scores_a_branched_offer_in_its_own_bucket():
    seq = SequencePolicy(K, cost=StepCost(cpu_like, max_tokens=64 * (K + 1)))
    before = (seq.policy.p_bucket[4], seq.policy.q_automaton(4, branched=True))
    for _ in range(30):
        seq.offer(4, list(range(K)), branched=True)
        seq.choose(4, K)
        seq.observe_forward(1 + K, 0.01)
        seq.observe_tokens([50])  # the branched guess misses
    assert seq.policy.q_automaton(4, branched=True) < before[1] / 2
    assert seq.policy.p_bucket[4] == before[0]  # the unbranched bucket saw no trial (the row's own factor did)


def test_a_step_timed_at_what_it_processed_keeps_prefills_out_of_the_decode_sizes():
    """A served engine's forwards also carry other requests' prefill chunks (100-400 tokens, every other
    step here): told what each forward processed (``step_tokens``), the policy learns the engine's curve
    there and at the sizes it has not timed lately; timed at its own rows and drafts, the prefills' seconds
    land on its decode sizes and raise the global scale that the sizes it has not timed follow."""
    cost = linear(40.0, 1.0)  # the engine, in ms: a fixed part and a token's worth per token
    prefills = np.random.default_rng(4).integers(100, 400, 90)

    def run(told: bool) -> DraftPolicy:
        p = DraftPolicy(K, cost=StepCost(cpu_like, max_tokens=2048))
        b = 8
        match, offered = np.full(b, 6, np.int32), np.full(b, K, np.int32)
        drafts = np.zeros((b, K), np.int32)
        new = np.zeros((b, K + 1), np.int32)
        new[:, 2] = 1  # each row's first two draft tokens are accepted
        lens = np.full(b, 3, np.int32)
        chosen = 0
        for step in range(90):
            n = b + chosen + (int(prefills[step]) if step % 2 == 0 else 0)
            got = p.step(match, offered, drafts, new, lens, float(cost(n)) / 1000, step > 0, None, n if told else 0)
            chosen = int(got.sum())
        return p

    told, blind = run(True), run(False)
    assert told.cost.seconds(24) == pytest.approx(float(cost(24)) / 1000, rel=0.05)  # the size it drafts at
    for n in (72, 408):  # a size not timed lately; a prefill's
        truth = float(cost(n)) / 1000
        assert abs(told.cost.seconds(n) - truth) < abs(blind.cost.seconds(n) - truth), n
    assert told.cost.seconds(408) == pytest.approx(float(cost(408)) / 1000, rel=0.05)
    assert blind.cost.seconds(408) > 2 * float(cost(408)) / 1000


@pytest.mark.parametrize("cls", [DraftPolicy, SequencePolicy])
def test_for_engine_builds_the_cost_model_from_the_device_and_the_settings(cls, monkeypatch):
    """One constructor for every engine: the prior shape follows the device unless the settings name one, the
    cost model takes the settings' refresh rule and ``max_tokens``, and the log defaults to the environment's."""
    from saspec.policy import LOG_ENV, log_decision

    def policy(p):
        return p if cls is DraftPolicy else p.policy

    monkeypatch.delenv(LOG_ENV, raising=False)
    cpu, gpu = policy(cls.for_engine(4)), policy(cls.for_engine(4, device="cuda", max_tokens=40))
    assert np.array_equal(cpu.cost.shape, cpu_like(np.maximum(np.arange(4097), 1)))
    assert gpu.cost.max_tokens == 40 and np.array_equal(gpu.cost.shape, gpu_like(np.maximum(np.arange(41), 1)))
    assert cpu.log is None and not cpu.catchup_sunk
    ps = PolicySettings(cost_shape=linear(2.0, 3.0), window=5, max_age=7, quantile=0.5, prior_weight=3.0)
    clock = lambda: 0.0  # noqa: E731
    own = policy(cls.for_engine(4, device="cuda", settings=ps, neural_catchup_sunk=True, clock=clock))
    assert own.cost.shape[10] == 32.0 and (own.cost.window, own.cost.max_age, own.cost.quantile) == (5, 7, 0.5)
    assert own.settings is ps and own.prior_weight == 3.0 and own.catchup_sunk and own.clock is clock
    monkeypatch.setenv(LOG_ENV, "1")
    assert policy(cls.for_engine(4)).log is log_decision
    with pytest.raises(ValueError, match="k_max"):
        cls.for_engine(0)


def test_the_buckets_follow_the_requests_of_late_not_every_request_since_the_start():
    # A server's code edits copy on past the match (the tokens beyond a 4-token match are kept), then its prose
    # questions do not: the beyond-the-match bucket learnt on thousands of code tokens turns within a few dozen
    # prose steps, as the rows' own evidence alone could not (new rows each request: no row factor to lean on).
    policy = DraftPolicy(K, cost=StepCost(cpu_like, max_tokens=8 * (K + 1)))
    b = 8
    match, offered = np.full(b, 4, np.int32), np.full(b, K, np.int32)
    drafts = np.tile(np.arange(K, dtype=np.int32), (b, 1))
    lens = np.full(b, K, np.int32)
    beyond = 2 * N_BUCKETS + match_bucket(8)  # draft token 4 of a 4-token match: further than the match is long
    for step in range(300):
        policy.rows([("code", step // 20, r) for r in range(b)])
        policy.step(match, offered, drafts, drafts, lens, 0.01, step % 20 > 0)
    assert policy.p_bucket[beyond] > 0.9
    prose = drafts.copy()
    prose[:, 4] = 99  # the copy holds for the match's 4 tokens, then the text goes its own way
    for step in range(60):
        policy.rows([("prose", step // 20, r) for r in range(b)])
        policy.step(match, offered, drafts, prose, lens, 0.01, step % 20 > 0)
    assert policy.p_bucket[beyond] < 0.3
