"""Per-request options as engines carry them, without vLLM: ``saspec.options.options_from_fields`` (the forms
vLLM's ``extra_args`` and the OpenAI server's ``vllm_xargs`` carry) and ``SAProposer.schedule`` (a request whose
options are bad is logged and never drafted for; the step goes on for the others)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from saspec.integrations.vllm import SAProposer
from saspec.options import DraftOptions
from saspec.options import options_from_fields

K = 4


def vllm_config(k: int = K) -> SimpleNamespace:
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=512),
                           scheduler_config=SimpleNamespace(max_num_seqs=8))


def test_options_from_extra_args_nested_and_flat():
    assert options_from_fields(None) == DraftOptions()
    assert options_from_fields({"other": 1}) == DraftOptions()
    assert options_from_fields({"saspec": {"enabled": False}}).enabled is False
    assert options_from_fields({"saspec_enabled": 0}).enabled is False
    assert options_from_fields({"saspec_enabled": "true"}).enabled is True
    assert options_from_fields({"saspec_max_draft_tokens": "3"}).max_draft_tokens == 3
    assert options_from_fields({"saspec_hints": "5, 6 7"}).hints.tolist() == [5, 6, 7]
    assert options_from_fields({"saspec_hints": [5, 6]}).hints.tolist() == [5, 6]


@pytest.mark.parametrize("extra, text", [
    ({"saspec": {"max_draft_tokens": -1}}, "max_draft_tokens must be >= 0"),
    ({"saspec": {"enabld": True}}, "unknown option 'enabld'"),
    ({"saspec_enabld": 1}, "unknown option 'enabld'"),
    ({"saspec_enabled": "maybe"}, "saspec_enabled must be true or false"),
    ({"saspec_max_draft_tokens": "two"}, "saspec_max_draft_tokens must be an int"),
    ({"saspec_hints": "1,x"}, "saspec_hints must be token ids"),
    ({"saspec": [1]}, "must be a mapping"),
    ({"saspec": {"enabled": True}, "saspec_enabled": 1}, "given twice"),
])
def test_bad_options_name_the_setting(extra, text):
    with pytest.raises((TypeError, ValueError), match=text):
        options_from_fields(extra)


def test_a_request_with_bad_options_is_logged_and_not_drafted_for(caplog, monkeypatch):
    monkeypatch.setenv("SASPEC_VLLM_POOL_TOKENS", "0")
    p = SAProposer(vllm_config(), warm=False, length_rule="fixed")
    text = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    with caplog.at_level(logging.ERROR):
        p.schedule([("good", text, 16, None), ("bad", text, 16, {"saspec": {"max_draft_tokens": -2}}),
                    ("capped", text, 16, {"saspec_max_draft_tokens": 1})], [])
    assert p.stats["option_errors"] == 1
    assert any("request 'bad'" in m and "max_draft_tokens" in m for m in caplog.messages)
    ids = np.zeros((3, 64), np.int32)
    ids[:, : len(text)] = text
    ids[:, len(text)] = 4
    p.name_rows(["good", "bad", "capped"])
    out = p.propose([[4], [4], [4]], np.full(3, len(text) + 1, np.int32), ids)
    assert out[0] == [5, 6, 1, 2] and out[1] == [] and out[2] == [5]


@pytest.mark.parametrize("policy", [False, True])
def test_the_hybrid_caps_both_sources_per_request(monkeypatch, policy):
    """A request with drafting off gets no draft from either source; one capped at 2 never more than 2."""
    from saspec.integrations.vllm import HybridDrafter
    from saspec.integrations.vllm.config import HybridSettings
    from saspec.policy import PolicySettings

    h = HybridDrafter(HybridSettings("draft_model", 4, 16, 3, 16, policy=policy), max_model_len=256, device="cuda",
                      policy_settings=PolicySettings(neural_prior=0.9, neural_cost=0.01))
    copy = list(range(100, 140)) * 2
    fresh = list(range(500, 580))
    h.schedule([("off", copy, 16, {"saspec": {"enabled": False}}), ("cap", copy, 16, {"saspec_max_draft_tokens": 2}),
                ("cap-fresh", fresh, 16, {"saspec": {"max_draft_tokens": 2}}), ("free", copy, 16, None)], [])
    texts = [copy, copy, fresh, copy]
    ids = np.zeros((4, 256), np.int32)
    for b, t in enumerate(texts):
        ids[b, : len(t)] = t
    sampled = np.full((4, 5), -1, np.int64)
    sampled[:, 0] = [100, 100, 900, 100]
    rids = ["off", "cap", "cap-fresh", "free"]
    count, draft, k = h.sa_step(rids, sampled, np.zeros(4, bool), np.full(4, 80, np.int32), ids)
    out = h.merge(rids, count, draft, [[7, 7, 7, 7]] * 4 if k else [])
    assert out[0] == [] and 0 < len(out[1]) <= 2 and len(out[2]) <= 2 and len(out[3]) > 2
