"""Failed builds and growths, injected through ``SpecEngine(faults=...)``: each is counted and logged
once, the row is retried (on the growth thread at a later step, or inside a step within its copy
budget) and drafts again what a fresh automaton of its text drafts, the fast path comes back once every
row is healthy, and a failed ``add_request`` leaves the engine as it was. Plus a soak: random arrivals,
finishes and failures over many steps, after which the engine holds nothing."""

from __future__ import annotations

import logging
import threading
from collections import Counter

import numpy as np
import pytest

from saspec import SpecEngine, SuffixAutomaton
from saspec.host import EMPTY_BLOB

import oracle
from test_engine import reference_draft, step_arrays

K = 5


class Faults:
    """The engine's fault hook: fails the next ``fail[kind]`` allocations of each kind, every one of the
    kinds in ``always``, and at random those of ``rates`` (``seed``); counts what it was asked and failed.

    It also holds the growth thread where the engine asks it about a growth ahead (before the thread
    builds anything, without the engine's lock) while ``gate`` is clear: ``turn`` lets it run."""

    def __init__(self, seed: int = 0, rates: dict | None = None, **fail: int) -> None:
        self.fail, self.always, self.rates = dict(fail), set(), dict(rates or {})
        self.asked, self.failed = Counter(), Counter()
        self.gate = threading.Event()
        self.gate.set()
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()  # asked from the growth thread too

    def turn(self, eng: SpecEngine, hold: bool = True) -> None:
        """The growth thread's turn: every growth handed to it so far runs; ``hold``: then held again."""
        self.gate.set()
        eng._backend.wait_growth()
        if hold:
            self.gate.clear()

    def should_fail(self, kind: str) -> bool:
        if kind == "grow_ahead":
            self.gate.wait()
        with self._lock:
            self.asked[kind] += 1
            fail = kind in self.always or self.fail.get(kind, 0) > 0 or self._rng.random() < self.rates.get(kind, 0)
            if fail:
                self.fail[kind] = self.fail.get(kind, 0) - 1
                self.failed[kind] += 1
            return fail

    def off(self) -> None:
        with self._lock:
            self.fail, self.always, self.rates = {}, set(), {}

    @property
    def growths_failed(self) -> int:
        return self.failed["grow_ahead"] + self.failed["grow_in_step"]


def growth_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("saspec") and "grow" in r.getMessage()]


def parked(eng: SpecEngine, rid) -> bool:
    return eng._slot[rid] in eng._backend.slots.parked


def check_row(eng, rid, text, mout_r, dout_r, was_parked: bool, fresh: bool = True) -> bool:
    """Row ``rid`` holds ``text`` and drafted what a fresh automaton of it drafts, or nothing where it
    ``was_parked`` after its step. Returns ``was_parked``."""
    assert eng.automaton_len(rid) == len(text)
    if was_parked:
        assert mout_r == 0 and (dout_r == -1).all()
        return True
    if fresh:
        ref = SuffixAutomaton(text)
        assert mout_r == ref.match()[0] and dout_r.tolist() == reference_draft(ref, K), rid
    return False


def run_steps(eng, faults, texts, rng, steps, vocab=5, lens=(K + 1, K + 2)):
    """``steps`` steps of every request in ``texts`` (random tokens, ``lens`` a range of accepted
    lengths: by default every row K + 1), the growth thread held during each and given its turn after
    it, and each row checked against a fresh automaton. Returns the parked rows of each step."""
    ids = list(texts)
    eng.prepare(ids)
    acc, n, mout, dout = step_arrays(len(ids))
    out = []
    faults.turn(eng)
    for _ in range(steps):
        n[:] = rng.integers(*lens, len(ids))
        acc[:] = rng.integers(0, vocab, acc.shape)
        eng.extend(acc, n, mout, dout)
        was = [parked(eng, rid) for rid in ids]  # the growth thread is held: what the step left
        for i, rid in enumerate(ids):
            texts[rid] += acc[i, : n[i]].tolist()
        faults.turn(eng)
        out.append([rid for i, rid in enumerate(ids) if check_row(eng, rid, texts[rid], mout[i], dout[i], was[i])])
    faults.gate.set()
    return out


def test_faults_must_have_should_fail():
    with pytest.raises(TypeError, match="faults"):
        SpecEngine(faults=object())


def test_a_failed_growth_ahead_is_counted_logged_once_and_retried_at_the_next_step(caplog):
    """The growth thread's failure is retried by the thread at the next step, before the row fills up:
    no step has to grow the blob itself."""
    caplog.set_level(logging.WARNING, logger="saspec")
    rng = np.random.default_rng(1)
    faults = Faults(grow_ahead=1)
    eng = SpecEngine(faults=faults)
    texts = {"r": rng.integers(0, 5, 300).tolist()}
    eng.add_request("r", texts["r"])
    cap = eng._blob_copies()["r"].shape[0]
    run_steps(eng, faults, texts, rng, 60)
    st = eng.stats()
    assert faults.failed["grow_ahead"] == 1 and faults.asked["grow_ahead"] >= 2
    assert st["growth_failures"] == 1 and len(growth_warnings(caplog)) == 1
    assert st["grown_ahead"] >= 1 and st["grown_in_step"] == 0 and st["parked"] == 0
    assert eng._blob_copies()["r"].shape[0] > cap


def test_a_row_parked_by_failed_growths_drafts_again_and_the_fast_path_returns(caplog):
    """With no copy budget the full row parks while its growths keep failing; once one succeeds it
    drafts what a fresh automaton drafts (the brute-force oracle's match too), no row is parked and
    steps take the fast path again."""
    caplog.set_level(logging.WARNING, logger="saspec")
    rng = np.random.default_rng(2)
    faults = Faults(grow_ahead=20)
    eng = SpecEngine(faults=faults)
    eng._backend.step_growth_words = 0  # every full row parks
    texts = {"r": rng.integers(0, 4, 250).tolist()}
    eng.add_request("r", texts["r"])
    parked_steps = run_steps(eng, faults, texts, rng, 90)
    assert any(parked_steps), "the row never parked"
    assert parked_steps[-10:] == [[]] * 10
    st = eng.stats()
    assert st["growth_failures"] == 20 == faults.failed["grow_ahead"] and len(growth_warnings(caplog)) == 20
    assert st["parked_now"] == 0 and st["grown_ahead"] >= 1
    slow = st["slow_steps"]
    assert slow > 0  # the parked steps took the checked path
    run_steps(eng, faults, texts, rng, 20)
    assert eng.stats()["slow_steps"] == slow  # ...and no step does any more
    eng.prepare(["r"])
    acc, lens, mout, dout = step_arrays(1)
    eng.extend(acc, lens, mout, dout)  # an empty step: the row's outputs for its whole text
    text = texts["r"]
    m = oracle.matches(text)[-1][0]
    start = oracle.near_starts(text, "first")[-1]
    assert mout[0] == m and dout[0].tolist() == oracle.draft(text, len(text), start, K)


def test_one_failed_growth_does_not_stop_the_others_handed_over_with_it():
    """Rows that fill up together go to the growth thread together: one failure among them is
    retried, and every other row of that hand-over is grown at once."""
    rng = np.random.default_rng(3)
    faults = Faults(grow_ahead=1)
    eng = SpecEngine(faults=faults)
    b = 6
    prompt = rng.integers(0, 5, 600).tolist()
    texts = {i: list(prompt) for i in range(b)}
    for i in range(b):
        eng.add_request(i, prompt)
    eng.prepare(list(range(b)))
    acc, lens, mout, dout = step_arrays(b)
    lens[:] = K + 1
    for step in range(100):
        acc[:] = rng.integers(0, 5, K + 1)  # every row the same tokens: all are marked in one step
        eng.extend(acc, lens, mout, dout)
        for i in range(b):
            texts[i] += acc[i].tolist()
        eng._backend.wait_growth()
        if faults.asked["grow_ahead"]:
            break
    assert faults.asked["grow_ahead"] == b and faults.failed["grow_ahead"] == 1
    assert eng.stats()["grown_ahead"] == b - 1
    run_steps(eng, faults, texts, rng, 3)
    assert eng.stats()["grown_ahead"] == b and eng.stats()["growth_failures"] == 1


def test_a_failed_growth_inside_a_step_parks_the_row_instead_of_raising(caplog):
    """A full blob the step cannot grow (its growth ahead failing too) is parked, its tokens kept,
    and the step completes for every row; the row drafts again once a growth succeeds."""
    caplog.set_level(logging.WARNING, logger="saspec")
    rng = np.random.default_rng(4)
    faults = Faults()
    faults.always = {"grow_ahead", "grow_in_step"}
    eng = SpecEngine(faults=faults)
    texts = {"full": rng.integers(0, 5, 300).tolist(), "other": rng.integers(0, 5, 2000).tolist()}
    eng.add_request("full", texts["full"])
    eng.add_request("other", texts["other"], expected_new_tokens=1000)  # room throughout
    parked_steps = run_steps(eng, faults, texts, rng, 100)  # "full" fills up
    assert ["full"] in parked_steps and all(p in ([], ["full"]) for p in parked_steps)
    assert faults.failed["grow_in_step"] >= 1
    faults.off()
    parked_steps = run_steps(eng, faults, texts, rng, 5)
    assert parked_steps[-1] == []
    st = eng.stats()
    assert st["growth_failures"] == faults.growths_failed and len(growth_warnings(caplog)) == faults.growths_failed


def test_repeated_failures_leave_the_other_rows_drafting():
    """Rows of several lengths under a small copy budget, every growth failing for a while: rows
    that have room keep drafting their fresh automata's drafts, full ones park, and all recover."""
    rng = np.random.default_rng(5)
    faults = Faults()
    eng = SpecEngine(faults=faults)
    texts = {i: rng.integers(0, 5, int(n)).tolist() for i, n in enumerate([100, 300, 600, 1200, 2400, 4000])}
    for rid, text in texts.items():
        eng.add_request(rid, text)
    eng._backend.step_growth_words = eng._blob_copies()[2].shape[0]  # the three smaller rows' copies fit
    faults.always = {"grow_ahead", "grow_in_step"}
    during = run_steps(eng, faults, texts, rng, 120)
    assert any(during) and faults.growths_failed > 0
    assert not all(len(p) == len(texts) for p in during)  # some row drafted at every step
    faults.off()
    after = run_steps(eng, faults, texts, rng, 10)
    assert after[-1] == []
    st = eng.stats()
    assert st["parked_now"] == 0 and st["growth_failures"] == faults.growths_failed
    slow = st["slow_steps"]
    run_steps(eng, faults, texts, rng, 5)
    assert eng.stats()["slow_steps"] == slow


def test_add_request_whose_build_fails_changes_nothing():
    rng = np.random.default_rng(6)
    faults = Faults()
    eng = SpecEngine(faults=faults)
    texts = {"a": rng.integers(0, 5, 200).tolist()}
    eng.add_request("a", texts["a"])
    eng.prepare(["a"])
    before = eng._blob_copies(), eng.stats(), eng.batch
    prompt = rng.integers(0, 5, 500).tolist()
    faults.fail["build"] = 1
    with pytest.raises(MemoryError):
        eng.add_request("b", prompt)
    assert "b" not in eng and len(eng) == 1 and faults.failed["build"] == 1
    blobs, stats, batch = before
    assert eng.stats() == stats and eng.batch == batch and list(eng._blob_copies()) == list(blobs)
    assert np.array_equal(eng._blob_copies()["a"], blobs["a"])
    with pytest.raises(KeyError):
        eng.prepare(["a", "b"])
    assert eng.add_request("b", prompt)  # the id is free again
    texts["b"] = prompt
    run_steps(eng, faults, texts, rng, 5)


def soak(steps: int, seed: int, caplog) -> None:
    """``steps`` steps through one engine with builds failing at random (one in five) and growths too
    (one in three), requests arriving and finishing at random, random sub-batches and copy budgets.
    Stretches of 500 steps alternate between a growth thread held and let run at random steps
    (deterministic: each row drafts, on sampled steps, what a fresh automaton of its text drafts, or
    nothing while parked) and one running freely beside the steps (each row drafts that or nothing).
    Every row holds its text throughout; once the failures stop no row stays parked and steps take the
    fast path; with every request removed the engine holds no request, token or byte, every slot is
    free, nothing is parked, and no finished request is listed."""
    caplog.set_level(logging.WARNING, logger="saspec")
    rng = np.random.default_rng(seed)
    faults = Faults(seed, rates={"build": 0.2, "grow_ahead": 1 / 3, "grow_in_step": 1 / 3})
    eng = SpecEngine(faults=faults)
    backend = eng._backend
    texts: dict[int, list[int]] = {}
    finished: list[int] = []
    next_id, build_failures, parked_row_steps, row_steps = 0, 0, 0, 0
    held = False  # the first stretch holds it
    for step in range(steps):
        if step % 500 == 0:
            backend.step_growth_words = int(rng.choice([0, 20_000, 1 << 18]))  # none, a small blob's, the default
            held = not held
            faults.turn(eng, hold=held)
        if len(texts) < 8 and rng.random() < 0.1:
            prompt = rng.integers(0, 6, int(rng.integers(1, 400))).tolist()
            hint = [None, int(rng.integers(0, 200))][int(rng.integers(2))]
            try:
                eng.add_request(next_id, prompt, expected_new_tokens=hint)
                texts[next_id] = prompt
                next_id += 1
            except MemoryError:
                build_failures += 1
                assert next_id not in eng  # the id is tried again at a later arrival
        if texts and rng.random() < 1 / 80:
            rid = list(texts)[int(rng.integers(len(texts)))]
            eng.remove_request(rid)
            del texts[rid]
            finished.append(rid)
            assert rid not in eng
        if not texts:
            continue
        ids = [r for r in texts if rng.random() < 0.8] or [next(iter(texts))]
        eng.prepare(ids)
        acc, lens, mout, dout = step_arrays(len(ids))
        lens[:] = rng.integers(0, K + 2, len(ids))
        acc[:] = rng.integers(0, 6, acc.shape)
        eng.extend(acc, lens, mout, dout)
        was = [parked(eng, rid) for rid in ids]
        sampled = rng.random() < 0.1
        for i, rid in enumerate(ids):
            texts[rid] += acc[i, : lens[i]].tolist()
            if held:
                parked_row_steps += check_row(eng, rid, texts[rid], mout[i], dout[i], was[i], fresh=sampled)
            else:  # the thread may have grown a row since the step: the row drafted nothing, or right
                nothing = mout[i] == 0 and (dout[i] == -1).all()
                check_row(eng, rid, texts[rid], mout[i], dout[i], nothing and sampled, fresh=sampled)
        row_steps += len(ids)
        if sampled:  # requests listed: exactly the live ones
            st = eng.stats()
            assert len(eng) == st["requests"] == len(texts) and st["tokens"] == sum(map(len, texts.values()))
        if held and rng.random() < 0.3:
            faults.turn(eng)
    assert build_failures == faults.failed["build"] > 0 and faults.growths_failed > 0
    assert 0 < parked_row_steps < row_steps
    faults.off()
    faults.turn(eng, hold=False)
    if texts:
        parked_after = run_steps(eng, faults, texts, rng, 10, vocab=6, lens=(0, 2))
        assert parked_after[-1] == []
        slow = eng.stats()["slow_steps"]
        run_steps(eng, faults, texts, rng, 3, vocab=6, lens=(0, 2))
        assert eng.stats()["slow_steps"] == slow  # every step on the fast path again
    st = eng.stats()
    assert st["growth_failures"] == faults.growths_failed == len(growth_warnings(caplog))
    assert st["parked_now"] == 0
    for rid in list(texts):
        eng.remove_request(rid)
        finished.append(rid)
    backend.wait_growth()
    st = eng.stats()
    assert len(eng) == 0 and st["requests"] == st["tokens"] == st["bytes"] == st["parked_now"] == 0
    assert st["free_slots"] == st["slots"] > 0
    assert not backend.slots.parked and all(b is EMPTY_BLOB for b in backend.slots.blobs)
    for rid in finished:
        assert rid not in eng
        with pytest.raises(KeyError):
            eng.prepare([rid])
    assert backend.slots.arena.used_bytes == 0  # every blob's memory went back to the arena


def test_soak_with_failures_injected_at_random(caplog):
    soak(1500, 11, caplog)


@pytest.mark.slow
def test_long_soak_with_failures_injected_at_random(caplog):
    soak(10_000, 12, caplog)
