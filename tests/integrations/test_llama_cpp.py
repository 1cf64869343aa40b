"""saspec in llama.cpp through llama-cpp-python, on a tiny random llama written locally as
GGUF (the ``gguf`` package; no network): saspec's loop emits plain greedy decoding's tokens
with the automaton, the draft model and the hybrid, and after prompts longer than
``n_batch``; the draft model's KV cache is caught up, not rebuilt; sampled verification
has the target's distribution; the automaton drafts inside llama-cpp-python's own loop;
the server hook serves completions with saspec's loop; bad arguments raise and change
nothing. Skipped where llama-cpp-python is not importable; run it in its environment
(``benchmarks/llama_cpp/setup.sh``)::

    PYTHONPATH=src /work/venvs/llama/bin/python -m pytest -q -p no:cacheprovider tests/integrations/test_llama_cpp.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                reason="llama-cpp-python is not installed")

VOCAB = 320
N_BATCH = 64


def write_tiny_llama_gguf(path: Path, seed: int = 0, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                          n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 2048) -> None:
    """A random llama (f32) with an SPM vocabulary of ``VOCAB`` tokens (3 special, 256 bytes, the rest plain)."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-random-llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_file_type(0)  # all f32
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    tokens += [f"t{i}".encode() for i in range(VOCAB - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (VOCAB - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    def tensor(name: str, *shape: int, scale: float | None = None) -> None:
        s = 1.0 / np.sqrt(shape[-1]) if scale is None else scale
        w.add_tensor(name, (rng.standard_normal(shape) * s).astype(np.float32))

    hd = n_embd // n_head
    tensor("token_embd.weight", VOCAB, n_embd, scale=1.0)
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    tensor("output.weight", VOCAB, n_embd, scale=4.0 / np.sqrt(n_embd))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
        tensor(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        tensor(f"blk.{i}.attn_k.weight", n_head_kv * hd, n_embd)
        tensor(f"blk.{i}.attn_v.weight", n_head_kv * hd, n_embd)
        tensor(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        tensor(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_llama_gguf(path)
    return path


def new_llama(path: Path, **kw):
    from llama_cpp import Llama

    args = dict(model_path=str(path), n_ctx=1024, n_batch=N_BATCH, n_threads=1, n_threads_batch=1, verbose=False,
                seed=0)
    args.update(kw)
    return Llama(**args)


@pytest.fixture(scope="module")
def llama(gguf_path):
    return new_llama(gguf_path)


def plain_greedy(llama, prompt: list[int], n: int) -> list[int]:
    """llama-cpp-python's own greedy decoding (``Llama.generate``, one token per step) from a clean cache."""
    llama.reset()
    out = []
    for t in llama.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        out.append(int(t))
        if len(out) == n:
            break
    llama.reset()
    return out


def repetitive_prompt(seed: int, n: int = 40, copies: int = 3) -> list[int]:
    """A random passage repeated: the automaton matches it, and the target often continues it."""
    rng = np.random.default_rng(seed)
    part = rng.integers(3, VOCAB, n).tolist()
    return part * copies


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plain_loop_equals_llama_generate(llama, seed):
    from saspec.integrations.llama_cpp import generate

    prompt = repetitive_prompt(seed)
    ref = plain_greedy(llama, prompt, 60)
    got = generate(llama, prompt, 60, None, stop_at_eog=False)
    assert got.tokens == ref
    assert got.steps == 59 and not got.drafted


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_automaton_greedy_equals_plain(llama, seed):
    from saspec.integrations.llama_cpp import SADraftModel, generate

    prompt = repetitive_prompt(seed)
    ref = plain_greedy(llama, prompt, 80)
    got = generate(llama, prompt, 80, SADraftModel(16), stop_at_eog=False)
    assert got.tokens == ref
    assert sum(got.drafted.values()) > 0
    # the KV cache holds the prompt and the output but its last token, as the Llama records it
    # (no step drafted past max_tokens)
    assert llama.n_tokens == len(prompt) + len(ref) - 1
    assert llama.input_ids[: llama.n_tokens].tolist() == (prompt + ref)[:-1]


def test_drafts_are_accepted_when_the_target_repeats_itself(llama):
    """Greedy decoding of a random model falls into a cycle: once it does, the automaton's drafts are kept."""
    from saspec.integrations.llama_cpp import SADraftModel, generate

    prompt = repetitive_prompt(5)
    got = generate(llama, prompt, 200, SADraftModel(16, min_match=1), stop_at_eog=False)
    assert got.tokens == plain_greedy(llama, prompt, 200)
    assert got.accepted.get("sa", 0) > 0.5 * len(got.tokens)
    assert got.steps < len(got.tokens) / 2


def test_prompt_longer_than_n_batch(llama):
    from saspec.integrations.llama_cpp import SADraftModel, generate

    prompt = repetitive_prompt(7, n=100, copies=3)  # 300 tokens, n_batch 64
    ref = plain_greedy(llama, prompt, 50)
    assert generate(llama, prompt, 50, SADraftModel(), stop_at_eog=False).tokens == ref


def test_cached_prefix_is_reused_and_kept_correct(llama):
    """A second prompt sharing a prefix decodes only the rest, with the same output as from scratch."""
    from saspec.integrations.llama_cpp import SADraftModel, generate

    a = repetitive_prompt(8)
    first = generate(llama, a, 30, SADraftModel(), stop_at_eog=False)
    b = a + first.tokens + repetitive_prompt(9, n=10, copies=1)
    ref = plain_greedy(llama, b, 40)
    generate(llama, a, 30, SADraftModel(), stop_at_eog=False)  # leave a's state in the cache again
    assert generate(llama, b, 40, SADraftModel(), stop_at_eog=False).tokens == ref


def test_draft_model_and_hybrid_equal_plain_and_catch_up_lazily(gguf_path, llama):
    """With the target itself as the draft model every draft token is kept, which only holds
    if the draft model's KV cache is right after the steps it skipped (the fixed rules, not the policy,
    whose choice rests on this machine's timings; the hybrid under the match-length rule uses both sources)."""
    from saspec.integrations.llama_cpp import LlamaCppHybridDrafter, ModelDrafter, SADraftModel, generate

    small = new_llama(gguf_path)
    for seed in (0, 4):
        prompt = repetitive_prompt(seed, n=30, copies=2) + repetitive_prompt(seed + 10, n=20, copies=1)
        ref = plain_greedy(llama, prompt, 120)
        alone = ModelDrafter(small, k=4, p_min=0.0)
        got = generate(llama, prompt, 120, alone, stop_at_eog=False, policy=False)  # drafts each step, whatever it costs
        assert got.tokens == ref
        assert got.accepted["draft"] == got.drafted["draft"] > 0
        hybrid = LlamaCppHybridDrafter(SADraftModel(16), ModelDrafter(small, k=4, p_min=0.0), threshold=4)
        got = generate(llama, prompt, 120, hybrid, stop_at_eog=False, policy=False)  # the match-length rule
        assert got.tokens == ref
        assert got.steps_by_source.get("sa", 0) > 0 and got.steps_by_source.get("draft", 0) > 0
        assert got.accepted["draft"] == got.drafted["draft"]
        # Lazy catch-up: the draft model decoded the prompt once plus each later token at most
        # once more than the drafts it made (no re-decoding of the history per step).
        m = hybrid.model
        assert m.decoded <= len(prompt) + len(ref) + got.drafted["draft"] + got.steps_by_source["draft"]


def test_p_min_stops_unsure_drafts(gguf_path, llama):
    from saspec.integrations.llama_cpp import ModelDrafter, generate

    small = new_llama(gguf_path)
    d = ModelDrafter(small, k=8, p_min=1.0)  # no token is certain: no drafts at all
    prompt = repetitive_prompt(3)
    got = generate(llama, prompt, 20, d, stop_at_eog=False)
    assert got.tokens == plain_greedy(llama, prompt, 20) and not got.drafted


def test_sampled_verification_has_the_target_distribution():
    """Sampler.verify with a point-mass draft: the first emitted token has distribution p0, and the
    second, given the first kept the draft, p1 (exact speculative sampling)."""
    from saspec.integrations.llama_cpp import Sampler

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 6)).astype(np.float32) * 1.5
    s = Sampler(temperature=0.8, seed=1)
    p0, p1 = s.probs(logits[0]), s.probs(logits[1])
    d = [int(np.argsort(p0)[-2]), int(np.argmax(p1))]  # a draft that is not the mode first
    n = 40_000
    first = np.zeros(6)
    second = np.zeros(6)
    for _ in range(n):
        out = s.verify(logits, d)
        first[out[0]] += 1
        if out[0] == d[0]:
            second[out[1]] += 1
    assert np.abs(first / n - p0).max() < 0.01
    assert np.abs(second / second.sum() - p1).max() < 0.015


class FixedDrafter:
    """Proposes the same tokens at every step (the loop's verification is what is tested)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def begin(self, prompt) -> None:
        pass

    def propose(self, new_tokens) -> list[int]:
        return list(self.tokens)


def test_sampled_generation_keeps_drafts_as_often_as_the_target_samples_them(llama):
    """End to end at temperature 0.7: how often the second and third tokens equal the draft's
    matches the target's own probability of those tokens, averaged over the same histories
    (speculative sampling is exact: a kept draft is as likely as the target sampling it)."""
    from saspec.integrations.llama_cpp import Context, Sampler, generate

    prompt = repetitive_prompt(11, n=20, copies=3)
    g = plain_greedy(llama, prompt, 3)
    ref_sampler = Sampler(temperature=0.7)
    cond: dict[tuple[int, ...], np.ndarray] = {}

    def p_next(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in cond:
            llama.reset()
            cond[prefix] = ref_sampler.probs(Context(llama).decode(prompt + list(prefix), want_last=True))
        return cond[prefix]

    n, hits, expected = 400, np.zeros(2), np.zeros(2)
    outs = [generate(llama, prompt, 3, FixedDrafter(g[1:3]), temperature=0.7, seed=i, stop_at_eog=False).tokens
            for i in range(n)]
    for t in outs:
        for j in (1, 2):
            if j == 2 and t[1] != g[1]:
                continue  # the second draft token is only verified after the first was kept
            hits[j - 1] += t[j] == g[j]
            expected[j - 1] += p_next(tuple(t[:j]))[g[j]]
    kept_first = sum(t[1] == g[1] for t in outs)
    assert 0.05 * n < hits[0] < 0.95 * n  # both outcomes occur: the test can see a bias
    assert abs(hits[0] - expected[0]) < 4 * np.sqrt(n / 4)
    assert abs(hits[1] - expected[1]) < 4 * np.sqrt(kept_first / 4) + 1


def test_sampler_matches_llama_cpp_chain_order():
    """top-k, then top-p on the temperature-1 distribution, then min-p, then temperature."""
    from saspec.integrations.llama_cpp import Sampler

    z = np.log(np.array([0.5, 0.3, 0.1, 0.06, 0.04], np.float32))
    p = Sampler(temperature=2.0, top_k=4, top_p=0.85, min_p=0.0).probs(z)
    kept = np.array([0.5, 0.3, 0.1, 0, 0]) ** 0.5  # top-4, top-p keeps 0.5+0.3+0.1 >= 0.85, temperature 2
    assert np.allclose(p, kept / kept.sum())
    p = Sampler(temperature=1.0, min_p=0.5).probs(z)
    assert np.allclose(p, np.array([0.5, 0.3, 0, 0, 0]) / 0.8)
    pen = Sampler(repeat_penalty=2.0, frequency_penalty=0.1, presence_penalty=0.2)
    out = pen.penalize(np.array([1.0, -1.0, 3.0], np.float32), [0, 1, 1])
    assert np.allclose(out, [1.0 / 2 - 0.1 - 0.2, -1.0 * 2 - 0.2 - 0.2, 3.0])


def test_the_automaton_inside_llama_cpp_pythons_own_loop(gguf_path):
    """``Llama(draft_model=SADraftModel())``: llama-cpp-python's speculative loop, same greedy tokens."""
    from llama_cpp.llama_speculative import LlamaDraftModel
    from saspec.integrations.llama_cpp import SADraftModel

    target = new_llama(gguf_path)
    d = SADraftModel(8)
    assert isinstance(d, LlamaDraftModel)
    spec = new_llama(gguf_path, draft_model=d, logits_all=True)
    prompt = repetitive_prompt(2)
    ref = plain_greedy(target, prompt, 60)
    got = []
    for t in spec.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
        got.append(int(t))
        if len(got) == 60:
            break
    assert got == ref
    assert d.rebuilds == 1  # each later call only appended the new tokens


def test_server_hook_serves_completions_with_saspec(gguf_path):
    from saspec.integrations.llama_cpp.server import SaspecSettings, attach

    prompt = repetitive_prompt(6)
    ref = new_llama(gguf_path).create_completion(prompt, max_tokens=40, temperature=0.0, repeat_penalty=1.1)
    served = new_llama(gguf_path)
    gen = attach(served, SaspecSettings(k=16))
    got = served.create_completion(prompt, max_tokens=40, temperature=0.0, repeat_penalty=1.1)
    assert got["choices"][0]["text"] == ref["choices"][0]["text"]
    assert got["usage"] == ref["usage"]
    assert gen.requests == 1 and gen.fallbacks == 0
    again = served.create_completion(prompt, max_tokens=40, temperature=0.0, repeat_penalty=1.1)
    assert again["choices"][0]["text"] == ref["choices"][0]["text"]
    served.create_completion(prompt, max_tokens=5, temperature=0.5, mirostat_mode=2)  # not the loop's: falls back
    assert gen.fallbacks == 1


def test_seed_minus_one_and_repeat_penalty_zero_are_taken_as_llama_cpp_python_takes_them(gguf_path, llama):
    """llama-cpp-python answers ``seed=-1`` (a random seed) and ``repeat_penalty=0``; so do the server hook
    (greedy: the same text as llama-cpp-python's own) and the loop's ``generate``."""
    from saspec.integrations.llama_cpp import generate
    from saspec.integrations.llama_cpp.server import SaspecSettings, attach

    prompt = repetitive_prompt(7)
    served = new_llama(gguf_path)
    gen = attach(served, SaspecSettings(k=16))
    for kw in ({"seed": -1}, {"repeat_penalty": 0.0}, {"seed": -1, "repeat_penalty": 0.0}):
        ref = new_llama(gguf_path).create_completion(prompt, max_tokens=30, temperature=0.0, **kw)
        got = served.create_completion(prompt, max_tokens=30, temperature=0.0, **kw)
        assert got["choices"][0]["text"] == ref["choices"][0]["text"], kw
    sampled = served.create_completion(prompt, max_tokens=20, temperature=0.8, seed=-1, repeat_penalty=0.0)
    assert sampled["usage"]["completion_tokens"] >= 1
    assert gen.fallbacks == 0 and gen.requests == 4
    assert len(generate(llama, prompt, 10, None, temperature=0.7, seed=-1, stop_at_eog=False).tokens) == 10


def test_server_launcher_serves_openai_completions(gguf_path, tmp_path):
    """``python -m saspec.integrations.llama_cpp.server``: llama-cpp-python's OpenAI server with saspec's
    loop (and the pool) answers a completion with plain greedy decoding's text."""
    import json
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "w")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "saspec.integrations.llama_cpp.server", "--model", str(gguf_path),
                             "--n_ctx", "1024", "--n_threads", "1", "--port", str(port), "--saspec-k", "16",
                             "--saspec-pool-tokens", "10000"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        body = json.dumps({"prompt": "abcabcabcabc", "max_tokens": 30, "temperature": 0, "repeat_penalty": 1.1}).encode()
        for _ in range(120):
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    got = json.loads(r.read())
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "server.log").read_text()
                time.sleep(0.5)
        else:
            raise AssertionError("the server did not answer")
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    ref = new_llama(gguf_path).create_completion("abcabcabcabc", max_tokens=30, temperature=0, repeat_penalty=1.1)
    assert got["choices"][0]["text"] == ref["choices"][0]["text"]
    assert "decodes with saspec's loop" in (tmp_path / "server.log").read_text()


def test_server_arguments_split():
    from saspec.integrations.llama_cpp.server import parse_saspec_args

    s, rest = parse_saspec_args(["--model", "m.gguf", "--saspec-k", "24", "--saspec-draft-model", "d.gguf",
                                 "--n_ctx", "4096", "--saspec-pool-tokens", "1000"])
    assert (s.k, s.draft_model, s.pool_tokens) == (24, "d.gguf", 1000)
    assert rest == ["--model", "m.gguf", "--n_ctx", "4096"]
    assert s.policy and not parse_saspec_args(["--saspec-no-policy"])[0].policy
    with pytest.raises(ValueError, match="pool-tokens"):
        parse_saspec_args(["--saspec-pool-tokens", "-1"])


@pytest.mark.parametrize("kwargs, err", [
    ({"max_tokens": 0}, ValueError), ({"prompt_ids": []}, ValueError), ({"prompt_ids": [[1, 2]]}, ValueError),
    ({"prompt_ids": [1, VOCAB]}, ValueError), ({"prompt_ids": [1, -2]}, ValueError),
    ({"prompt_ids": list(range(3, 1100))}, ValueError), ({"temperature": -1.0}, ValueError),
    ({"top_p": 0.0}, ValueError), ({"top_k": -1}, ValueError), ({"drafter": object()}, TypeError),
    ({"max_draft": 10_000}, ValueError), ({"policy": "on"}, TypeError), ({"clock": 1.0}, TypeError),
])
def test_bad_arguments_raise_and_change_nothing(llama, kwargs, err):
    from saspec.integrations.llama_cpp import generate

    prompt = repetitive_prompt(1)
    generate(llama, prompt, 5, None, stop_at_eog=False)
    before = (llama.n_tokens, llama.input_ids[: llama.n_tokens].tolist())
    args = {"prompt_ids": prompt, "max_tokens": 5, **kwargs}
    with pytest.raises(err):
        generate(llama, args.pop("prompt_ids"), args.pop("max_tokens"), **args)
    assert (llama.n_tokens, llama.input_ids[: llama.n_tokens].tolist()) == before


def test_bad_drafter_settings_raise(llama):
    from saspec.integrations.llama_cpp import LlamaCppHybridDrafter as HybridDrafter
    from saspec.integrations.llama_cpp import ModelDrafter, SADraftModel

    with pytest.raises(ValueError, match="p_min"):
        ModelDrafter(llama, p_min=1.5)
    with pytest.raises(ValueError, match="k"):
        ModelDrafter(llama, k=0)
    with pytest.raises(TypeError, match="Llama"):
        ModelDrafter(object())
    with pytest.raises(TypeError, match="SADraftModel"):
        HybridDrafter(object(), ModelDrafter(llama))
    with pytest.raises(ValueError, match="threshold"):
        HybridDrafter(SADraftModel(), ModelDrafter(llama), threshold=0)


# -- the policy ---------------------------------------------------------------------------------------------


class CostClock:
    """An injected clock that only decodes advance: a decode of ``n`` tokens on a charged context
    costs ``per_call + per_token * n`` modeled seconds (the context's own wall time is not read)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def charge(self, ctx, per_call: float, per_token: float) -> None:
        decode = ctx.decode

        def charged(tokens, **kw):
            self.t += per_call + per_token * len(tokens)
            return decode(tokens, **kw)

        ctx.decode = charged


def random_prompt(seed: int, n: int = 60) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def policy_runs(llama, drafter, clock, prompts, n):
    """Greedy runs of one Speculator (its policy learning across them) with the modeled clock."""
    from saspec.integrations.llama_cpp import Sampler, Speculator

    spec = Speculator(llama, drafter, clock=clock, profile=False)  # the prior shape, then the modeled timings
    clock.charge(spec.ctx, 4.0, 1.0)  # llama.cpp on a CPU: a fixed part, then about a forward per token
    model = getattr(drafter, "model", None)
    return spec, model, [spec.generate(p, n, Sampler(), stop_at_eog=False) for p in prompts]


@pytest.mark.parametrize("per_token, chosen", [(3.0, False), (0.05, True)])
def test_policy_uses_the_draft_model_only_where_it_costs_less(gguf_path, llama, per_token, chosen):
    """The draft model is the target's own weights (every draft kept): only its modeled cost decides.
    Three times the target's cost per token: after a warm-up run it is never chosen; a twentieth: it
    drafts most steps. Both emit plain greedy decoding's tokens."""
    from saspec.integrations.llama_cpp import LlamaCppHybridDrafter, ModelDrafter, SADraftModel

    clock = CostClock()
    hybrid = LlamaCppHybridDrafter(SADraftModel(16), ModelDrafter(new_llama(gguf_path), k=4, p_min=0.0))
    clock.charge(hybrid.model.ctx, 3.0 * per_token * 4, per_token)
    prompts = [random_prompt(s) for s in (20, 21, 22)]
    spec, model, runs = policy_runs(llama, hybrid, clock, prompts, 60)
    for p, r in zip(prompts, runs):
        assert r.tokens == plain_greedy(llama, p, 60)
    later = [r.steps_by_source.get("draft", 0) for r in runs[1:]]
    if chosen:
        assert all(d > 0.5 * r.steps for d, r in zip(later, runs[1:]))
        assert runs[-1].accepted["draft"] == runs[-1].drafted["draft"]
    else:
        assert later == [0, 0]
    assert spec.policy.stats["steps"] == sum(r.steps for r in runs)
    spec.close()


def test_the_policy_starts_from_the_llamas_profiled_step_cost(llama, monkeypatch):
    """Before the first step the loop times decodes of each profile size (the minimum of its repeats) on
    the Llama's context, leaves the cache as it was, and reuses the curve for every later Speculator."""
    import weakref

    from saspec.integrations.llama_cpp import SADraftModel, Speculator, loop

    clock = CostClock()
    real = loop.Context.decode

    def charged(self, tokens, **kw):
        clock.t += 4.0 + len(tokens) * (3.0 if clock.t < 40 else 2.0)  # the first calls slow: a cold start
        return real(self, tokens, **kw)

    monkeypatch.setattr(loop.Context, "decode", charged)
    monkeypatch.setattr(loop, "_profiles", weakref.WeakKeyDictionary())
    llama.reset()
    before = llama.n_tokens
    spec = Speculator(llama, SADraftModel(16), clock=clock)
    cost = spec.policy.cost
    assert [cost.seconds(n) for n in (1, 2, 9, 17)] == pytest.approx([6.0, 8.0, 22.0, 38.0])
    assert llama.n_tokens == before
    spent = clock.t
    again = Speculator(llama, SADraftModel(16), clock=clock)
    assert clock.t == spent and again.policy.cost.seconds(9) == pytest.approx(22.0)
    assert Speculator(llama, SADraftModel(16), clock=clock, profile=False).policy.cost.seconds(9) == \
        pytest.approx(13.0)  # the prior shape, cpu_like
    r = spec.generate(random_prompt(40), 20, stop_at_eog=False)
    assert r.tokens == plain_greedy(llama, random_prompt(40), 20)


def test_a_draft_models_cost_before_it_is_timed_is_its_profiled_one_token_decode(gguf_path, llama, monkeypatch):
    """The hybrid's draft model is profiled too: the policy's prior for its cost is the ratio of its one-token
    decode to the target's (here 1.5 against 6 modeled seconds)."""
    import weakref

    from saspec.integrations.llama_cpp import LlamaCppHybridDrafter, ModelDrafter, SADraftModel, Speculator, loop

    small = new_llama(gguf_path)
    clock = CostClock()
    real = loop.Context.decode

    def charged(self, tokens, **kw):
        clock.t += (1.0 + 0.5 * len(tokens)) if self.llama is small else (4.0 + 2.0 * len(tokens))
        return real(self, tokens, **kw)

    monkeypatch.setattr(loop.Context, "decode", charged)
    monkeypatch.setattr(loop, "_profiles", weakref.WeakKeyDictionary())
    llama.reset()
    hybrid = LlamaCppHybridDrafter(SADraftModel(16), ModelDrafter(small, k=4, p_min=0.0))
    spec = Speculator(llama, hybrid, clock=clock)
    assert spec.policy.neural_cost == pytest.approx(1.5 / 6.0)
    assert spec.policy.cost.seconds(9) == pytest.approx(22.0)


def offer_wrong_drafts(spec, token: int) -> None:
    """Make ``spec``'s automaton offer, at a long match every step, ``token`` (one the target never emits):
    its drafter's automaton step (``RequestDrafts.step``) answers a 24-token match and a whole draft of it."""
    drafts = spec.drafts.drafts
    step = drafts.step

    def wrong(*args, **kwargs):
        match, draft, count = step(*args, **kwargs)
        match[:], draft[:], count[:] = 24, token, drafts.k
        return match, draft, count

    drafts.step = wrong


def test_policy_falls_back_to_plain_steps_where_drafts_never_hit(llama):
    """The fixed rule drafts every step and every draft is rejected; the policy scores the offers
    against the tokens emitted and, after a warm-up run, takes plain steps."""
    from saspec.integrations.llama_cpp import SADraftModel, Sampler, Speculator

    prompts = [random_prompt(s) for s in (30, 31)]
    refs = [plain_greedy(llama, p, 60) for p in prompts]
    never = min(set(range(VOCAB)) - set(refs[0]) - set(refs[1]))
    with Speculator(llama, SADraftModel(8), policy=False) as fixed_spec:
        offer_wrong_drafts(fixed_spec, never)
        fixed = fixed_spec.generate(prompts[0], 60, Sampler(), stop_at_eog=False)
    # every step drafts but the last, which max_tokens leaves no room to
    assert fixed.steps_by_source.get("sa", 0) == fixed.steps - 1 and fixed.accepted.get("sa", 0) == 0
    clock = CostClock()
    with Speculator(llama, SADraftModel(8), clock=clock, profile=False) as spec:
        clock.charge(spec.ctx, 4.0, 1.0)
        offer_wrong_drafts(spec, never)
        runs = [spec.generate(p, 60, Sampler(), stop_at_eog=False) for p in prompts]
    for ref, r in zip(refs, runs):
        assert r.tokens == ref
        assert r.accepted.get("sa", 0) == 0
    assert runs[0].steps_by_source.get("none", 0) > 0
    assert runs[1].steps_by_source.get("none", 0) >= 0.9 * runs[1].steps


# -- per-request options and the drafter ------------------------------------------------------------------


def record_decodes(monkeypatch, llama) -> list[int]:
    """The token count of every decode the loop makes on ``llama`` (its prefill first), in order."""
    from saspec.integrations.llama_cpp import loop

    sizes: list[int] = []
    real = loop.Context.decode

    def decode(self, tokens, **kw):
        if self.llama is llama:
            sizes.append(len(tokens))
        return real(self, tokens, **kw)

    monkeypatch.setattr(loop.Context, "decode", decode)
    return sizes


def hybrid_of(gguf_path, **kw):
    from saspec.integrations.llama_cpp import LlamaCppHybridDrafter, ModelDrafter, SADraftModel

    return LlamaCppHybridDrafter(SADraftModel(16, min_match=1), ModelDrafter(new_llama(gguf_path), k=4, p_min=0.0), **kw)


@pytest.mark.parametrize("policy", [True, False])
def test_drafting_off_for_one_call_takes_one_forward_per_token(gguf_path, llama, monkeypatch, policy):
    """``options={"enabled": False}``: plain greedy decoding's tokens, one target forward per token, the
    draft model never run; the next call of the same Speculator drafts again."""
    from saspec.integrations.llama_cpp import SADraftModel, Sampler, Speculator

    prompt = repetitive_prompt(5)
    ref = plain_greedy(llama, prompt, 80)
    sizes = record_decodes(monkeypatch, llama)
    for drafter in (SADraftModel(16, min_match=1), hybrid_of(gguf_path, threshold=4)):
        clock = CostClock()
        with Speculator(llama, drafter, policy=policy, clock=clock, profile=False) as spec:
            clock.charge(spec.ctx, 4.0, 1.0)
            sizes.clear()
            off = spec.generate(prompt, 80, Sampler(), stop_at_eog=False, options={"enabled": False})
            assert off.tokens == ref
            assert sizes[1:] == [1] * 79 and off.steps == 79 and not off.drafted
            assert getattr(drafter, "model", None) is None or drafter.model.forwards == 0
            assert spec.drafts.stats()["disabled_rows"] == 79
            on = spec.generate(prompt, 80, Sampler(), stop_at_eog=False)
            assert on.tokens == ref and on.steps < 79 and sum(on.drafted.values()) > 0


@pytest.mark.parametrize("policy", [True, False])
def test_max_draft_tokens_caps_every_step_from_either_source(gguf_path, llama, monkeypatch, policy):
    """``{"max_draft_tokens": 2}``: no target forward verifies more than 2 draft tokens (3 tokens with
    the step's own), from the automaton or the draft model, and the output is plain decoding's."""
    from saspec.integrations.llama_cpp import SADraftModel, Sampler, Speculator

    prompt = repetitive_prompt(6, n=30, copies=2) + repetitive_prompt(16, n=20, copies=1)
    ref = plain_greedy(llama, prompt, 100)
    sizes = record_decodes(monkeypatch, llama)
    for drafter in (SADraftModel(16, min_match=1), hybrid_of(gguf_path, threshold=4)):
        clock = CostClock()
        with Speculator(llama, drafter, policy=policy, clock=clock, profile=False) as spec:
            clock.charge(spec.ctx, 4.0, 1.0)
            if getattr(drafter, "model", None) is not None:
                clock.charge(drafter.model.ctx, 0.1, 0.01)  # a cheap draft model: the policy takes it
            sizes.clear()
            got = spec.generate(prompt, 100, Sampler(), stop_at_eog=False, options={"max_draft_tokens": 2})
        assert got.tokens == ref
        assert max(sizes[1:]) == 3 and got.steps < 99
        if getattr(drafter, "model", None) is not None:
            assert got.drafted.get("draft", 0) > 0


def test_hints_raise_drafts_on_a_prompt_without_the_text(llama):
    """``{"hints": ids}``: the output's text given as hints (not in the prompt) is drafted from and kept;
    the output is plain decoding's either way."""
    from saspec.integrations.llama_cpp import SADraftModel, generate

    prompt = random_prompt(60, n=80)
    ref = plain_greedy(llama, prompt, 80)
    without = generate(llama, prompt, 80, SADraftModel(16), stop_at_eog=False, policy=False)
    hinted = generate(llama, prompt, 80, SADraftModel(16), stop_at_eog=False, policy=False,
                      options={"hints": ref})
    assert without.tokens == hinted.tokens == ref
    assert hinted.accepted.get("sa", 0) >= 0.6 * len(ref) > without.accepted.get("sa", 0) + 10
    assert hinted.steps < 0.5 * without.steps


def test_the_pool_remembers_across_calls(llama):
    """An ``SADraftModel``'s pool is the drafter's: a call's text joins it when the call ends, and a later
    call drafts its continuation from there."""
    from saspec import RequestPool
    from saspec.integrations.llama_cpp import SADraftModel, generate

    x = random_prompt(70)
    with RequestPool(100_000) as pool:
        first = generate(llama, x, 60, SADraftModel(16, pool=pool), stop_at_eog=False, policy=False)
        assert pool.flush(10.0)
        again = x + first.tokens[:10]  # its continuation is in the first call's text only
        ref = plain_greedy(llama, again, 40)
        got = generate(llama, again, 40, SADraftModel(16, pool=pool), stop_at_eog=False, policy=False)
    assert got.tokens == ref
    assert got.accepted.get("pool", 0) > 20
    alone = generate(llama, again, 40, SADraftModel(16), stop_at_eog=False, policy=False)
    assert alone.tokens == ref and "pool" not in alone.drafted


@pytest.mark.parametrize("options, err, name", [
    ({"colour": 1}, ValueError, "colour"), ({"max_draft_tokens": -1}, ValueError, "max_draft_tokens"),
    ({"max_draft_tokens": 1.5}, TypeError, "max_draft_tokens"), ({"enabled": "no"}, TypeError, "enabled"),
    ({"hints": [VOCAB]}, ValueError, "hints"), ({"hints": [1.5]}, TypeError, "hints"),
    ({"hints": [-1]}, ValueError, "hints"), ("on", TypeError, "options"),
])
def test_bad_options_raise_before_the_model_runs(llama, options, err, name):
    from saspec.integrations.llama_cpp import SADraftModel, Speculator, generate

    prompt = repetitive_prompt(1)
    generate(llama, prompt, 5, None, stop_at_eog=False)
    before = (llama.n_tokens, llama.input_ids[: llama.n_tokens].tolist())
    with pytest.raises(err, match=name):
        generate(llama, prompt, 5, SADraftModel(), stop_at_eog=False, options=options)
    with Speculator(llama, SADraftModel(), profile=False) as spec:
        with pytest.raises(err, match=name):
            spec.generate(prompt, 5, options=options)
        assert len(spec.drafts) == 0  # no request was started
    assert (llama.n_tokens, llama.input_ids[: llama.n_tokens].tolist()) == before


def test_hints_need_the_automaton(gguf_path, llama):
    from saspec.integrations.llama_cpp import ModelDrafter, generate

    for drafter in (None, ModelDrafter(new_llama(gguf_path)), FixedDrafter([5])):
        with pytest.raises(ValueError, match="hints need saspec's automaton"):
            generate(llama, repetitive_prompt(1), 5, drafter, options={"hints": [5, 6, 7]})


def test_the_loop_keeps_no_policy_bookkeeping(gguf_path, llama):
    """The loop drives a saspec.drafter.Drafter: it holds no policy, cost model, catch-up share or offers
    of its own, and calls none of their bookkeeping; a policy object is not an argument."""
    import inspect

    import saspec.policy
    from saspec import RequestPool
    from saspec.drafter import Drafter
    from saspec.integrations.llama_cpp import SADraftModel, Speculator, loop

    source = inspect.getsource(loop)
    for name in ("SequencePolicy", "CatchUpShare", ".observe", ".offer(", ".choose(", "observe_forward"):
        assert name not in source
    with Speculator(llama, hybrid_of(gguf_path), profile=False) as spec:
        assert isinstance(spec.drafts, Drafter) and spec.policy is spec.drafts.policy is not None
        kinds = tuple(getattr(saspec.policy, n) for n in ("SequencePolicy", "DraftPolicy", "CatchUpShare", "StepCost")
                      if hasattr(saspec.policy, n))
        assert not [k for k, v in vars(spec).items() if isinstance(v, kinds)]
        r = spec.generate(repetitive_prompt(2), 20, stop_at_eog=False)
        assert spec.drafts.stats()["steps"] == spec.policy.stats["steps"] == r.steps  # one drafter step a decode
    for policy in (True, False):  # the drafter takes the automaton's settings and pool
        with RequestPool(1000) as pool:
            sa = SADraftModel(12, occurrence="recent", pool=pool, min_match=2, length_scale=1.5)
            with Speculator(llama, sa, policy=policy, profile=False) as spec:
                d = spec.drafts
                assert (d.k, d.pool, d.drafts.engine.occurrence) == (12, pool, "recent")
                assert (d.drafts.min_match, d.drafts.length_scale) == ((2, 1.5) if not policy else (1, 2.0))
    if hasattr(saspec.policy, "SequencePolicy"):
        with pytest.raises(TypeError, match="PolicySettings"):
            Speculator(llama, SADraftModel(), policy=saspec.policy.SequencePolicy(8))


def test_request_options_reach_an_attached_llama(gguf_path, monkeypatch):
    """``server.request_options`` serves the completions made inside it with the options; outside, the defaults."""
    from saspec.integrations.llama_cpp.server import SaspecSettings, attach, request_options

    prompt = repetitive_prompt(6)
    ref = new_llama(gguf_path).create_completion(prompt, max_tokens=40, temperature=0.0)
    served = new_llama(gguf_path)
    sizes = record_decodes(monkeypatch, served)
    attach(served, SaspecSettings(k=16, policy=False))
    with request_options({"enabled": False}):
        got = served.create_completion(prompt, max_tokens=40, temperature=0.0)
    assert got["choices"][0]["text"] == ref["choices"][0]["text"]
    assert set(sizes[1:]) == {1}  # (llama-cpp-python may draw a few tokens past max_tokens)
    sizes.clear()
    served.create_completion(prompt, max_tokens=40, temperature=0.0)
    assert max(sizes[1:]) > 1
    with pytest.raises(ValueError, match="max_draft_tokens"), request_options({"max_draft_tokens": -2}):
        pass


def served_app(gguf_path, monkeypatch, settings):
    """llama-cpp-python's OpenAI app with saspec installed (restored after the test), and what it attached."""
    from llama_cpp.server import app as server_app
    from llama_cpp.server.model import LlamaProxy
    from llama_cpp.server.settings import Settings
    from saspec.integrations.llama_cpp.server import install

    monkeypatch.setattr(LlamaProxy, "load_llama_from_model_settings",
                        LlamaProxy.__dict__["load_llama_from_model_settings"])
    monkeypatch.setattr(server_app, "create_app", server_app.create_app)
    attached = install(settings)
    app = server_app.create_app(Settings(model=str(gguf_path), n_ctx=1024, n_batch=N_BATCH, n_threads=1,
                                         n_threads_batch=1, verbose=False, seed=0))
    return app, attached


def test_server_request_options_and_their_errors(gguf_path, monkeypatch):
    """The OpenAI server takes saspec's options in the request body (``"saspec": {...}`` or flat
    ``saspec_*`` fields): a bad one is an HTTP 400 naming it (completions and chat alike) and the
    server serves on; drafting off gives one forward per token, a cap of 2 at most 3 tokens a
    forward, hints that hold the answer fewer forwards, each with plain decoding's text."""
    from starlette.testclient import TestClient

    from saspec.integrations.llama_cpp.server import SaspecSettings

    app, attached = served_app(gguf_path, monkeypatch, SaspecSettings(k=16, policy=False))
    served = attached[0].llama
    sizes = record_decodes(monkeypatch, served)
    text = "abcdefgh" * 6
    body = {"prompt": text, "max_tokens": 40, "temperature": 0, "repeat_penalty": 1.0}
    with TestClient(app) as client:
        for bad, name in [({"saspec": {"enabled": "no"}}, "enabled"), ({"saspec": {"colour": 1}}, "colour"),
                          ({"saspec": {"max_draft_tokens": -1}}, "max_draft_tokens"),
                          ({"saspec_hints": "1,x"}, "saspec_hints"), ({"saspec": {"hints": [VOCAB + 1]}}, "hints"),
                          ({"saspec": [1]}, "saspec"), ({"saspec": {"enabled": True}, "saspec_enabled": 0}, "twice")]:
            for path, request in (("/v1/completions", body),
                                  ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})):
                r = client.post(path, json={**request, **bad})
                assert r.status_code == 400, (bad, r.text)
                assert name in r.json()["error"]["message"]
        assert not sizes  # no bad request reached the model

        def served_text(extra):
            sizes.clear()
            r = client.post("/v1/completions", json={**body, **extra})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        ref = served_text({})
        assert max(sizes[1:]) > 3  # the automaton drafts on this text
        assert served_text({"saspec": {"enabled": False}}) == ref and set(sizes[1:]) == {1}
        assert served_text({"saspec_enabled": "false"}) == ref and set(sizes[1:]) == {1}
        assert served_text({"saspec": {"max_draft_tokens": 2}}) == ref and max(sizes[1:]) == 3
        assert served_text({"saspec_max_draft_tokens": "2"}) == ref and max(sizes[1:]) == 3
        sizes.clear()  # streamed: the options reach the worker thread that draws each chunk
        r = client.post("/v1/completions", json={**body, "stream": True, "saspec": {"enabled": False}})
        assert r.status_code == 200 and "[DONE]" in r.text and len(sizes) > 1 and set(sizes[1:]) == {1}

    other = {"prompt": "zyxwvutsrqponm", "max_tokens": 40, "temperature": 0, "repeat_penalty": 1.0}
    with TestClient(app) as client:  # hints holding the answer's ids (the prompt does not hold them)
        sizes.clear()
        plain = client.post("/v1/completions", json=other).json()
        steps = len(sizes) - 1
        n = plain["usage"]["completion_tokens"]
        answer = served.input_ids[served.n_tokens - n + 1: served.n_tokens].tolist()  # the cache lacks the last
        sizes.clear()
        hinted = client.post("/v1/completions", json={**other, "saspec": {"hints": answer}}).json()
        assert hinted["choices"][0]["text"] == plain["choices"][0]["text"]
        assert len(sizes) - 1 < 0.6 * steps
