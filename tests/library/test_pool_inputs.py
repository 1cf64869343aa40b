"""``RequestPool(sync_tokens=...)`` is bounded where it enters: a value no kernel can take is
refused at construction, naming it, instead of making every later step raise after appending;
the largest value accepted steps like any other."""

from __future__ import annotations

import numpy as np
import pytest

from saspec import RequestPool, SpecEngine, build


@pytest.mark.parametrize("bad", [2**63, 2**64, 2**31, build.MAX_REQUEST_TOKENS + 1])
def test_a_sync_tokens_past_the_request_limit_is_refused(bad):
    with pytest.raises(ValueError, match="sync_tokens"):
        RequestPool(1000, sync_tokens=bad)


@pytest.mark.parametrize("sync", [1, build.MAX_REQUEST_TOKENS])
def test_the_bounds_step_with_a_pooled_text(sync):
    text = [1, 2, 3, 4, 5, 6, 7, 8]
    with RequestPool(1000, prompts=True, sync_tokens=sync, manual=True) as pool, SpecEngine(pool=pool) as engine:
        engine.add_request("old", text)
        engine.remove_request("old")
        pool.publish()  # starts building the text
        pool.publish()  # the engines see it
        engine.add_request("new", [9, 1, 2])
        engine.prepare(["new"])
        acc = np.array([[3, 4, 0]], np.int32)
        lens, match, src = np.array([2], np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
        draft = np.full((1, 2), -1, np.int32)
        engine.extend(acc, lens, match, draft, src)
        assert engine.automaton_len("new") == 5
        assert src[0] == 1 and draft[0].tolist() == [5, 6]  # the pooled text's continuation
        assert match[0] == (1 if sync == 1 else 4)  # a re-match sees at most sync_tokens tokens
