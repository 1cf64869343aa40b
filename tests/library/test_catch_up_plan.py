"""DraftCatchUp: what a skipping draft model has read of each request, and the spans its catch-up forward reads
(each row's unread span, the rows taking a neural draft first where the capacity is short)."""

from __future__ import annotations

import numpy as np
import pytest

from saspec.catch_up_plan import DraftCatchUp
from token_rows import new_tokens, table


def test_a_plan_reads_each_rows_unread_span_and_the_next_forward_starts_where_it_stopped():
    c = DraftCatchUp(1000)
    a, b = list(range(100, 130)), list(range(500, 520))
    c.start("a")
    c.start("b")
    # row a: 30 tokens of text and 3 new (its next token, at 32, is the last); row b: a prefill chunk to 12
    p = c.plan(["a", "b"], np.array([32, 12]), np.array([True, False]), np.array([30, 20]), table([a, b]),
               new_tokens([[7, 8, 9], []]), np.array([3, 0]))
    assert p.starts.tolist() == [0, 0] and p.stops.tolist() == [32, 12] and p.full.all()
    assert p.tokens.tolist() == a + [7, 8] + b[:12] and p.positions.tolist() == list(range(32)) + list(range(12))
    assert p.query_start.tolist() == [0, 32, 44] and p.next_tokens.tolist() == [9, b[12]] and p.read == 46
    c.commit(p)
    a += [7, 8, 9]
    # the next forward reads from the last extra slot on: the skipped steps' tokens and this step's
    p = c.plan(["a", "b"], np.array([36, 20]), np.array([True, True]), np.array([33, 20]), table([a, b]),
               new_tokens([[1, 2, 3, 4], [6]]), np.array([4, 1]))
    assert p.starts.tolist() == [32, 12] and p.stops.tolist() == [36, 20]
    assert p.tokens.tolist() == [9, 1, 2, 3] + b[12:20] and p.next_tokens.tolist() == [4, 6]
    assert c.behind(["a", "b"], np.array([40, 21])) == 8 + 9 + 2  # not committed: the same starts
    c.forget("a")
    assert c.starts(["a"], np.array([40])).tolist() == [0]  # a forgotten (or unknown) request starts at 0


def test_a_short_capacity_serves_the_neural_rows_first_and_every_row_reads_a_token():
    c = DraftCatchUp(24)
    texts = [list(range(1, 31)), list(range(101, 131)), list(range(201, 231))]
    p = c.plan(["x", "y", "z"], np.array([30, 30, 30]), np.array([False, True, False]), np.array([30, 30, 30]),
               table(texts), new_tokens([[5], [6], [7]]), np.array([1, 1, 1]))
    # 24 tokens: an extra slot and a first token for each row (6), then row y, the neural one, gets 18 more
    assert (p.stops - p.starts).tolist() == [1, 19, 1] and p.read == 24
    assert p.full.tolist() == [False, False, False]
    assert p.next_tokens.tolist() == [texts[0][1], texts[1][19], texts[2][1]]  # the text's true next tokens
    c.commit(p)
    assert c.starts(["x", "y"], np.array([30, 30])).tolist() == [1, 19]


@pytest.mark.parametrize("ends, text_len, lens, message", [
    ([0, 5], [10, 10], [1, 1], "end must be in"),
    ([11, 5], [10, 10], [1, 1], "end must be in"),  # past the row's new tokens
    ([5, 5], [2000, 10], [1, 1], "token table"),
    ([5], [10], [1], "need 2 rows"),
])
def test_bad_plans_are_refused_and_change_nothing(ends, text_len, lens, message):
    c = DraftCatchUp(100)
    c.start("a")
    with pytest.raises(ValueError, match=message):
        c.plan(["a", "b"], np.array(ends), np.array([True, True]), np.array(text_len), table([[1] * 20, [2] * 20]),
               new_tokens([[3], [4]]), np.array(lens))
    assert c.starts(["a"], np.array([9])).tolist() == [0]
    with pytest.raises(ValueError, match="at least 6 tokens"):
        DraftCatchUp(4).plan(["a", "b", "c"], np.array([5, 5, 5]), np.ones(3, bool), np.array([9, 9, 9]),
                             table([[1] * 9] * 3), new_tokens([[1]] * 3), np.ones(3, np.int64))
    for bad in (1, 2.5, True, None):
        with pytest.raises(ValueError, match="capacity"):
            DraftCatchUp(bad)
