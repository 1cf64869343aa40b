"""Host memory per request: small for short requests, bounded for long ones,
and growth by geometric re-allocation (amortized O(1) per token)."""

from __future__ import annotations

import numpy as np
import pytest

from saspec import SpecEngine
from saspec.evidence.bench import code_like_prompt, random_prompt


def bytes_per_token(prompt):
    eng = SpecEngine()
    eng.add_request("r", prompt)
    st = eng.stats()
    assert st["tokens"] == len(prompt)
    return st["bytes"] / st["tokens"]


@pytest.mark.parametrize("make", [random_prompt, code_like_prompt])
def test_short_request_holds_at_most_120_bytes_per_token(make):
    assert bytes_per_token(make(500)) <= 120


@pytest.mark.parametrize("make", [random_prompt, code_like_prompt])
def test_long_request_holds_at_most_100_bytes_per_token(make):
    assert bytes_per_token(make(200_000)) <= 100


def test_decoding_grows_geometrically():
    """3 tokens per step from 500 to 15,500 tokens: each blob re-allocation
    copies the automaton, so the sizes must grow geometrically (their sum, the
    words ever copied, stays within a constant factor of the final size)."""
    rng = np.random.default_rng(0)
    eng = SpecEngine()
    eng.add_request("r", code_like_prompt(500))
    eng.prepare(["r"])
    acc = np.zeros((1, 9), np.int32)
    lens = np.array([3], np.int32)
    match = np.zeros(1, np.int32)
    draft = np.zeros((1, 8), np.int32)
    sizes = [eng.stats()["bytes"]]
    for _ in range(5000):
        acc[0, :3] = rng.integers(0, 5000, 3)  # random tokens: the most states and edges per token
        eng.extend(acc, lens, match, draft)
        b = eng.stats()["bytes"]
        if b != sizes[-1]:
            sizes.append(b)
    st = eng.stats()
    assert st["tokens"] == 15_500
    assert st["bytes"] / st["tokens"] <= 120
    assert len(sizes) <= 12 and sum(sizes) <= 4 * sizes[-1]
    assert all(b > a for a, b in zip(sizes, sizes[1:]))
