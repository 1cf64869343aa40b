"""Per-request options in transformers' ``generate`` (``saspec_options``): drafting off, a cap on each
step's draft, and hints the drafts copy from; greedy output identical to plain in every case."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_generate import COUNT, PROMPTS  # noqa: E402
from test_hf import Forwards, ids_of, plain, spec, tiny  # noqa: E402

N = 40


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return {"cycle": tiny("qwen2", 1, __import__("test_generate").CYCLE), "count": tiny("qwen2", 2, COUNT)}


def forwards(model, prompt, **kw) -> tuple[torch.Tensor, int]:
    with Forwards(model) as f:
        out = spec(model, prompt, max_new_tokens=N, **kw)
    return out, f.n


@pytest.mark.parametrize("policy", [True, False])
def test_drafting_off_decodes_one_token_per_forward(models, policy):
    _, prompt = PROMPTS["loop"]
    target = models["cycle"]
    expected = plain(target, prompt, max_new_tokens=N)
    on, n_on = forwards(target, prompt, saspec_policy=policy)
    off, n_off = forwards(target, prompt, saspec_policy=policy, saspec_options={"enabled": False})
    assert torch.equal(on, expected) and torch.equal(off, expected)
    assert n_off == N and n_on < N / 2


def test_max_draft_tokens_caps_each_step(models):
    _, prompt = PROMPTS["loop"]
    target = models["cycle"]
    expected = plain(target, prompt, max_new_tokens=N)
    capped, n = forwards(target, prompt, saspec_policy=False, saspec_k=8, saspec_length_rule="fixed",
                         saspec_options={"max_draft_tokens": 2})
    free, n_free = forwards(target, prompt, saspec_policy=False, saspec_k=8, saspec_length_rule="fixed")
    assert torch.equal(capped, expected) and torch.equal(free, expected)
    assert n >= N / 3 and n_free < n  # at most 3 tokens a forward with the cap


def test_hints_give_drafts_where_the_prompt_has_none(models):
    """The count model writes t+1 after t: its output repeats nothing of the prompt, so without hints the
    automaton drafts nothing; given the run it will write as hints, most tokens come from drafts."""
    target = models["count"]
    prompt = [5, 9, 100]
    expected = plain(target, prompt, max_new_tokens=N)
    hints = list(range(101, 101 + N + 10))
    without, n_without = forwards(target, prompt, saspec_policy=False)
    with_hints, n_hints = forwards(target, prompt, saspec_policy=False, saspec_options={"hints": hints})
    assert torch.equal(without, expected) and torch.equal(with_hints, expected)
    assert n_without == N and n_hints < N / 3


@pytest.mark.parametrize("options, error", [({"enabled": 1}, TypeError), ({"max_draft_tokens": -1}, ValueError),
                                            ({"hint": [1]}, ValueError)])
def test_bad_options_raise_before_generating(models, options, error):
    with pytest.raises(error, match="saspec_options"):
        spec(models["count"], [1, 2, 3], max_new_tokens=4, saspec_options=options)
