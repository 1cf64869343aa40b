"""Growth ahead of need: a nearly full blob is grown on a background thread, not inside a
step, and the automaton (so every match and draft) is the one a step's own growth makes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from saspec import NgramDrafter, SpecEngine, SuffixAutomaton, build

from test_engine import reference_draft, step_arrays

K = 5


@pytest.mark.parametrize("occurrence", ["near-first", "recent"])
def test_nearly_full_blobs_grow_ahead_and_no_step_grows_one(occurrence):
    rng = np.random.default_rng(3)
    b = 8
    prompts = [rng.integers(0, 6, int(rng.integers(50, 400))) for _ in range(b)]
    eng = SpecEngine(occurrence=occurrence)
    kind, grown_in_steps = eng._backend.kind, []
    real_grow = kind.grow
    kind.grow = lambda *a: grown_in_steps.append(1) or real_grow(*a)  # what a step calls for a full blob
    refs = [SuffixAutomaton(p, occurrence=occurrence) for p in prompts]
    for i, p in enumerate(prompts):
        eng.add_request(i, p)
    eng.prepare(list(range(b)))
    caps = [int(eng._blob_copies()[i][build.core.H_CAP_TOK]) for i in range(b)]
    acc, lens, mout, dout = step_arrays(b)
    for _ in range(400):
        lens[:] = rng.integers(0, K + 2, b)
        acc[:] = rng.integers(0, 6, acc.shape)
        eng.extend(acc, lens, mout, dout)
        eng._backend.wait_growth()  # the background thread's turn: deterministic
        for i in range(b):
            refs[i].extend(acc[i, : lens[i]])
            assert mout[i] == refs[i].match()[0] and dout[i].tolist() == reference_draft(refs[i], K)
    assert grown_in_steps == [], "a step grew a blob"
    assert eng._backend.grown_ahead >= b and eng._backend.grown_in_step == 0
    assert all(eng.automaton_len(i) > caps[i] for i in range(b))  # every row outgrew its first blob


def test_expected_tokens_are_never_grown_ahead():
    """A request whose hint covers its tokens keeps its one blob to the end."""
    eng = SpecEngine()
    eng.add_request("r", np.arange(300) % 9, expected_new_tokens=400)
    eng.prepare(["r"])
    acc, lens, mout, dout = step_arrays(1)
    lens[0] = 4
    for i in range(100):
        acc[0, :4] = (np.arange(4) + i) % 9
        eng.extend(acc, lens, mout, dout)
        eng._backend.wait_growth()
    assert eng._backend.grown_ahead == 0 and eng._backend.grown_in_step == 0 and eng.automaton_len("r") == 700


def test_ngram_blobs_still_grow_inside_the_step():
    eng = NgramDrafter()
    eng.add_request("r", [1, 2, 3])
    eng.prepare(["r"])
    acc, lens, mout, dout = step_arrays(1)
    lens[0] = K + 1
    for _ in range(100):
        eng.extend(acc, lens, mout, dout)
    assert eng.automaton_len("r") == 3 + 100 * (K + 1) and eng._backend.grown_in_step > 0


class _HeldGrowth:
    """Holds an engine's background growth until ``release``: ``where`` "start" holds it before
    it reads a blob, "swap" after it built the grown blob and before it swaps it in."""

    def __init__(self, eng, where):
        self.gate = threading.Event()
        growth, kind = eng._backend.growth, eng._backend.kind
        if where == "start":
            real = growth.grow_slot
            growth.grow_slot = lambda slot: self.gate.wait() and real(slot)
        else:
            real = kind.build
            kind.build = lambda *a: self.wait_then(real(*a))

    def wait_then(self, value):
        self.gate.wait()
        return value

    def release(self):
        self.gate.set()


def _copying(eng):
    """Wrap the engine's in-step growth: returns the list of words copied, one entry per grow."""
    kind, copied = eng._backend.kind, []
    real = kind.grow
    kind.grow = lambda blob, *a: copied.append(blob.shape[0]) or real(blob, *a)
    return copied


def _filling_batch(rng, b, where):
    """``b`` rows of one 600-token prompt length (they fill up in the same step), a budget of two rows'
    copies a step, the growth thread held at ``where``: (engine, reference automata, hold, copies)."""
    prompts = [rng.integers(0, 5, 600) for _ in range(b)]
    eng = SpecEngine()
    for i, p in enumerate(prompts):
        eng.add_request(i, p)
    eng.prepare(list(range(b)))
    eng._backend.step_growth_words = 2 * eng._blob_copies()[0].shape[0] + 1
    return eng, [SuffixAutomaton(p) for p in prompts], _HeldGrowth(eng, where), _copying(eng)


def _check_rows(eng, refs, mout, dout, rows):
    """Rows not parked match their reference automata; parked rows draft nothing. Returns the parked rows."""
    parked = []
    for i in rows:
        assert eng.automaton_len(i) == len(refs[i])  # parked tokens count
        if mout[i] == 0 and (dout[i] == -1).all() and refs[i].match()[0] > 0:
            parked.append(i)
            continue
        assert mout[i] == refs[i].match()[0] and dout[i].tolist() == reference_draft(refs[i], K)
    return parked


@pytest.mark.parametrize("where", ["start", "swap"])
def test_a_step_copies_at_most_its_budget_and_parks_the_other_full_rows(where):
    """Back to back, with the background thread held: every step's in-step copies stay
    within ``step_growth_words``, rows past it are parked (match 0, no draft, their tokens
    kept), and once the thread runs every row is the reference automaton again."""
    rng = np.random.default_rng(5)
    b = 12
    eng, refs, held, copied = _filling_batch(rng, b, where)
    acc, lens, mout, dout = step_arrays(b)
    parked_seen = set()
    for step in range(80):
        if step == 60:
            held.release()
            eng._backend.wait_growth()
        lens[:] = K + 1  # rows of one prompt length fill up in the same step
        acc[:] = rng.integers(0, 5, acc.shape)
        before = len(copied)
        eng.extend(acc, lens, mout, dout)
        assert sum(copied[before:]) <= eng._backend.step_growth_words
        for i in range(b):
            refs[i].extend(acc[i, : lens[i]])
        parked = _check_rows(eng, refs, mout, dout, range(b))
        parked_seen.update(parked)
        if step > 60:
            assert parked == []
    assert len(parked_seen) >= b - 4 and eng.stats()["parked"] >= len(parked_seen)
    eng._backend.wait_growth()
    for i in range(b):  # the whole text, parked tokens included, reaches the pool
        text = eng._backend.text(i, eng._slot[i])
        assert text.tolist() == refs[i].tokens.tolist()


def test_a_catch_up_larger_than_the_grown_blob_parks_the_rest_and_grows_again():
    """Tokens parked while the grown blob was built may not fit it: the swap appends what
    fits (no copy under the lock), parks the rest and grows again, and nothing is lost."""
    rng = np.random.default_rng(6)
    prompt = rng.integers(0, 4, 300)
    ref = SuffixAutomaton(prompt)
    eng = SpecEngine()
    eng.add_request("r", prompt)
    eng.prepare(["r"])
    eng._backend.step_growth_words = 0  # every full row is parked
    held = _HeldGrowth(eng, "swap")
    acc, lens, mout, dout = step_arrays(1)
    lens[0] = K + 1
    for step in range(400):  # hundreds of tokens parked behind a blob built for the prompt's text
        acc[0] = rng.integers(0, 4, K + 1)
        eng.extend(acc, lens, mout, dout)
        ref.extend(acc[0])
        assert eng.automaton_len("r") == len(ref)
    assert eng.stats()["parked"] >= 1
    grown = eng._backend.grown_ahead
    held.release()
    eng._backend.wait_growth()
    assert eng._backend.grown_ahead >= grown + 2  # the first swap could not take every parked token
    assert "r" not in [r for r, s in eng._slot.items() if s in eng._backend.slots.parked]
    lens[0] = 1
    acc[0, 0] = 2
    eng.extend(acc, lens, mout, dout)
    ref.extend(acc[0, :1])
    assert mout[0] == ref.match()[0] and dout[0].tolist() == reference_draft(ref, K)


def test_a_parked_rows_tokens_count_toward_the_token_limit():
    """The limit check counts a parked row's waiting tokens, and a rejected call changes nothing."""
    from saspec import extend as kx

    eng = SpecEngine()
    eng.add_request("r", np.arange(300) % 7)
    eng.prepare(["r"])
    eng._backend.step_growth_words = 0
    held = _HeldGrowth(eng, "start")
    acc, lens, mout, dout = step_arrays(1)
    lens[0] = K + 1
    for _ in range(200):
        if eng._backend.slots.parked:
            break
        eng.extend(acc, lens, mout, dout)
    assert eng._backend.slots.parked, "the full row was not parked"
    eng.extend(acc, lens, mout, dout)  # some tokens wait now
    total = eng.automaton_len("r")
    assert eng._backend.slots.parked[eng._slot["r"]].shape[0] > 0
    eng._backend._ctl[kx.C_LIMIT] = total + K  # the blob's own count plus K + 1 would pass
    before = eng._backend.text("r", eng._slot["r"])
    with pytest.raises(ValueError, match="would hold"):
        eng.extend(acc, lens, mout, dout)
    assert eng._backend.text("r", eng._slot["r"]).tolist() == before.tolist()
    held.release()


def test_steps_drain_parked_rows_within_their_budget_while_the_thread_is_busy():
    """With the background thread held throughout, the steps themselves grow the parked rows,
    earliest first, a budget's worth a step: every row drafts again within a few steps."""
    rng = np.random.default_rng(7)
    b = 12
    eng, refs, held, copied = _filling_batch(rng, b, "start")
    acc, lens, mout, dout = step_arrays(b)
    lens[:] = K + 1
    parked_per_step = []
    for _ in range(60):
        acc[:] = rng.integers(0, 5, acc.shape)
        before = len(copied)
        eng.extend(acc, lens, mout, dout)
        assert sum(copied[before:]) <= eng._backend.step_growth_words
        for i in range(b):
            refs[i].extend(acc[i])
        parked_per_step.append(len(_check_rows(eng, refs, mout, dout, range(b))))
    first = next(i for i, n in enumerate(parked_per_step) if n)
    assert max(parked_per_step) >= b - 4  # most rows parked at once...
    drained = parked_per_step[first + b // 2 + 2:]  # ...then two drained a step
    assert drained == [0] * len(drained)
    assert eng._backend.grown_ahead == 0  # the thread did none of it
    held.release()


@pytest.mark.parametrize("budget", [0, 20_000])
def test_requests_come_and_go_while_rows_are_parked(budget):
    """Random arrivals, removals (to a pool) and steps with a small copy budget, the growth thread let run
    only at random steps (so that rows fill up and park whatever this machine's speed): a row that drafts
    drafts what a fresh automaton of its text drafts, a parked row drafts nothing, and every removed
    request's whole text, parked tokens included, reaches the pool."""
    from saspec import RequestPool

    rng = np.random.default_rng(budget)
    pool = RequestPool(1 << 20, prompts=True, manual=True)  # whole texts, prompts included
    eng = SpecEngine(pool=pool)
    eng._backend.step_growth_words = budget
    held = _HeldGrowth(eng, "start")
    texts, next_id, pooled = {}, 0, []
    for step in range(300):
        if len(texts) < 6 and rng.random() < 0.3:
            texts[next_id] = rng.integers(0, 4, int(rng.integers(1, 300))).tolist()
            eng.add_request(next_id, texts[next_id])
            next_id += 1
        if texts and rng.random() < 0.05:
            rid = list(texts)[int(rng.integers(len(texts)))]
            eng.remove_request(rid)
            pooled.append(texts.pop(rid))
        if not texts:
            continue
        ids = list(texts)
        eng.prepare(ids)
        b = len(ids)
        acc, lens, mout, dout = step_arrays(b)
        lens[:] = rng.integers(0, K + 2, b)
        acc[:] = rng.integers(0, 4, acc.shape)
        eng.extend(acc, lens, mout, dout, np.zeros(b, np.int32))
        for i, rid in enumerate(ids):
            texts[rid] += acc[i, : lens[i]].tolist()
            assert eng.automaton_len(rid) == len(texts[rid])
            if eng._slot[rid] in eng._backend.slots.parked:
                assert mout[i] == 0 and (dout[i] == -1).all()
            else:  # the pool is published only at the end: every draft is the row's own
                ref = SuffixAutomaton(texts[rid])
                assert mout[i] == ref.match()[0] and dout[i].tolist() == reference_draft(ref, K), (step, rid)
        if rng.random() < 0.1:  # the thread's turn: every growth handed to it so far
            held.release()
            eng._backend.wait_growth()
            held.gate.clear()
    held.release()
    for rid in list(texts):
        eng.remove_request(rid)
        pooled.append(texts.pop(rid))
    pool.publish()
    pool.flush()
    pool.publish()
    assert sorted(t.tolist() for t in pool.texts()) == sorted(pooled)
    assert budget or eng.stats()["parked"] > 0
    pool.close()
