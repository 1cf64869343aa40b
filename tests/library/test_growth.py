"""Growth ahead of need: a nearly full blob is grown on a background thread, not inside a
step, and the automaton (so every match and draft) is the one a step's own growth makes."""

from __future__ import annotations

import numpy as np
import pytest

from saspec import NgramDrafter, SpecEngine, SuffixAutomaton, build

from test_engine import reference_draft, step_arrays

K = 5


@pytest.mark.parametrize("policy", ["near-first", "recent"])
def test_nearly_full_blobs_grow_ahead_and_no_step_grows_one(policy):
    rng = np.random.default_rng(3)
    b = 8
    prompts = [rng.integers(0, 6, int(rng.integers(50, 400))) for _ in range(b)]
    eng = SpecEngine(policy=policy)
    kind, grown_in_steps = eng._backend.kind, []
    real_grow = kind.grow
    kind.grow = lambda *a: grown_in_steps.append(1) or real_grow(*a)  # what a step calls for a full blob
    refs = [SuffixAutomaton(p, policy=policy) for p in prompts]
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
