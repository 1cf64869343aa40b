"""The llama.cpp loop's sampler takes what llama-cpp-python takes (no llama.cpp needed): ``seed=-1``
is llama.cpp's "random seed" and every other int its ``uint32`` seed, ``repeat_penalty=0`` makes
recent tokens with a positive logit infinitely likely as llama.cpp's division does (greedy takes
the first of them, as llama.cpp's greedy sampler does; sampling draws among them), and what is
still refused names the parameter."""

from __future__ import annotations

import numpy as np
import pytest

from saspec.integrations.llama_cpp.loop import LLAMA_DEFAULT_SEED, Sampler

VOCAB = 50


def llama_cpp_greedy(logits: np.ndarray, recent: list[int], repeat: float, last_n: int) -> int:
    """llama.cpp's penalties sampler then its greedy sampler, written out token by token (float32)."""
    z = logits.astype(np.float32).copy()
    seen = set(recent[-last_n:]) if last_n else set()
    with np.errstate(divide="ignore"):
        for t in seen:
            z[t] = z[t] * np.float32(repeat) if z[t] <= 0 else z[t] / np.float32(repeat)
    best = 0
    for i in range(1, z.size):  # llama_sampler_greedy_apply: the first strictly larger logit wins
        if z[i] > z[best]:
            best = i
    return best


def draws(s: Sampler, n: int = 8) -> list[int]:
    return s.rng.integers(0, 2**62, n).tolist()


def test_seed_minus_one_is_a_random_seed():
    a, b = Sampler(temperature=0.7, seed=-1), Sampler(temperature=0.7, seed=-1)
    assert draws(a) != draws(b)  # fresh entropy each, as llama.cpp's LLAMA_DEFAULT_SEED
    assert draws(Sampler(seed=LLAMA_DEFAULT_SEED)) != draws(Sampler(seed=LLAMA_DEFAULT_SEED))


@pytest.mark.parametrize("other", [5 + 2**32, 5 - 2**32, np.int64(5), np.uint32(5)])
def test_an_int_seed_is_llama_cpps_uint32(other):
    assert draws(Sampler(seed=5)) == draws(Sampler(seed=other))


@pytest.mark.parametrize("bad", [1.5, "7", True, [1]])
def test_a_seed_that_is_not_an_int_is_named(bad):
    with pytest.raises(TypeError, match="seed must be None or an int"):
        Sampler(seed=bad)


@pytest.mark.parametrize("seed", range(20))
def test_repeat_penalty_zero_greedy_picks_what_llama_cpp_picks(seed):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal(VOCAB).astype(np.float32)
    recent = rng.integers(0, VOCAB, int(rng.integers(0, 12))).tolist()
    s = Sampler(temperature=0.0, repeat_penalty=0.0, penalty_last_n=8)
    assert s.first(logits, recent) == llama_cpp_greedy(logits, recent, 0.0, 8)
    draft = [int(rng.integers(0, VOCAB))]
    rows = np.stack([logits, rng.standard_normal(VOCAB).astype(np.float32)])
    out = s.verify(rows, draft, recent)
    assert out[0] == llama_cpp_greedy(logits, recent, 0.0, 8)


def test_repeat_penalty_zero_sampling_draws_among_the_recent_positive_tokens():
    logits = np.full(VOCAB, -1.0, np.float32)
    logits[[3, 7, 9]] = [2.0, 0.5, 1.0]
    recent = [3, 7, 12]  # 9 is not recent; 12 has a negative logit (times 0: 0, below +inf)
    s = Sampler(temperature=0.8, repeat_penalty=0.0, penalty_last_n=8, seed=3)
    got = {s.first(logits, recent) for _ in range(200)}
    assert got == {3, 7}
    p = s.probs(s.penalize(logits, recent))
    assert np.isfinite(p).all() and p[3] == p[7] == 0.5
    out = s.verify(np.stack([logits, logits]), [7], recent)  # a draft among them is kept or replaced by one
    assert set(out) <= {3, 7}


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_a_repeat_penalty_out_of_range_is_named(bad):
    with pytest.raises(ValueError, match="repeat_penalty must be a finite number >= 0"):
        Sampler(repeat_penalty=bad)
