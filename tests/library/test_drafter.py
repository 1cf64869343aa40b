"""Drafter: the lifecycle, per-request options, failed builds, and the step an engine drives."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from saspec import SpecEngine
from saspec.drafter import Drafter
from saspec.options import DraftOptions, parse_options
from saspec.policy import AUTOMATON, NONE

K = 8


class Clock:
    """A clock only the simulated forwards advance: ``cost(n)`` seconds for a forward over n tokens."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FailBuilds:
    """Fault hook: the chosen builds fail (counted in order of asking)."""

    def __init__(self, fail: set[int]) -> None:
        self.fail, self.asked = fail, 0
        self.lock = threading.Lock()

    def should_fail(self, kind: str) -> bool:
        if kind != "build":
            return False
        with self.lock:
            self.asked += 1
            return self.asked in self.fail


def run(drafter: Drafter, prompts: dict, outputs: dict, options: dict | None = None, clock: Clock | None = None,
        batch: int = 4, cost=lambda n: 0.01 + 0.001 * n) -> dict:
    """Serve every request to its end, ``batch`` rows at a time, with greedy verification: each step a
    row emits the prefix of its draft that matches its output plus one token of its own. Returns per
    request the draft tokens proposed and accepted, its steps and its longest draft."""
    options = options or {}
    pending = list(prompts)
    pos: dict = {}  # tokens of its output each live request has emitted
    emitted: dict = {}  # what it emitted at its last step (the tokens the next step appends)
    stats = {r: {"proposed": 0, "accepted": 0, "steps": 0, "longest": 0} for r in prompts}
    while pending or pos:
        while pending and len(pos) < batch:
            r = pending.pop(0)
            drafter.start(r, prompts[r], options.get(r))
            pos[r] = 1  # the prefill emits the first output token
            emitted[r] = [outputs[r][0]]
        rids = list(pos)
        new = np.zeros((len(rids), K + 1), np.int32)
        lens = np.zeros(len(rids), np.int32)
        for i, r in enumerate(rids):
            new[i, : len(emitted[r])] = emitted[r]
            lens[i] = len(emitted[r])
        batch_out = drafter.step(rids, new, lens)
        n_tokens = len(rids)
        for i, r in enumerate(rids):
            d = batch_out.row(i)
            assert batch_out.lengths[i] == (len(d) if batch_out.sources[i] == AUTOMATON else 0)
            out = outputs[r]
            a = 0
            while a < len(d) and pos[r] + a < len(out) - 1 and d[a] == out[pos[r] + a]:
                a += 1
            step = out[pos[r]: pos[r] + a + 1]
            s = stats[r]
            s["proposed"] += len(d)
            s["accepted"] += a
            s["steps"] += 1
            s["longest"] = max(s["longest"], len(d))
            n_tokens += len(d)
            pos[r] += len(step)
            emitted[r] = step
        if clock is not None:
            clock.t += cost(n_tokens)
        for r in [r for r in rids if pos[r] >= len(outputs[r])]:
            drafter.finish(r)
            del pos[r], emitted[r]
    return stats


def copy_task(seed: int, n: int = 6, length: int = 120):
    """Requests that rewrite a block of their prompt with a few changes (copy-heavy)."""
    rng = np.random.default_rng(seed)
    prompts, outputs = {}, {}
    for i in range(n):
        block = rng.integers(10, 5000, length).tolist()
        out = list(block)
        for j in rng.choice(length, 3, replace=False).tolist():
            out[j] = int(rng.integers(5000, 6000))
        prompts[f"r{i}"] = [1, 2, 3] + block + [4]
        outputs[f"r{i}"] = out + [5]
    return prompts, outputs


def test_drafts_follow_a_fixed_rule_exactly_like_the_engine():
    """With the fixed rule, every row's draft is the engine's own draft of the same text."""
    prompts, outputs = copy_task(0, n=3)
    with Drafter(K, length_rule="fixed", min_match=1) as d:
        ref = SpecEngine()
        for r in prompts:
            d.start(r, prompts[r])
            ref.add_request(r, prompts[r])
        rids = list(prompts)
        ref.prepare(rids)
        rng = np.random.default_rng(1)
        pos = {r: 0 for r in rids}
        for _ in range(30):
            lens = rng.integers(1, K + 2, len(rids)).astype(np.int32)
            new = np.zeros((len(rids), K + 1), np.int32)
            for i, r in enumerate(rids):
                chunk = outputs[r][pos[r]: pos[r] + lens[i]]
                lens[i] = len(chunk)
                new[i, : len(chunk)] = chunk
                pos[r] += len(chunk)
            got = d.step(rids, new, lens)
            m = np.zeros(len(rids), np.int32)
            dr = np.zeros((len(rids), K), np.int32)
            ref.extend(new, lens, m, dr)
            live = lens > 0
            np.testing.assert_array_equal(got.match[live], m[live])
            for i in np.flatnonzero(live):
                want = dr[i][dr[i] >= 0].tolist() if m[i] >= 1 else []
                assert got.row(i) == want
                assert got.sources[i] == (AUTOMATON if want else NONE)


def test_policy_drafts_copies_and_learns():
    """The policy drafts on copy-heavy requests (most output tokens come from accepted drafts)."""
    prompts, outputs = copy_task(2)
    clock = Clock()
    with Drafter(K, clock=clock) as d:
        stats = run(d, prompts, outputs, clock=clock)
        st = d.stats()
    accepted = sum(s["accepted"] for s in stats.values())
    total = sum(len(o) for o in outputs.values())
    assert accepted > total / 2
    assert st["steps"] > 0 and st["draft_tokens"] >= accepted and st["policy_timed"] > 0
    assert st["finished"] == len(prompts) and len(d) == 0


@pytest.mark.parametrize("rule,min_match", [("policy", 1), ("fixed", 2), ("per-match", 2)])
def test_the_policy_weighs_every_match_and_a_fixed_rule_drafts_from_two_tokens(rule, min_match):
    """Unset, the minimum match is 1 under the policy (its buckets weigh a one-token match) and 2 under a fixed
    rule (which would draft K tokens at any match it is given); a given one stands."""
    with Drafter(K, length_rule=rule) as d:
        assert d.drafts.min_match == min_match
    with Drafter(K, length_rule=rule, min_match=3) as d:
        assert d.drafts.min_match == 3


def test_disabled_request_is_never_drafted_for():
    prompts, outputs = copy_task(3, n=4)
    opts = {"r1": {"enabled": False}, "r2": DraftOptions(enabled=False)}
    for pool in (0, 100_000):
        with Drafter(K, length_rule="fixed", min_match=1, pool_tokens=pool) as d:
            stats = run(d, prompts, outputs, opts)
            assert d.stats()["disabled_rows"] > 0
        assert stats["r1"]["proposed"] == stats["r2"]["proposed"] == 0
        assert stats["r0"]["accepted"] > 0 and stats["r3"]["accepted"] > 0


def test_disabled_request_joins_the_pool():
    """Drafting off still builds the automaton where a pool may take the text: a later request that
    repeats the disabled one's output drafts from the pool."""
    prompts, outputs = copy_task(4, n=1)
    prompts["again"], outputs["again"] = [7, 7, 7], list(outputs["r0"])
    with Drafter(K, length_rule="fixed", min_match=1, pool_tokens=100_000) as d:
        stats = run(d, {"r0": prompts["r0"]}, {"r0": outputs["r0"]}, {"r0": {"enabled": False}}, batch=1)
        d.pool.flush(timeout=60)
        again = run(d, {"again": prompts["again"]}, {"again": outputs["again"]}, batch=1)
    assert stats["r0"]["proposed"] == 0
    assert again["again"]["accepted"] > len(outputs["again"]) / 2


@pytest.mark.parametrize("cap", [0, 1, 2, 5])
def test_max_draft_tokens_caps_every_draft(cap):
    prompts, outputs = copy_task(5, n=3)
    opts = {"r1": {"max_draft_tokens": cap}}
    for rule in ("fixed", "policy"):
        clock = Clock()
        with Drafter(K, length_rule=rule, min_match=1, clock=clock) as d:
            stats = run(d, prompts, outputs, opts, clock=clock)
        assert stats["r1"]["longest"] <= cap
        assert stats["r0"]["longest"] > cap
        if cap:
            assert stats["r1"]["accepted"] > 0


def test_hints_raise_acceptance_on_an_edit_of_a_file_the_prompt_lacks():
    """A request editing a file that is not in its prompt drafts from the file given as hints."""
    rng = np.random.default_rng(6)
    file = rng.integers(10, 5000, 200).tolist()
    edited = list(file)
    edited[50] = 9999
    prompts = {"edit": [1, 2, 3]}  # "apply the change": the file is not in the prompt
    outputs = {"edit": edited + [5]}
    results = {}
    for hints in (None, file):
        clock = Clock()
        with Drafter(K, clock=clock) as d:
            results[hints is not None] = run(d, prompts, outputs, {"edit": {"hints": hints}}, clock=clock)["edit"]
    assert results[False]["accepted"] < 20
    assert results[True]["accepted"] > 150
    assert results[True]["steps"] < results[False]["steps"] / 3


def test_hints_never_leak_the_separator_or_the_prompt_into_drafts():
    """A draft copied from the hints stops at their end: the prompt after the separator is not drafted."""
    hints = [10, 11, 12, 13]
    with Drafter(K, length_rule="fixed", min_match=1) as d:
        d.start("a", [20, 21, 22], {"hints": hints})
        out = d.step(["a"], np.array([[11, 12, 0, 0, 0, 0, 0, 0, 0]], np.int32), np.array([2], np.int32))
        assert out.row(0) == [13]
        assert out.match[0] == 2


@pytest.mark.parametrize("options, error, text", [
    ({"enable": False}, ValueError, "unknown option 'enable'"),
    ({"enabled": "no"}, TypeError, "enabled must be a bool"),
    ({"max_draft_tokens": -1}, ValueError, "max_draft_tokens must be >= 0"),
    ({"max_draft_tokens": 2.5}, TypeError, "max_draft_tokens must be an int"),
    ({"max_draft_tokens": True}, TypeError, "max_draft_tokens must be an int"),
    ({"hints": [1, -2]}, ValueError, "hints"),
    ({"hints": [1.5]}, TypeError, "hints"),
    (["enabled"], TypeError, "must be a mapping"),
])
def test_bad_options_are_refused_and_change_nothing(options, error, text):
    with Drafter(K) as d:
        with pytest.raises(error, match=text):
            d.start("a", [1, 2, 3], options)
        assert "a" not in d and len(d) == 0
        d.start("a", [1, 2, 3])  # the id is still free
        assert d.options("a") == parse_options(None)


def test_bad_step_inputs_are_refused_and_change_nothing():
    with Drafter(K, length_rule="fixed", min_match=1) as d:
        d.start("a", [1, 2, 3, 1, 2])
        good_new, good_lens = np.array([[3, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32), np.array([1], np.int32)
        with pytest.raises(TypeError, match="new_tokens must hold integers"):
            d.step(["a"], good_new.astype(np.float32), good_lens)
        with pytest.raises(ValueError, match="new_lens must have 1 dimension"):
            d.step(["a"], good_new, np.array([1, 1], np.int32))
        with pytest.raises(KeyError, match="'b' was not started"):
            d.step(["a", "b"], np.zeros((2, K + 1), np.int32), np.array([1, 1], np.int32))
        with pytest.raises(ValueError, match="new_lens must be in"):
            d.step(["a"], good_new, np.array([K + 2], np.int32))
        with pytest.raises(KeyError, match="already started"):
            d.start("a", [1])
        out = d.step(["a"], good_new, good_lens)  # nothing changed: "a" continues where it was
        assert out.match[0] == 3 and out.row(0)[:3] == [1, 2, 3]  # the text is 1 2 3 1 2 3, once


def test_a_failed_build_is_counted_logged_and_rebuilt(caplog):
    """A build that fails ahead (injected MemoryError) never reaches the step: that request drafts
    nothing at first, is rebuilt from the engine's texts, every other row drafts as usual, and finish
    forgets it."""
    prompts, outputs = copy_task(7, n=3)
    faults = FailBuilds({1})  # the first build: r0's, ahead
    with caplog.at_level(logging.WARNING, logger="saspec"), \
            Drafter(K, length_rule="fixed", min_match=1, faults=faults) as d:
        for r in prompts:
            d.start(r, prompts[r])
        rids = list(prompts)
        texts = np.zeros((3, 400), np.int32)
        text_len = np.zeros(3, np.int32)
        for i, r in enumerate(rids):
            text_len[i] = len(prompts[r])
            texts[i, : text_len[i]] = prompts[r]
        new = np.zeros((3, K + 1), np.int32)
        lens = np.ones(3, np.int32)
        for i, r in enumerate(rids):
            new[i, 0] = outputs[r][0]
        out = d.step(rids, new, lens, text_len=text_len, texts=texts)  # r0 is rebuilt here from texts
        assert d.stats()["build_failures"] == 1
        assert sum("building the automaton of request 'r0' failed" in m for m in caplog.messages) == 1
        ref = SpecEngine()
        for i, r in enumerate(rids):
            ref.add_request(r, prompts[r])
        ref.prepare(rids)
        m, dr = np.zeros(3, np.int32), np.zeros((3, K), np.int32)
        ref.extend(new, lens, m, dr)
        for i in range(3):
            assert out.row(i) == (dr[i][dr[i] >= 0].tolist() if m[i] else [])
        for r in rids:
            d.finish(r)
        assert len(d) == 0 and len(d.drafts) == 0 and "r0" not in d.drafts
        assert d.drafts.engine.stats()["requests"] == 0


def test_a_build_that_keeps_failing_drafts_nothing_and_backs_off():
    """Every build of one request fails: it never drafts, is retried after 1, 2, 4, ... of its steps,
    and the other rows are unaffected; its finish completes."""

    class Always:
        asked = 0

        def should_fail(self, kind):
            if kind == "build":
                Always.asked += 1
                return True
            return False

    with Drafter(K, length_rule="fixed", min_match=1, faults=Always()) as d:
        d.start("a", [1, 2, 3, 1, 2])
        texts = np.array([[1, 2, 3, 1, 2] + [0] * 100], np.int32)
        new = np.array([[3] + [0] * K], np.int32)
        for step in range(20):
            out = d.step(["a"], new, np.array([1], np.int32), text_len=np.array([5 + step], np.int32),
                         texts=texts)
            assert out.lengths[0] == 0
            texts[0, 5 + step] = 3
        assert 3 <= d.stats()["build_failures"] <= 7  # 1 ahead, then retries at steps 0, 2, 6, 14
        d.finish("a")
        assert len(d) == 0 and "a" not in d.drafts


def test_a_build_failed_ahead_of_a_request_that_finishes_before_any_step_is_forgotten():
    faults = FailBuilds(set(range(1, 101)))
    with Drafter(K, faults=faults) as d:
        for i in range(100):
            d.start(i, [1, 2, 3])
        for i in range(100):
            d.finish(i)
        d.drafts.close()
        assert not d.drafts._dropped and len(d.drafts) == 0  # noqa: SLF001 (the lifecycle's internals)


def test_the_step_is_timed_by_the_drafters_clock_between_steps():
    clock = Clock()
    with Drafter(K, clock=clock) as d:
        d.start("a", [1, 2, 3, 4] * 10)
        new, lens = np.array([[1] + [0] * K], np.int32), np.array([1], np.int32)
        d.step(["a"], new, lens)
        clock.t += 0.5
        d.step(["a"], new, lens)
        assert d.stats()["policy_timed"] == 1
        d.idle()  # an empty engine step: the next step is not timed against the last
        clock.t += 100.0
        d.step(["a"], new, lens)
        assert d.stats()["policy_timed"] == 1


def test_a_forward_that_also_prefilled_is_not_timed():
    """Where the engine's forward processed more tokens than the rows verify (another request's
    prefill chunk rode along), its seconds are not the drafts' cost: it is not timed (a prefill token
    costs less than a verified one, so it would make drafts look cheap)."""
    clock = Clock()
    with Drafter(K, length_rule="fixed", min_match=1, clock=clock) as d:
        d.start("a", [1, 2, 3, 4] * 10)
        new, lens = np.array([[1] + [0] * K], np.int32), np.array([1], np.int32)
        batch = d.step(["a"], new, lens)
        verified = 1 + int(batch.lengths[0])
        assert verified > 1
        clock.t += 0.5
        d.step(["a"], new, lens, step_tokens=verified + 512)  # a prefill chunk in the same forward
        assert d.stats()["mixed_steps"] == 1
    clock = Clock()
    with Drafter(K, clock=clock) as d:
        d.start("a", [1, 2, 3, 4] * 10)
        batch = d.step(["a"], new, lens)
        verified = 1 + int(batch.lengths[0])
        clock.t += 0.5
        d.step(["a"], new, lens, step_tokens=verified)  # verification alone: timed
        assert d.stats()["policy_timed"] == 1 and d.stats()["mixed_steps"] == 0
        clock.t += 0.5
        before = d.stats()["policy_ignored_timings"]
        d.step(["a"], new, lens, step_tokens=4096)
        st = d.stats()
        assert st["policy_timed"] == 1 and st["mixed_steps"] == 1 and st["policy_ignored_timings"] == before + 1


def test_a_neural_drafter_is_chosen_where_the_automaton_has_nothing():
    """With a neural drafter on offer and free text (no match), rows take neural drafts; a row whose
    request capped its drafts at 0 takes none."""
    clock = Clock()
    with Drafter(K, device="cuda", clock=clock) as d:
        d.start("a", list(range(100, 140)))
        d.start("b", list(range(200, 240)), {"max_draft_tokens": 0})
        new = np.zeros((2, K + 1), np.int32)
        lens = np.ones(2, np.int32)
        out = None
        for step in range(5):
            new[:, 0] = (1000 + step, 2000 + step)
            out = d.step(["a", "b"], new, lens, neural_k=4)
            clock.t += 0.01
        assert out.sources[0] == 2 and out.lengths[0] > 0 and out.neural_k > 0
        assert out.sources[1] == NONE and out.lengths[1] == 0


def test_closed_drafter_refuses_calls():
    d = Drafter(K)
    d.close()
    d.close()
    with pytest.raises(RuntimeError, match="closed"):
        d.start("a", [1, 2])


def test_a_pool_kept_across_drafters():
    """A RequestPool given to successive drafters (an engine's successive calls) carries finished texts
    from one to the next, and stays open when they close."""
    from saspec import RequestPool

    prompts, outputs = copy_task(8, n=1)
    pool = RequestPool(100_000)
    try:
        with Drafter(K, length_rule="fixed", min_match=1, pool=pool) as d:
            run(d, prompts, outputs, batch=1)
        pool.flush(timeout=60)
        assert pool.stats()["added"] == 1 and not pool.closed
        with Drafter(K, length_rule="fixed", min_match=1, pool=pool) as d:
            again = run(d, {"x": [7, 7, 7]}, {"x": outputs["r0"]}, batch=1)
        assert again["x"]["accepted"] > len(outputs["r0"]) / 2
    finally:
        pool.close()
    with pytest.raises(ValueError, match="pool_tokens or pool"):
        Drafter(K, pool=RequestPool(10), pool_tokens=10)


def test_without_the_automaton_only_the_neural_drafter_drafts_and_its_first_read_is_charged_once():
    clock = Clock()
    with Drafter(K, device="cuda", automaton=False, clock=clock) as d:
        d.start("a", [1, 2, 3, 1, 2, 3, 1, 2])
        new, lens = np.array([[3] + [0] * K], np.int32), np.ones(1, np.int32)
        sources = []
        for _ in range(6):
            out = d.step(["a"], new, lens, neural_k=4, neural_behind=9)
            clock.t += 0.01
            sources.append(int(out.sources[0]))
            assert out.sources[0] != AUTOMATON
        assert 2 in sources and d.stats()["built"] + d.stats()["built_ahead"] == 0
        assert d._first(["a"], 9, None) == 0  # noqa: SLF001 (drafted once: later catch-ups are gaps)


def test_a_row_may_gain_more_than_k_plus_one_tokens_where_the_engine_says_so():
    with Drafter(4, length_rule="fixed", min_match=1, max_step_tokens=20) as d:
        d.start("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
        out = d.step(["a"], np.array([list(range(1, 13))], np.int32), np.array([12], np.int32))
        assert out.tokens.shape == (1, 4) and out.row(0) == [1, 2, 3, 4] and out.match[0] == 12
    with Drafter(4) as d, pytest.raises(ValueError, match="new_lens must be in"):
        d.start("a", [1, 2])
        d.step(["a"], np.zeros((1, 6), np.int32), np.array([6], np.int32))


def test_rows_with_drafting_off_are_counted_at_every_step():
    """``disabled_rows`` counts row-steps: a batch that stays the same counts its disabled rows each step."""
    with Drafter(K, length_rule="fixed", min_match=1) as d:
        d.start("off", [1, 2, 3, 1, 2], {"enabled": False})
        d.start("on", [1, 2, 3, 1, 2])
        new, lens = np.array([[3] + [0] * K] * 2, np.int32), np.array([1, 1], np.int32)
        for _ in range(3):
            d.step(["off", "on"], new, lens)
        assert d.stats()["disabled_rows"] == 3


def test_a_request_list_changed_in_place_is_a_new_batch():
    """The drafter keeps its own copy of the last step's rows: a caller that reuses its list and changes
    it between steps gets the new rows' options."""
    with Drafter(K, length_rule="fixed", min_match=1) as d:
        d.start("a", [1, 2, 3, 1, 2])
        d.start("capped", [1, 2, 3, 1, 2], {"max_draft_tokens": 1})
        rows = ["a"]
        new, lens = np.array([[3] + [0] * K], np.int32), np.array([1], np.int32)
        assert d.step(rows, new, lens).lengths[0] > 1
        rows[0] = "capped"
        out = d.step(rows, new, lens)
        assert out.row(0) == [1] and out.max_lengths[0] == 1


def test_a_refused_step_of_another_batch_leaves_the_last_batchs_options():
    """A step refused after reading a new batch's options (a length out of range) changes nothing: the
    next step of the last batch drafts under that batch's own options."""
    with Drafter(K, length_rule="fixed", min_match=1) as d:
        d.start("a", [1, 2, 3, 1, 2])
        d.start("capped", [1, 2, 3, 1, 2], {"max_draft_tokens": 1})
        lens = np.array([1], np.int32)
        d.step(["a"], np.array([[3] + [0] * K], np.int32), lens)
        with pytest.raises(ValueError, match="new_lens must be in"):
            d.step(["capped"], np.array([[3] + [0] * K], np.int32), np.array([K + 2], np.int32))
        out = d.step(["a"], np.array([[1] + [0] * K], np.int32), lens)
        assert out.max_lengths[0] == K and out.lengths[0] > 1


#: Drafter settings per length rule for tests that need drafts at every match: the policy on a GPU's
#: prior cost shape (flat: drafting nearly always pays), the fixed rules at any match.
DRAFTS_ALWAYS = {"fixed": {"length_rule": "fixed"}, "per-match": {"length_rule": "per-match"},
                 "policy": {"device": "cuda"}}


def _old_first_step(d: Drafter, rid, prompt) -> list[int]:
    """The first step's draft the way adapters had to get it: the prompt but its last token, then that
    token as the first step's new one."""
    d.start(rid, prompt[:-1])
    return d.step([rid], np.array([[prompt[-1]] + [0] * K], np.int32), np.array([1], np.int32)).row(0)


@pytest.mark.parametrize("rule", ["fixed", "policy"])
def test_a_request_started_before_its_prefill_drafts_from_its_whole_prompt_at_its_first_step(rule):
    """A request started ``before_prefill``: its first step hands over no tokens and drafts from the whole
    prompt, as the last token's own step did; a request started plainly drafts nothing at a step without
    tokens (a row in prefill)."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1, 2, 3, 4]
    with Drafter(K, min_match=1, **DRAFTS_ALWAYS[rule]) as d:
        d.start("a", prompt, before_prefill=True)
        out = d.step(["a"], np.zeros((1, 0), np.int32), np.array([0], np.int32))
        assert out.match[0] == 4 and out.sources[0] == AUTOMATON
        first = out.row(0)
        assert first and first == [5, 6, 7, 8, 9, 10, 11, 1][: len(first)]
        d.start("b", prompt)
        plain = d.step(["b"], np.zeros((1, K + 1), np.int32), np.array([0], np.int32))
        assert plain.lengths[0] == 0 and plain.match[0] == 0
    with Drafter(K, min_match=1, **DRAFTS_ALWAYS[rule]) as d:
        assert _old_first_step(d, "a", prompt) == first
    with Drafter(K, length_rule="fixed", min_match=1) as d:  # the next step continues from the whole prompt
        d.start("a", prompt, before_prefill=True)
        d.step(["a"], np.zeros((1, K + 1), np.int32), np.array([0], np.int32))
        out = d.step(["a"], np.array([[5, 6, 0, 0, 0, 0, 0, 0, 0]], np.int32), np.array([2], np.int32))
        assert out.match[0] == 6 and out.row(0) == [7, 8, 9, 10, 11, 1, 2, 3]


def test_a_request_started_before_its_prefill_pools_exactly_its_prompt_and_output():
    """The pool receives the request's text as the engine has it: prompt and output, no token twice or
    out of place (the pool keeps outputs alone by default: not the prompt's last token)."""
    from saspec import RequestPool

    prompts, outputs = copy_task(9, n=1)
    prompt, output = prompts["r0"], outputs["r0"]
    for keep_prompts in (False, True):
        pool = RequestPool(100_000, prompts=keep_prompts)
        try:
            with Drafter(K, length_rule="fixed", min_match=1, pool=pool) as d:
                d.start("a", prompt, before_prefill=True)
                new, fed = [], 0
                while fed < len(output):
                    batch = d.step(["a"], np.array([new + [0] * (K + 1 - len(new))], np.int32),
                                   np.array([len(new)], np.int32))
                    draft = batch.row(0)
                    a = 0
                    while a < len(draft) and fed + a < len(output) - 1 and draft[a] == output[fed + a]:
                        a += 1
                    new = output[fed: fed + a + 1]
                    fed += len(new)
                d.step(["a"], np.array([new + [0] * (K + 1 - len(new))], np.int32), np.array([len(new)], np.int32))
                d.finish("a")
            pool.flush(timeout=60)
            assert [t.tolist() for t in pool.texts()] == [(prompt if keep_prompts else []) + output]
            with Drafter(K, length_rule="fixed", min_match=1, pool=pool) as d:  # a first step drafts from the pool
                d.start("b", output[:10], before_prefill=True)
                out = d.step(["b"], np.zeros((1, 0), np.int32), np.array([0], np.int32))
                assert out.row(0) == output[10: 10 + K] and d.drafts.source[0] == 1
        finally:
            pool.close()


def test_a_neural_drafter_may_draft_at_the_first_step_before_the_prefill():
    """Without an automaton, a request started ``before_prefill`` is a live row at its first step: the
    neural drafter is on offer there (its first read, the prompt, charged)."""
    clock = Clock()
    with Drafter(K, device="cuda", automaton=False, clock=clock) as d:
        d.start("a", list(range(100, 140)), before_prefill=True)
        out = d.step(["a"], np.zeros((1, 0), np.int32), np.array([0], np.int32), neural_k=4, neural_behind=40)
        assert out.sources[0] == 2 and out.lengths[0] > 0 and out.max_lengths[0] == K
    with Drafter(K, device="cuda", automaton=False, clock=clock) as d:
        d.start("a", list(range(100, 140)))  # a row in prefill: nothing
        out = d.step(["a"], np.zeros((1, 0), np.int32), np.array([0], np.int32), neural_k=4, neural_behind=40)
        assert out.sources[0] == NONE and out.lengths[0] == 0


def test_before_prefill_is_checked_and_only_the_first_step_drafts_without_tokens():
    with Drafter(K, length_rule="fixed", min_match=1) as d:
        with pytest.raises(ValueError, match="before_prefill needs its prompt"):
            d.start("a", None, before_prefill=True)
        with pytest.raises(TypeError, match="before_prefill must be a bool"):
            d.start("a", [1, 2], before_prefill=1)
        assert "a" not in d
        d.start("a", [1, 2, 3, 1, 2], before_prefill=True)
        zero = (np.zeros((1, K + 1), np.int32), np.array([0], np.int32))
        assert d.step(["a"], *zero).row(0)[:3] == [3, 1, 2]
        d.start("b", [1, 2, 3, 1, 2])
        out = d.step(["a", "b"], np.zeros((2, K + 1), np.int32), np.zeros(2, np.int32))  # a new batch
        assert out.lengths.tolist() == [0, 0]  # "a" is past its first step: a step without tokens drafts nothing
        d.finish("a")
        d.start("a", [1, 2, 3, 1, 2], before_prefill=True)  # the id again, a new request
        d.finish("a")  # finished before its first step: forgotten
        d.start("a", [1, 2, 3, 1, 2])
        assert d.step(["a"], *zero).lengths[0] == 0


@pytest.mark.parametrize("rule", ["fixed", "per-match", "policy"])
def test_the_automaton_k_caps_automaton_drafts_within_k(rule):
    text = list(range(10, 40)) * 2
    clock = Clock()
    with Drafter(K, min_match=1, automaton_k=3, clock=clock, **DRAFTS_ALWAYS[rule]) as d:
        assert d.automaton_k == 3
        d.start("a", text[:40])
        new = np.zeros((1, K + 1), np.int32)
        pos, longest = 40, 0
        for _ in range(8):
            new[0, 0] = text[pos]
            out = d.step(["a"], new, np.array([1], np.int32))
            clock.t += 0.001
            assert out.lengths[0] <= 3 and len(out.row(0)) <= 3
            longest = max(longest, int(out.lengths[0]))
            pos += 1
        assert longest == 3
    for bad, error in ((0, ValueError), (K + 1, ValueError), (True, TypeError), (2.0, TypeError)):
        with pytest.raises(error, match="automaton_k"):
            Drafter(K, automaton_k=bad)


@pytest.mark.parametrize("rule", ["fixed", "policy"])
def test_max_draft_caps_one_steps_drafts(rule):
    """A step's ``max_draft`` (an int or per row) caps that step's drafts of either source within the
    request's own cap; the next step without it drafts as before."""
    text = list(range(10, 40)) * 2
    clock = Clock()
    with Drafter(K, min_match=1, clock=clock, **DRAFTS_ALWAYS[rule]) as d:
        d.start("a", text[:40])
        d.start("b", text[:40], {"max_draft_tokens": 1})
        new = np.zeros((2, K + 1), np.int32)
        lens = np.ones(2, np.int32)
        pos = 40
        for cap, want in ((2, [2, 1]), (np.array([0, 5], np.int32), [0, 1]), ([K, K], [K, 1]), (None, [K, 1])):
            new[:, 0] = text[pos]
            out = d.step(["a", "b"], new, lens, max_draft=cap)
            clock.t += 0.001
            pos += 1
            assert out.max_lengths.tolist() == want
            assert (out.lengths <= out.max_lengths).all()
        assert out.lengths[0] > 2  # uncapped again
    with Drafter(K, device="cuda", automaton=False, clock=clock) as d:  # the neural drafter's rows too
        d.start("a", list(range(100, 140)))
        new, lens = np.zeros((1, K + 1), np.int32), np.ones(1, np.int32)
        for step in range(5):
            new[0, 0] = 1000 + step
            out = d.step(["a"], new, lens, neural_k=6, max_draft=2)
            clock.t += 0.01
            assert out.lengths[0] <= 2 and out.max_lengths[0] == 2


@pytest.mark.parametrize("cap, error, text", [
    (-1, ValueError, "max_draft must be"),
    (True, TypeError, "max_draft must be"),
    (1.5, TypeError, "max_draft must hold integers"),
    ([1, -1], ValueError, "max_draft must be >= 0"),
    ([1, 2, 3], ValueError, "max_draft must have 1 dimension"),
])
def test_a_bad_max_draft_is_refused_and_changes_nothing(cap, error, text):
    with Drafter(K, length_rule="fixed", min_match=1) as d:
        d.start("a", [1, 2, 3, 1, 2])
        d.start("b", [1, 2, 3, 1, 2])
        new, lens = np.array([[3] + [0] * K] * 2, np.int32), np.array([1, 1], np.int32)
        with pytest.raises(error, match=text):
            d.step(["a", "b"], new, lens, max_draft=cap)
        out = d.step(["a", "b"], new, lens)  # nothing appended: both continue where they were
        assert out.match.tolist() == [3, 3] and out.row(0)[:3] == [1, 2, 3]
