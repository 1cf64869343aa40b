"""``model.generate(custom_generate=saspec.integrations.hf.generate)`` is plain greedy ``generate``, faster.

Tiny Qwen2 and Llama models (2 layers, hidden 64, fp32), built from configs
with fixed seeds, nothing downloaded. The "successor" construction of
``test_generate`` makes greedy output predictable: the argmax after token
``t`` is ``succ[t]``, so a prompt on a cycle of ``succ`` makes the output loop
(the automaton drafts long accepted runs) and the counting model's output
never repeats (the automaton never matches).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_generate import COUNT, CYCLE, PROMPTS, V, perturbed, walk  # noqa: E402

from saspec import SpecEngine  # noqa: E402
from saspec.integrations import hf as sahf  # noqa: E402

ARCHS = ("qwen2", "llama")


def tiny(arch: str, seed: int, succ: np.ndarray | None = None) -> torch.nn.Module:
    """A 2-layer ``arch`` LM, vocabulary V, fp32; with ``succ`` a successor model."""
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False, use_cache=True,
                  bos_token_id=None, eos_token_id=None)
    if arch == "qwen2":
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    else:
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    model.generation_config.pad_token_id = 0
    if succ is not None:
        g = torch.Generator().manual_seed(seed + 1)
        emb = torch.randn(V, 64, generator=g)
        head = torch.empty_like(emb)
        head[torch.as_tensor(succ)] = emb  # the argmax after token t is succ[t]
        with torch.no_grad():
            model.model.embed_tokens.weight.copy_(emb)
            model.lm_head.weight.copy_(head)
    return model


@pytest.fixture(scope="module")
def models() -> dict[tuple[str, str], torch.nn.Module]:
    out = {}
    for i, arch in enumerate(ARCHS):
        s = 10 * i
        out[arch, "cycle"] = tiny(arch, s + 1, CYCLE)
        out[arch, "count"] = tiny(arch, s + 2, COUNT)
        out[arch, "random"] = tiny(arch, s + 3)
        out[arch, "draft-cycle"] = tiny(arch, s + 4, perturbed(CYCLE, 0.3, 7))
        out[arch, "draft-count"] = tiny(arch, s + 5, perturbed(COUNT, 0.3, 8))
    return out


def ids_of(prompt: list[int]) -> torch.Tensor:
    return torch.tensor([prompt], dtype=torch.long)


def plain(model, prompt, **kw) -> torch.Tensor:
    return model.generate(ids_of(prompt), do_sample=False, **kw)


def spec(model, prompt, **kw) -> torch.Tensor:
    return model.generate(ids_of(prompt), custom_generate=sahf.generate, do_sample=False, **kw)


class Forwards:
    """Counts ``model.forward`` calls while active."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.n = model, 0

    def __enter__(self) -> Forwards:
        self.handle = self.model.register_forward_hook(lambda *a: setattr(self, "n", self.n + 1))
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and the test machine's cores are shared)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompt_name", ["loop", "enter-loop", "count", "random"])
def test_identical_to_greedy(models, arch, prompt_name):
    kind, prompt = PROMPTS[prompt_name]
    target = models[arch, kind]
    expected = plain(target, prompt, max_new_tokens=40)
    assert expected.shape == (1, len(prompt) + 40)
    assert torch.equal(spec(target, prompt, max_new_tokens=40), expected)
    assert torch.equal(spec(target, prompt, max_new_tokens=40, saspec_k=3), expected)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompt_name", ["enter-loop", "count"])
def test_hybrid_identical_to_greedy(models, arch, prompt_name):
    kind, prompt = PROMPTS[prompt_name]
    target, draft = models[arch, kind], models[arch, f"draft-{kind}"]
    expected = plain(target, prompt, max_new_tokens=30)
    assert torch.equal(spec(target, prompt, max_new_tokens=30, assistant_model=draft), expected)
    assert torch.equal(spec(target, prompt, max_new_tokens=30, assistant_model=draft, saspec_threshold=1,
                            saspec_k=3), expected)


@pytest.mark.parametrize("arch", ARCHS)
def test_fewer_target_forwards_on_repetitive_prompt(models, arch):
    target = models[arch, "cycle"]
    # loop: the prompt holds the loop, so every forward verifies K=8 drafts (+1 token of its own) from the start;
    # enter-loop: one forward per token on the first lap of the 13-cycle, then full drafts
    for prompt_name, most in (("loop", 8), ("enter-loop", 13 + 7)):
        prompt = PROMPTS[prompt_name][1]
        with Forwards(target) as f_plain:
            expected = plain(target, prompt, max_new_tokens=60)
        with Forwards(target) as f_sa:
            out = spec(target, prompt, max_new_tokens=60, saspec_policy=False)
        assert torch.equal(out, expected)
        assert f_plain.n == 60
        assert f_sa.n <= most, (prompt_name, f_sa.n)
    # the automaton never matches on the counting model: one forward per token, like plain greedy
    target = models[arch, "count"]
    with Forwards(target) as f:
        out = spec(target, PROMPTS["count"][1], max_new_tokens=30)
    assert out[0, -30:].tolist() == list(range(1, 31)) and f.n == 30


def test_hybrid_uses_both_drafters(models):
    target, draft = models["qwen2", "cycle"], models["qwen2", "draft-cycle"]
    prompt = PROMPTS["enter-loop"][1]
    expected = plain(target, prompt, max_new_tokens=60)
    with Forwards(target) as t_hf, Forwards(draft) as d_hf:
        assert torch.equal(plain(target, prompt, max_new_tokens=60, assistant_model=draft), expected)
    with Forwards(target) as t_hy, Forwards(draft) as d_hy:
        assert torch.equal(spec(target, prompt, max_new_tokens=60, assistant_model=draft, saspec_policy=False), expected)
    assert d_hy.n > 0  # the assistant given as `assistant_model=` drafted (before the loop repeats)...
    assert d_hy.n < d_hf.n  # ...but not where the automaton's match was long
    assert t_hy.n < 60
    # where the automaton never matches, the hybrid is transformers' own assisted decoding
    target, draft = models["qwen2", "count"], models["qwen2", "draft-count"]
    prompt = PROMPTS["count"][1]
    with Forwards(target) as t_hf, Forwards(draft) as d_hf:
        ref = plain(target, prompt, max_new_tokens=40, assistant_model=draft)
    with Forwards(target) as t_hy, Forwards(draft) as d_hy:
        assert torch.equal(spec(target, prompt, max_new_tokens=40, assistant_model=draft, saspec_policy=False), ref)
    assert (t_hy.n, d_hy.n) == (t_hf.n, d_hf.n)


@pytest.mark.parametrize("gate", [False, True])
def test_hybrid_where_the_automaton_drafts_first(models, gate):
    """The automaton matches at once and the assistant takes over later: its
    first call must still come at the first step (it expects the prompt alone)."""
    from saspec.policy import PolicySettings, SequencePolicy

    target, draft = models["qwen2", "count"], models["qwen2", "draft-count"]
    prompt = [200, 201, 202, *range(50, 66), 210, 211, *range(50, 56)]  # matched at once; counting runs past 65
    expected = plain(target, prompt, max_new_tokens=30)
    # The policy on a modeled clock (cheap verification, a cheap and good assistant): deterministic, and
    # the assistant pays once the automaton has nothing to offer.
    good = PolicySettings(neural_prior=0.9, neural_cost=0.05)
    with ModelClock(target, CHEAP, draft, draft_s=0.001) as clock, Forwards(draft) as d:
        out = spec(target, prompt, max_new_tokens=30, assistant_model=draft,
                   saspec_policy=SequencePolicy(8, settings=good, clock=clock) if gate else False,
                   attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    assert torch.equal(out, expected)
    assert d.n > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_eos_inside_an_accepted_run(models, arch):
    target = models[arch, "cycle"]
    prompt = PROMPTS["loop"][1]
    run = plain(target, prompt, max_new_tokens=30)[0, len(prompt):].tolist()
    eos = run[25]  # the output loops, so this token is deep inside a run of accepted drafts
    expected = plain(target, prompt, max_new_tokens=60, eos_token_id=eos)
    assert expected.shape[1] < len(prompt) + 60 and int(expected[0, -1]) == eos
    assert torch.equal(spec(target, prompt, max_new_tokens=60, eos_token_id=eos), expected)
    target, draft = models[arch, "count"], models[arch, "draft-count"]
    prompt = PROMPTS["count"][1]
    expected = plain(target, prompt, max_new_tokens=60, eos_token_id=[17, 40])
    assert expected[0, len(prompt):].tolist() == list(range(1, 18))
    assert torch.equal(spec(target, prompt, max_new_tokens=60, eos_token_id=[17, 40]), expected)
    assert torch.equal(spec(target, prompt, max_new_tokens=60, eos_token_id=[17, 40], assistant_model=draft), expected)


@pytest.mark.parametrize("arch", ARCHS)
def test_length_limits(models, arch):
    target, draft = models[arch, "cycle"], models[arch, "draft-cycle"]
    prompt = PROMPTS["loop"][1]
    for n in (1, 2, 9, 10):
        expected = plain(target, prompt, max_new_tokens=n)
        assert expected.shape[1] == len(prompt) + n
        assert torch.equal(spec(target, prompt, max_new_tokens=n), expected), n
        assert torch.equal(spec(target, prompt, max_new_tokens=n, assistant_model=draft), expected), n
    expected = plain(target, prompt, max_length=len(prompt) + 13)
    assert torch.equal(spec(target, prompt, max_length=len(prompt) + 13), expected)


class StopAfter(transformers.StoppingCriteria):
    """Stops once the last token is ``token``; counts its calls."""

    def __init__(self, token: int) -> None:
        self.token, self.calls = token, 0

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        return input_ids[:, -1] == self.token


class Recorder(transformers.generation.streamers.BaseStreamer):
    """Records what a streamer receives."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.ended = False

    def put(self, value) -> None:
        self.tokens += value.reshape(-1).tolist()

    def end(self) -> None:
        self.ended = True


@pytest.mark.parametrize("arch", ARCHS)
def test_stopping_criterion_and_streamer(models, arch):
    target, draft = models[arch, "cycle"], models[arch, "draft-cycle"]
    prompt = PROMPTS["loop"][1]
    stop_token = plain(target, prompt, max_new_tokens=30)[0, len(prompt) + 20].item()
    rec_plain = Recorder()
    expected = plain(target, prompt, max_new_tokens=60, stopping_criteria=[StopAfter(stop_token)], streamer=rec_plain)
    assert len(prompt) + 1 <= expected.shape[1] <= len(prompt) + 21 and expected[0, -1] == stop_token
    for kw in ({}, {"assistant_model": draft}):
        crit, rec = StopAfter(stop_token), Recorder()
        with Forwards(target) as f:
            out = spec(target, prompt, max_new_tokens=60, stopping_criteria=[crit], streamer=rec, **kw)
        assert torch.equal(out, expected), kw
        assert rec.tokens == rec_plain.tokens and rec.ended, kw
        assert f.n < expected.shape[1] - len(prompt)  # several tokens per forward, yet it stopped on the token


def test_scores_are_cut_with_the_sequence(models):
    target = models["llama", "cycle"]
    prompt = PROMPTS["loop"][1]
    stop_token = plain(target, prompt, max_new_tokens=30)[0, len(prompt) + 12].item()
    kw = dict(max_new_tokens=40, stopping_criteria=[StopAfter(stop_token)], return_dict_in_generate=True,
              output_scores=True)
    ref = plain(target, prompt, **kw)
    out = spec(target, prompt, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.scores) == len(ref.scores) == ref.sequences.shape[1] - len(prompt)
    for a, b in zip(out.scores, ref.scores):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    assert cache.get_seq_length() == out.sequences.shape[1] - 1


def test_logits_processor_applies_per_position(models):
    target = models["qwen2", "cycle"]
    prompt = PROMPTS["loop"][1]
    kw = dict(max_new_tokens=40, repetition_penalty=1.5, no_repeat_ngram_size=5)
    expected = plain(target, prompt, **kw)
    assert not torch.equal(expected, plain(target, prompt, max_new_tokens=40))  # the processors change the output
    assert torch.equal(spec(target, prompt, **kw), expected)


def test_sampling(models):
    target = models["qwen2", "cycle"]
    prompt = PROMPTS["loop"][1]
    greedy = plain(target, prompt, max_new_tokens=30)
    out = target.generate(ids_of(prompt), custom_generate=sahf.generate, do_sample=True, top_k=1, max_new_tokens=30)
    assert torch.equal(out, greedy)  # top_k=1 sampling is greedy
    torch.manual_seed(0)
    out = target.generate(ids_of(prompt), custom_generate=sahf.generate, do_sample=True, temperature=2.0,
                          max_new_tokens=30)
    assert out.shape == greedy.shape and torch.equal(out[:, : len(prompt)], greedy[:, : len(prompt)])


def test_refusals(models):
    target, draft = models["qwen2", "cycle"], models["qwen2", "draft-cycle"]
    two = torch.tensor([PROMPTS["loop"][1][:20], PROMPTS["loop"][1][20:40]])
    with pytest.raises(ValueError, match="batch size 2"):
        target.generate(two, custom_generate=sahf.generate, do_sample=False, max_new_tokens=5)
    with pytest.raises(ValueError, match="beam search"):
        spec(target, PROMPTS["loop"][1], max_new_tokens=5, num_beams=2)
    other = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=V + 8, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1)).eval()
    with pytest.raises(ValueError, match="vocabulary"):
        spec(target, PROMPTS["loop"][1], max_new_tokens=5, assistant_model=other)
    with pytest.raises(ValueError, match="saspec_k"):
        spec(target, PROMPTS["loop"][1], max_new_tokens=5, saspec_k=0)
    assert "_get_candidate_generator" not in vars(target)  # the override is gone after a failed call
    with pytest.raises(RuntimeError, match="custom_generate="):  # only transformers' generate may call it
        sahf.generate(target, ids_of([1, 2]), [], [], target.generation_config)
    assert torch.equal(spec(target, PROMPTS["loop"][1], max_new_tokens=5, assistant_model=draft),
                       plain(target, PROMPTS["loop"][1], max_new_tokens=5))


def test_draft_length_rule():
    text = [5, 6, 7, 8, 9, 1, 2, 3, 4, 0, 6, 7, 8, 9]  # the suffix 6 7 8 9 (4 tokens) occurred before

    def lookup(**kw):
        gen = sahf.SACandidateGenerator(ids_of(text), engine=SpecEngine(), k=8, threshold=1, max_length=100,
                                        eos_token_ids=[], **kw)
        return gen, gen.lookup(ids_of(text))

    assert lookup(length_rule="fixed")[1] == (4, [1, 2, 3, 4, 0, 6, 7, 8])
    assert lookup(length_scale=0.5)[1] == (4, [1, 2])
    assert lookup()[1] == (4, [1, 2, 3, 4, 0, 6, 7, 8])  # default: 2 per matched token, at most K
    gen, _ = lookup(length_rule="per-match-recent")
    gen.get_candidates(ids_of(text))
    gen.update_candidate_strategy(ids_of(text), None, 0)  # the automaton's draft missed at once
    assert gen.lookup(ids_of(text)) == (4, [1, 2])  # so it drafts 2 * 0 + 2 next
    with pytest.raises(ValueError, match="draft-length rule 'longest'"):
        lookup(length_rule="longest")


def test_length_options_reach_the_loop(models):
    target = models["qwen2", "cycle"]
    prompt = PROMPTS["loop"][1]
    expected = plain(target, prompt, max_new_tokens=40)
    with Forwards(target) as f_fixed:
        assert torch.equal(spec(target, prompt, max_new_tokens=40, saspec_length_rule="fixed", saspec_policy=False),
                           expected)
    with Forwards(target) as f_short:
        assert torch.equal(spec(target, prompt, max_new_tokens=40, saspec_length_rule="per-match-recent",
                                saspec_length_scale=0.01, saspec_policy=False), expected)
    assert f_fixed.n <= 5 and f_short.n > f_fixed.n  # scale 0.01: 1 draft token per step while matches are short
    with pytest.raises(ValueError, match="scale"):
        spec(target, prompt, max_new_tokens=5, saspec_length_scale=-1.0)


def test_version_pin():
    (a, b), (c, d) = sahf.TESTED_TRANSFORMERS
    sahf.check_transformers_version(f"{a}.{b}.0")
    sahf.check_transformers_version(f"{c}.{d - 1}.3")
    for bad in (f"{a}.{b - 1}.9", f"{c}.{d}.0", f"{c + 1}.0.0", f"{c}.{d - 1}.0.dev0", "4.57.1"):
        with pytest.raises(RuntimeError, match=rf"tested with transformers >={a}\.{b},<{c}\.{d}"):
            sahf.check_transformers_version(bad)
    sahf.check_transformers_version()  # the installed one: the tests above ran with it


def test_import_is_light():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, saspec.integrations.hf\n"
         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))"],
        capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_walk_helper_agrees_with_the_model(models):
    """The prompts' premise: the cycle model continues a walk on its cycle."""
    target = models["llama", "cycle"]
    prompt = PROMPTS["loop"][1]
    out = plain(target, prompt, max_new_tokens=10)[0, len(prompt):].tolist()
    assert out == walk(CYCLE, int(CYCLE[prompt[-1]]), 10)


def test_readme_example(models):
    """The README's transformers example runs as written, on tiny models, and gives greedy's output."""
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    code = re.search(r"### transformers\n+```python\n(.*?)```", readme, re.S).group(1)
    assert "custom_generate=sahf.generate" in code and "assistant_model=draft" in code
    model, draft = models["llama", "cycle"], models["llama", "draft-cycle"]
    prompt = PROMPTS["enter-loop"][1]
    scope = {"model": model, "draft": draft, "ids": ids_of(prompt)}
    exec(compile(code.replace("256", "24"), "README.md", "exec"), scope)
    assert torch.equal(scope["out"], plain(model, prompt, max_new_tokens=24))


def test_fast_verify_is_scoped_to_the_call(models):
    target = models["qwen2", "cycle"]
    prompt = PROMPTS["loop"][1]
    expected = plain(target, prompt, max_new_tokens=30)
    linears = [m for m in target.modules() if isinstance(m, torch.nn.Linear)]
    seen = []
    orig = sahf._small_rows_forward

    def spy(mod):
        seen.append(mod)
        return orig(mod)

    sahf._small_rows_forward = spy
    try:
        assert torch.equal(spec(target, prompt, max_new_tokens=30), expected)
    finally:
        sahf._small_rows_forward = orig
    assert len(seen) == len(linears)  # routed during the call...
    assert all("forward" not in vars(m) and not hasattr(m, "_saspec_small_rows") for m in linears)  # ...and restored
    assert torch.equal(spec(target, prompt, max_new_tokens=30, saspec_fast_verify=False), expected)


def test_fast_verify_leaves_foreign_forwards_alone(models):
    """A layer whose forward was replaced per instance (as accelerate's hooks
    do) keeps it: it runs during the call and is still there after it."""
    target = models["qwen2", "cycle"]
    prompt = PROMPTS["loop"][1]
    expected = plain(target, prompt, max_new_tokens=20)
    lin = target.model.layers[0].mlp.up_proj
    calls = []
    original = lin.forward

    def hooked(x):
        calls.append(x.shape)
        return original(x)

    lin.forward = hooked
    try:
        assert torch.equal(spec(target, prompt, max_new_tokens=20), expected)
        assert calls and vars(lin)["forward"] is hooked and not hasattr(lin, "_saspec_small_rows")
    finally:
        del lin.forward


def test_generators_sharing_an_engine():
    """Each generator extends and drafts its own request when they share one engine."""
    engine = SpecEngine()
    kw = dict(k=4, threshold=1, max_length=100, eos_token_ids=[])
    a, b = ids_of([5, 6, 7, 8, 9, 5, 6, 7]), ids_of([1, 2, 3, 1, 2])
    ga = sahf.SACandidateGenerator(a, engine=engine, **kw)
    gb = sahf.SACandidateGenerator(b, engine=engine, **kw)
    alone_a = sahf.SACandidateGenerator(a, engine=SpecEngine(), **kw).lookup(a, capped=False)
    alone_b = sahf.SACandidateGenerator(b, engine=SpecEngine(), **kw).lookup(b, capped=False)
    assert ga.lookup(a, capped=False) == alone_a == (3, [8, 9, 5, 6])
    assert gb.lookup(b, capped=False) == alone_b
    assert engine.batch == (gb.request_id,)


def test_gate_drafts_respect_the_length_limit(models):
    """A fresh gate verifies a near-certain copy in full from its first step, cut to the room left; without
    one it warms up with plain steps."""
    for name, expected_sizes in (("loop", lambda p: [len(p) + 2]), ("random", lambda p: [len(p), 1, 1])):
        kind, prompt = PROMPTS[name]
        target = models["qwen2", kind]
        sizes = []
        hook = target.register_forward_pre_hook(lambda mod, args, kw: sizes.append(kw["input_ids"].shape[1]),
                                                with_kwargs=True)
        try:
            out = spec(target, prompt, max_new_tokens=3, saspec_policy=True)
        finally:
            hook.remove()
        assert torch.equal(out, plain(target, prompt, max_new_tokens=3))
        assert sizes == expected_sizes(prompt), name


# -- drafting only where it pays, under an injected clock ----------------------------

from clocks import ModelClock  # noqa: E402


DEAR = lambda n: float(n)  # noqa: E731  (every verified token costs a forward: bf16 on a CPU without bf16 matmuls)
CHEAP = lambda n: 1.0 + 0.01 * (n - 1)  # noqa: E731  (verifying is nearly free: a GPU at small batch)


def test_policy_drafts_only_where_it_pays(models):
    from saspec.policy import SequencePolicy

    target, draft = models["qwen2", "cycle"], models["qwen2", "draft-cycle"]
    prompt = PROMPTS["loop"][1]
    expected = plain(target, prompt, max_new_tokens=40)
    for kw in ({}, {"assistant_model": draft}):
        with ModelClock(target, DEAR, draft, draft_s=0.3) as clock, Forwards(target) as f:
            out = spec(target, prompt, max_new_tokens=40, saspec_policy=SequencePolicy(8, clock=clock), **kw)
        assert torch.equal(out, expected), kw
        decode = clock.t - len(prompt)  # the prefill's forward costs len(prompt)
        assert decode <= 1.03 * 39, (kw, decode, f.n)  # about what plain decoding costs: 39 one-token forwards
    with ModelClock(target, CHEAP) as clock, Forwards(target) as f:
        out = spec(target, prompt, max_new_tokens=40, saspec_policy=SequencePolicy(8, clock=clock))
    assert torch.equal(out, expected) and f.n <= 10  # the long match is drafted in full
    with Forwards(target) as f:  # the default policy times the steps with the real clock
        assert torch.equal(spec(target, prompt, max_new_tokens=40), expected)
    assert f.n < 40
    with pytest.raises(ValueError, match="saspec_policy"):
        spec(target, prompt, max_new_tokens=5, saspec_policy="yes")
    with pytest.raises(ValueError, match="k_max"):
        spec(target, prompt, max_new_tokens=5, saspec_policy=SequencePolicy(2))


def test_policy_times_every_step_but_the_prefill_and_is_offered_every_draft(models):
    from saspec.policy import SequencePolicy

    class Recording(SequencePolicy):
        def observe_forward(self, n_tokens, seconds):
            timed.append((n_tokens, seconds))
            super().observe_forward(n_tokens, seconds)

        def offer(self, match, draft, branched=False):
            offers.append(len(draft))
            super().offer(match, draft, branched)

    target = models["qwen2", "cycle"]
    prompt = PROMPTS["loop"][1]
    timed, offers = [], []
    expected = plain(target, prompt, max_new_tokens=40)
    with ModelClock(target, CHEAP) as clock, Forwards(target) as f:
        assert torch.equal(spec(target, prompt, max_new_tokens=40, saspec_policy=Recording(8, clock=clock)), expected)
    assert len(timed) == f.n - 1 and len(offers) == f.n  # every step offers; the prefill is not timed
    assert all(s == pytest.approx(CHEAP(n)) for n, s in timed)  # a step's time is its forward's


def test_policy_on_a_random_model_takes_few_more_forwards_than_the_fixed_rules():
    """A tiny random Qwen2 after a prompt repeating a 30-token block: the
    automaton's copies stop paying soon after the prompt ends. With the step
    costs of such a model (a fixed overhead, then a little per token) the policy
    takes at most 1.3x the forwards of the fixed rules."""
    from saspec.policy import SequencePolicy

    torch.manual_seed(3)
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False, use_cache=True,
                  bos_token_id=None, eos_token_id=None)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).float().eval()
    model.generation_config.pad_token_id = 0
    block = np.random.default_rng(0).integers(1, 512, 30).tolist()
    prompt = block * 4
    with Forwards(model) as fixed:
        expected = spec(model, prompt, max_new_tokens=60, saspec_policy=False)
    tiny = lambda n: 1.0 if n == 1 else 1.4 + 0.03 * (n - 2)  # noqa: E731  (as timed on this model, whole steps)
    with ModelClock(model, tiny) as clock, Forwards(model) as gated:
        assert torch.equal(spec(model, prompt, max_new_tokens=60, saspec_policy=SequencePolicy(8, clock=clock)), expected)
    assert gated.n <= 1.3 * fixed.n, (gated.n, fixed.n)


def test_a_step_timed_at_zero_seconds_is_skipped_and_the_old_gate_argument_warns(models):
    from saspec.policy import SequencePolicy

    target = models["qwen2", "cycle"]
    prompt = PROMPTS["loop"][1]
    expected = plain(target, prompt, max_new_tokens=20)
    policy = SequencePolicy(8, clock=lambda: 0.0)  # a clock that never moves: every step takes 0 s
    assert torch.equal(spec(target, prompt, max_new_tokens=20, saspec_policy=policy), expected)
    assert policy.stats["timed"] == 0 and policy.stats["sa"] > 0
    with pytest.warns(DeprecationWarning, match="saspec_gate"):
        assert torch.equal(spec(target, prompt, max_new_tokens=20, saspec_gate=False), expected)


def test_a_pool_kept_across_calls_drafts_from_the_earlier_outputs(models):
    from saspec import RequestPool

    target = models["qwen2", "cycle"]
    prompt = PROMPTS["enter-loop"][1]  # its first lap of the cycle has nothing to copy from in its own text
    expected = plain(target, prompt, max_new_tokens=60)
    pool = RequestPool(10_000)
    with Forwards(target) as first:
        assert torch.equal(spec(target, prompt, max_new_tokens=60, saspec_policy=False, saspec_pool=pool), expected)
    pool.flush()
    assert pool.stats()["texts"] == 1 and pool.tokens == 61, pool.stats()  # the whole output and a separator
    with Forwards(target) as second:
        assert torch.equal(spec(target, prompt, max_new_tokens=60, saspec_policy=False, saspec_pool=pool), expected)
    assert second.n < first.n, "the second call copies the first one's lap of the cycle from the pool"
    with pytest.raises(ValueError, match="saspec_pool"):
        spec(target, prompt, max_new_tokens=5, saspec_pool=object())
