"""``SADraftModel.lookup`` (and ``propose``) check the new tokens before appending any: floats,
strings and bools raise instead of being converted, and the history is unchanged (no llama.cpp
needed)."""

from __future__ import annotations

import numpy as np
import pytest

from saspec.integrations.llama_cpp import SADraftModel

PROMPT = [5, 6, 7, 5, 6]


@pytest.mark.parametrize("call", ["lookup", "propose"])
@pytest.mark.parametrize("tokens", [[1.7], ["7"], [True], [3, 4.5], np.array([1.0]), [-1], [2**31]])
def test_bad_new_tokens_raise_and_leave_the_history(call, tokens):
    d = SADraftModel(8)
    d.begin(PROMPT)
    with pytest.raises((TypeError, ValueError), match="new_tokens"):
        getattr(d, call)(tokens)
    ref = SADraftModel(8)
    ref.begin(PROMPT)
    assert d.lookup([7]) == ref.lookup([7])  # the history went on as if the bad call never happened
    d.close()
    ref.close()
