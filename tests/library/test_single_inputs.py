"""``SingleSequence.extend`` checks every token before it appends any: floats, strings and bools
are rejected rather than converted, a bad token in a later chunk leaves the earlier chunks
unappended, and so does a length past the request limit."""

from __future__ import annotations

import numpy as np
import pytest

from saspec import SpecEngine, build
from saspec.single import SingleSequence

K = 3
PROMPT = [1, 2, 3, 1, 2]


@pytest.fixture
def seq():
    with SpecEngine() as engine:
        s = SingleSequence(engine, PROMPT, K)
        yield s
        s.close()


def _state(s: SingleSequence) -> tuple[int, tuple[int, list[int]]]:
    """The automaton's length, and the match and draft of a step that appends nothing."""
    return s.engine.automaton_len(s.request_id), s.extend([])


@pytest.mark.parametrize("tokens", [[1.7], [3.0], ["7"], [True], [1, 2, 3.5], np.array([1.0, 2.0]),
                                    np.array([True, False]), [[1, 2]], [2**70], [object()]])
def test_non_integer_tokens_are_rejected_and_change_nothing(seq, tokens):
    before = _state(seq)
    with pytest.raises((TypeError, ValueError), match="tokens"):
        seq.extend(tokens)
    assert _state(seq) == before


@pytest.mark.parametrize("bad", [-1, 2**31])
def test_a_bad_token_in_a_later_chunk_appends_nothing(seq, bad):
    before = _state(seq)
    tokens = [1, 2, 3] * (3 * (K + 1)) + [bad]  # the bad token is several chunks in
    with pytest.raises(ValueError, match=r"token .*outside \[0, 2\*\*31\)"):
        seq.extend(tokens)
    assert _state(seq) == before


def test_the_length_limit_is_checked_before_the_first_chunk(seq, monkeypatch):
    before = _state(seq)
    monkeypatch.setattr(build, "MAX_REQUEST_TOKENS", len(PROMPT) + 2 * (K + 1))
    with pytest.raises(ValueError, match="more than the limit"):
        seq.extend([1] * (3 * (K + 1)))
    assert _state(seq) == before


@pytest.mark.parametrize("tokens", [[4, 5], (4, 5), np.array([4, 5], np.int64), np.array([4, 5], np.uint16),
                                    [np.int64(4), np.int32(5)]])
def test_integer_tokens_of_any_integer_type_are_taken(tokens):
    with SpecEngine() as a, SpecEngine() as b:
        ref, s = SingleSequence(a, PROMPT, K), SingleSequence(b, PROMPT, K)
        assert s.extend(tokens) == ref.extend([4, 5])
        assert b.automaton_len(s.request_id) == a.automaton_len(ref.request_id) == len(PROMPT) + 2
