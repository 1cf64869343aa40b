"""The fault-injection hook for processes a test cannot reach into (``$SASPEC_FAULTS``), and a Drafter
serving under it: every failure counted, none raised, drafts exact."""

from __future__ import annotations

import numpy as np
import pytest

from saspec import faults
from saspec.drafter import Drafter


def test_every_nth_fails_every_nth_ask_of_each_kind():
    f = faults.EveryNth({"build": 3, "grow_ahead": 1})
    assert [f.should_fail("build") for _ in range(7)] == [False, False, True, False, False, True, False]
    assert f.should_fail("grow_ahead") and not f.should_fail("grow_in_step")
    assert f.failed == {"build": 2, "grow_ahead": 1}


@pytest.mark.parametrize("value, text", [("build", "kind=n pairs"), ("build=x", "kind=n pairs"),
                                         ("bild=3", "unknown fault kind 'bild'"), ("build=0", "n must be")])
def test_a_bad_value_names_the_variable(monkeypatch, value, text):
    monkeypatch.setenv(faults.FAULTS_ENV, value)
    with pytest.raises(ValueError, match=text) as e:
        faults.from_env()
    assert "SASPEC_FAULTS" in str(e.value)


def test_unset_means_no_hook(monkeypatch):
    monkeypatch.delenv(faults.FAULTS_ENV, raising=False)
    assert faults.from_env() is None
    monkeypatch.setenv(faults.FAULTS_ENV, " ")
    assert faults.from_env() is None


def test_a_drafter_under_every_third_build_failing_serves_every_request():
    hook = faults.EveryNth({"build": 3})
    rng = np.random.default_rng(0)
    with Drafter(8, length_rule="fixed", min_match=1, faults=hook) as d:
        texts = {}
        for i in range(12):
            texts[i] = rng.integers(0, 50, 60).tolist()
            d.start(i, texts[i][:40])
        rids = list(range(12))
        table = np.zeros((12, 64), np.int32)
        for i in rids:
            table[i, :60] = texts[i]
        for step in range(20):
            n = 40 + step
            new = table[:, n: n + 1].copy()
            out = d.step(rids, new, np.ones(12, np.int32), text_len=np.full(12, n, np.int32), texts=table)
            assert out.lengths.shape == (12,)
        assert d.stats()["build_failures"] == hook.failed["build"] > 0
        for i in rids:
            d.finish(i)
        assert len(d.drafts) == 0
