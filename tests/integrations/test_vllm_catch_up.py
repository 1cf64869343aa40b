"""The hybrid's draft model skips the steps no row needs it and reads what it skipped when it is next needed:
the vLLM inputs of those forwards (``catch_up``; their plans: ``tests/library/test_catch_up_plan.py``) and the
policy that charges them, without vLLM. The real engine runs them in ``test_vllm_real.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from saspec.catch_up_plan import DraftCatchUp
from token_rows import new_tokens, table
from saspec.integrations.vllm import HybridDrafter
from saspec.integrations.vllm.catch_up import forward_inputs
from saspec.integrations.vllm.config import HybridSettings


@dataclass
class Metadata:
    """The fields of vLLM's CommonAttentionMetadata that ``forward_inputs`` reads and writes."""

    query_start_loc: object
    query_start_loc_cpu: object
    seq_lens: object
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: object
    slot_mapping: object
    causal: bool = True
    seq_lens_cpu_upper_bound: object = field(default=None)

    def batch_size(self) -> int:
        return self.seq_lens.shape[0]


def test_the_forwards_inputs_put_each_token_in_its_requests_kv_slot():
    torch = pytest.importorskip("torch")
    c = DraftCatchUp(1000)
    texts = [list(range(1, 40)), list(range(101, 110))]
    c.start("a")
    c.start("b")
    p = c.plan(["a", "b"], np.array([38, 8]), np.array([True, True]), np.array([39, 9]), table(texts),
               new_tokens([[5], [6]]), np.array([1, 1]))
    blocks = torch.tensor([[7, 3, 9, 0], [4, 0, 0, 0]], dtype=torch.int32)  # block size 16
    target = Metadata(torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32),
                      torch.zeros(2, dtype=torch.int32), 2, 2, 1, 40, blocks, torch.zeros(2, dtype=torch.int64))
    got = forward_inputs(p, target, 16)
    cad = got["common_attn_metadata"]
    assert got["target_token_ids"].tolist() == texts[0][:38] + texts[1][:8]
    assert got["next_token_ids"].tolist() == [texts[0][38], texts[1][8]]
    want = [[7, 3, 9][pos // 16] * 16 + pos % 16 for pos in range(38)] + [4 * 16 + pos for pos in range(8)]
    assert cad.slot_mapping.tolist() == want
    assert cad.query_start_loc_cpu.tolist() == [0, 38, 46] and cad.seq_lens.tolist() == [38, 8]
    assert cad.num_actual_tokens == 46 and cad.max_query_len == 38 and cad.max_seq_len == 38
    assert got["token_indices_to_sample"] is None and got["num_rejected_tokens_gpu"] is None


# -- the hybrid with the catch-up ------------------------------------------------------------------------------


def hybrid(capacity: int | None = 4096, **kw) -> HybridDrafter:
    return HybridDrafter(HybridSettings("draft_model", 4, 16, 4, 16), max_model_len=1024, device="cpu",
                         catch_up_capacity=capacity, **kw)


def drive(h: HybridDrafter, text: list[int], prompt: int, neural_right: bool) -> list[tuple]:
    """A modelled engine at batch 1 on ``text`` (the first ``prompt`` tokens are the prompt): verification
    accepts the longest prefix of each draft that the text continues with; a neural draft is the text's next
    tokens where ``neural_right``, else wrong. Target forwards cost 0.1 s + 5 ms per token, draft-model calls a
    third of the target's cost of what they read and 30 ms per further drafting forward. Returns each step's
    (text position, source, neural K, plan starts or None)."""
    clock = [0.0]
    h.drafter.clock = lambda: clock[0]  # the time source of its step timings
    h.schedule([("r", text[:prompt], None)], [])
    known, emitted, trace = prompt, text[prompt: prompt + 1], []
    while known + len(emitted) < len(text) - 20:
        count, draft, k = h.sa_step(["r"], new_tokens([emitted], 24), np.zeros(1, bool), np.array([known]),
                                    table([text[:known]], len(text)))
        known += len(emitted)
        plan = h.plan
        if k:  # the draft model's call, as the plugin makes it
            h.catch_up.commit(plan) if h.catch_up is not None else None
            seconds = (0.1 + 0.005 * (plan.read if plan is not None else 1 + len(emitted))) / 3 + 0.03 * (k - 1)
            h.time_neural(k, seconds)
            clock[0] += seconds
        neural = text[known: known + k] if neural_right else [t + 1 for t in text[known: known + k]]
        (d,) = h.merge(["r"], count, draft, [neural] if k else [])
        acc = 0
        while acc < len(d) and d[acc] == text[known + acc]:
            acc += 1
        clock[0] += 0.1 + 0.005 * (1 + len(d))
        trace.append((known, "sa" if count[0] else ("neural" if d else "none"), k,
                      None if plan is None else int(plan.starts[0])))
        emitted = text[known: known + acc + 1]
    return trace


def test_the_draft_model_sits_out_a_copy_and_comes_back_after_it_reading_what_it_skipped():
    rng = np.random.default_rng(0)
    prompt = rng.integers(1000, 5000, 300).tolist()
    text = prompt + rng.integers(5000, 9000, 100).tolist() + prompt[:200] + rng.integers(5000, 9000, 200).tolist()
    h = hybrid()
    trace = drive(h, text, 300, neural_right=True)  # fresh text [300, 400), a copy [400, 600), fresh text
    before = [t for t in trace if 310 <= t[0] < 400]
    copy = [t for t in trace if 400 <= t[0] < 580]
    after = [t for t in trace if t[0] >= 620]
    assert sum(t[1] == "neural" for t in before) >= 0.8 * len(before)
    assert sum(t[1] == "sa" for t in copy) >= 0.8 * len(copy)
    assert sum(t[3] is None for t in copy) >= 0.7 * len(copy)  # no draft-model forward at most copy steps
    assert sum(t[1] == "neural" for t in after) >= 0.8 * len(after)  # never locked out by the catch-up
    first = next(t for t in trace if t[0] >= 580 and t[1] == "neural")
    assert first[3] < 420  # its first forward read the copy it had skipped
    assert h.stats["late_rows"] >= 1 and h.stats["catch_up_tokens"] >= 600 and h.stats["short_rows"] == 0


def test_a_draft_model_that_never_pays_stays_out_and_runs_no_forward():
    rng = np.random.default_rng(1)
    text = rng.integers(1000, 9000, 500).tolist()  # fresh text, and every neural draft wrong
    h = hybrid()
    trace = drive(h, text, 100, neural_right=False)
    assert sum(t[2] > 0 for t in trace[:5]) > 0  # tried at first
    # then out at all but a few steps: a probe where its evidence has faded towards the prior (it must not be
    # locked out for good; with the target's step cost extrapolated along its timed line, a catch-up is not
    # over-charged, so faded evidence earns an occasional probe), and no catch-up forward at a step it is out
    assert sum(t[2] > 0 for t in trace[-150:]) <= 7
    assert all(t[3] is None for t in trace[-150:] if t[2] == 0)
    assert h.stats["neural_calls"] == sum(t[2] > 0 for t in trace)


def test_without_the_catch_up_the_draft_model_runs_every_step():
    h = hybrid(capacity=None)
    assert h.catch_up is None and h.policy.catchup_sunk
    rng = np.random.default_rng(0)
    prompt = rng.integers(1000, 5000, 300).tolist()
    trace = drive(h, prompt + prompt[:200] + [1] * 40, 300, neural_right=True)
    assert all(t[3] is None for t in trace) and h.stats["catch_up_tokens"] == 0
