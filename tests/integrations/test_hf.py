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

from saspec.drafter import Drafter  # noqa: E402
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


def test_fixed_rules_let_the_assistant_follow_its_schedule_up_to_the_drafters_widest_step(models):
    """With the fixed rules the assistant drafts as transformers schedules it, past K, up to
    MAX_ASSISTANT_TOKENS a step (the drafter is built for such steps), or a given drafter's widest step
    (its max_step_tokens less one), and never past the request's cap. An assistant identical to the
    target drafts 100 tokens a step, all accepted, where the automaton never matches."""
    target = models["qwen2", "count"]
    draft = tiny("qwen2", 2, COUNT)  # the target's twin (the fixture's seed)
    draft.generation_config.num_assistant_tokens = 100
    draft.generation_config.assistant_confidence_threshold = 0.0  # no early stop
    prompt = PROMPTS["count"][1]
    expected = plain(target, prompt, max_new_tokens=150)
    with Forwards(target) as f:
        assert torch.equal(plain(target, prompt, max_new_tokens=150, assistant_model=draft), expected)
    assert f.n == 2 and sahf.MAX_ASSISTANT_TOKENS == 64  # 101 tokens, then the 49 left

    def forwards(**kw):
        with Forwards(target) as f:
            assert torch.equal(spec(target, prompt, max_new_tokens=150, assistant_model=draft, **kw), expected), kw
        return f.n

    assert forwards(saspec_policy=False) == 3  # 65, 65, then 20 tokens a step
    assert forwards(saspec_policy=False, saspec_options={"max_draft_tokens": 5}) == 25  # 6 tokens a step
    with Drafter(8, length_rule="fixed", min_match=4) as narrow, \
            Drafter(8, length_rule="fixed", min_match=4, max_step_tokens=31) as wide:
        assert forwards(saspec_drafter=narrow) == 17  # K + 1 tokens a step
        assert forwards(saspec_drafter=wide) == 5  # 31 tokens a step


@pytest.mark.parametrize("policy", [False, True])
def test_hybrid_where_the_automaton_drafts_first(models, policy):
    """The automaton matches at once and the assistant takes over later: with the fixed rules its first
    call must still come at the first step (it expects the prompt alone); the policy starts it later,
    extending its attention mask to the text it first reads."""
    from saspec.policy import NEURAL, PolicySettings

    target, draft = models["qwen2", "count"], models["qwen2", "draft-count"]
    prompt = [200, 201, 202, *range(50, 66), 210, 211, *range(50, 56)]  # matched at once; counting runs past 65
    expected = plain(target, prompt, max_new_tokens=30)
    # The policy on a modeled clock (cheap verification, a cheap and good assistant): deterministic, and
    # the assistant pays once the automaton has nothing to offer.
    good = PolicySettings(neural_prior=0.9, neural_cost=0.05)
    with ModelClock(target, CHEAP, draft, draft_s=0.001) as clock, Forwards(draft) as d:
        sources = []
        drafter = Drafter(8, min_match=1, policy_settings=good, clock=clock,
                          log=lambda decision: sources.append(int(decision.sources[0])))
        kw = {"saspec_drafter": drafter} if policy else {"saspec_policy": False}
        with drafter:
            out = spec(target, prompt, max_new_tokens=30, assistant_model=draft,
                       attention_mask=torch.ones(1, len(prompt), dtype=torch.long), **kw)
    assert torch.equal(out, expected)
    assert d.n > 0
    if policy:  # the policy drafted from the automaton first, then started the assistant
        assert sources[0] != NEURAL and NEURAL in sources and drafter.stats()["neural_rows"] > 0


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
    """The drafter's fixed rules reach the candidates: ``per-match-recent`` drafts 2 tokens after an
    automaton draft missed at once, where ``per-match`` drafts all K after the same match."""
    text = [6, 7, 8, 9, 3, 1, 1, 6, 7, 8, 9, 1, 2, 3, 4, 0, 6, 7, 8, 9]  # the suffix 6 7 8 9 occurred twice

    def draft(ids, gen):
        return gen.get_candidates(ids_of(ids))[0][0, len(ids):].tolist()

    def steps(**kw):
        with Drafter(8, min_match=1, **kw) as d:
            gen = sahf.SACandidateGenerator(ids_of(text), drafter=d, max_length=100, eos_token_ids=[])
            first = draft(text, gen)
            gen.update_candidate_strategy(ids_of(text), None, 0)  # the draft missed at once: the target
            miss = [3 if first[0] == 1 else 1]  # wrote the other occurrence's next token
            return first, draft(text + miss, gen)

    assert steps(length_rule="fixed")[0] in ([1, 2, 3, 4, 0, 6, 7, 8], [3, 1, 1, 6, 7, 8, 9, 1])
    assert len(steps(length_rule="per-match", length_scale=0.5)[0]) == 2  # half a token per matched token
    first, after = steps(length_rule="per-match")
    assert len(first) == 8 and len(after) == 8  # a match of 5 after the miss: 2 per matched token, at most K
    first, after = steps(length_rule="per-match-recent")
    assert len(first) == 8 and len(after) == 2  # 2 * 0 + 2 after a draft with nothing accepted


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
    with pytest.raises(ValueError, match="draft-length rule 'longest'"):
        spec(target, prompt, max_new_tokens=5, saspec_length_rule="longest", saspec_policy=False)
    with pytest.raises(ValueError, match="saspec_threshold"):
        spec(target, prompt, max_new_tokens=5, saspec_threshold=0, saspec_policy=False)


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


def test_integrations_doc_example(models):
    """docs/integrations.md's drafter kept across calls runs as written, each output greedy's."""
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "integrations.md").read_text()
    code = re.search(r"```python\n(with sahf\.drafter_for.*?)```", doc, re.S).group(1)
    model = models["llama", "cycle"]
    prompts = [ids_of(PROMPTS["enter-loop"][1]), ids_of(PROMPTS["loop"][1])]
    printed = []
    scope = {"sahf": sahf, "model": model, "prompts": prompts, "print": printed.append}
    exec(compile(code.replace("256", "24"), "docs/integrations.md", "exec"), scope)
    assert torch.equal(scope["out"], plain(model, PROMPTS["loop"][1], max_new_tokens=24))
    assert printed[0]["finished"] == 2 and printed[0]["policy_steps"] > 0


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


def test_generators_sharing_a_drafter():
    """Each generator feeds and drafts its own request when they share one drafter, steps interleaved."""
    kw = dict(max_length=100, eos_token_ids=[])
    a, b = [5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 4, 1, 2]

    def tail(gen, ids):
        return gen.get_candidates(ids_of(ids))[0][0, len(ids):].tolist()

    fixed = dict(length_rule="fixed", min_match=1)
    with Drafter(4, **fixed) as alone_a, Drafter(4, **fixed) as alone_b:
        ga = sahf.SACandidateGenerator(ids_of(a), drafter=alone_a, **kw)
        gb = sahf.SACandidateGenerator(ids_of(b), drafter=alone_b, **kw)
        want = [tail(ga, a), tail(gb, b), tail(ga, a + [8]), tail(gb, b + [3])]
    assert want[0] == [8, 9, 5, 6] and want[1] == [3, 4, 1, 2]
    with Drafter(4, **fixed) as d:
        ga = sahf.SACandidateGenerator(ids_of(a), drafter=d, **kw)
        gb = sahf.SACandidateGenerator(ids_of(b), drafter=d, **kw)
        assert [tail(ga, a), tail(gb, b), tail(ga, a + [8]), tail(gb, b + [3])] == want
        assert len(d) == 2
        ga.close()
        ga.close()
        assert ga.request_id not in d and gb.request_id in d


def test_policy_drafts_respect_the_length_limit(models):
    """A fresh policy verifies a near-certain copy in full from its first step, cut to the room left; without
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
    target, draft = models["qwen2", "cycle"], models["qwen2", "draft-cycle"]
    prompt = PROMPTS["loop"][1]
    expected = plain(target, prompt, max_new_tokens=40)
    for kw in ({}, {"assistant_model": draft}):
        with ModelClock(target, DEAR, draft, draft_s=0.3) as clock, Forwards(target) as f, \
                sahf.drafter_for(assistant=bool(kw), clock=clock) as drafter:  # the defaults, on the clock
            out = spec(target, prompt, max_new_tokens=40, saspec_drafter=drafter, **kw)
        assert torch.equal(out, expected), kw
        decode = clock.t - len(prompt)  # the prefill's forward costs len(prompt)
        assert decode <= 1.03 * 39, (kw, decode, f.n)  # about what plain decoding costs: 39 one-token forwards
    with ModelClock(target, CHEAP) as clock, Forwards(target) as f, sahf.drafter_for(clock=clock) as drafter:
        out = spec(target, prompt, max_new_tokens=40, saspec_drafter=drafter)
    assert torch.equal(out, expected) and f.n <= 10  # the long match is drafted in full
    with Forwards(target) as f:  # the default policy times the steps with the real clock
        assert torch.equal(spec(target, prompt, max_new_tokens=40), expected)
    assert f.n < 40


def test_refused_policy_and_drafter_settings(models):
    target = models["qwen2", "cycle"]
    prompt = PROMPTS["loop"][1]
    with pytest.raises(ValueError, match="saspec_policy"):
        spec(target, prompt, max_new_tokens=5, saspec_policy="yes")
    with pytest.raises(ValueError, match="saspec_policy.*saspec_drafter"):  # an object of its own goes there
        spec(target, prompt, max_new_tokens=5, saspec_policy=object())
    with pytest.raises(TypeError, match="saspec_drafter must be a saspec.drafter.Drafter"):
        spec(target, prompt, max_new_tokens=5, saspec_drafter=object())
    with Drafter(8) as drafter:
        with pytest.raises(ValueError, match="drop saspec_k, saspec_pool"):
            spec(target, prompt, max_new_tokens=5, saspec_drafter=drafter, saspec_k=4, saspec_pool=object())
        assert len(drafter) == 0 and drafter.stats()["steps"] == 0  # refused before it was used
    with pytest.raises(ValueError, match="saspec_kk"):  # transformers refuses keywords nobody takes
        spec(target, prompt, max_new_tokens=5, saspec_kk=4)
    assert "_get_candidate_generator" not in vars(target)


def test_drafter_for_builds_what_generate_builds():
    from saspec.policy import PolicySettings
    from saspec.step_cost import cpu_like, gpu_like

    with sahf.drafter_for() as cpu, sahf.drafter_for("cuda", saspec_k=4) as gpu:
        assert cpu.k == sahf.DEFAULT_K == 8 and gpu.k == 4 and cpu.drafts.k == 8
        n = np.arange(1, 10, dtype=np.float64)
        np.testing.assert_allclose(cpu.policy.cost.shape[1:10], cpu_like(n))  # the prior shape by the device
        np.testing.assert_allclose(gpu.policy.cost.shape[1:5], gpu_like(n[:4]))
    settings = PolicySettings(neural_prior=0.9)
    with sahf.drafter_for(saspec_policy=settings) as d:
        assert d.policy.settings is settings
    with sahf.drafter_for(saspec_policy=False) as alone, sahf.drafter_for(assistant=True, saspec_policy=False) as hy:
        assert alone.policy is None and alone.length_rule == "per-match" and alone.drafts.min_match == 1
        assert alone.drafts.k == 8 and hy.drafts.k == sahf.MAX_ASSISTANT_TOKENS and hy.drafts.min_match == 4
    for bad, name in (({"saspec_k": 0}, "saspec_k"), ({"saspec_k": True}, "saspec_k"),
                      ({"saspec_threshold": 1.5}, "saspec_threshold"), ({"saspec_length_scale": 0}, "scale"),
                      ({"saspec_policy": "yes"}, "saspec_policy"), ({"saspec_pool": 10}, "saspec_pool")):
        with pytest.raises(ValueError, match=name):
            sahf.drafter_for(**bad)


def test_policy_times_every_step_but_the_prefill_and_is_offered_every_draft(models):
    class Recording(Drafter):
        """Records each step's timing: the ``seconds`` given, else the drafter's clock from the last step's
        return (or ``mark_forward``) to the call, as ``Drafter.step`` documents."""

        mark = None

        def step(self, *args, **kw):
            seconds = kw.get("seconds")
            if seconds is None and self.mark is not None:
                seconds = self.clock() - self.mark
            timed.append((kw.get("step_tokens"), seconds))
            out = super().step(*args, **kw)
            self.mark = self.clock()
            return out

        def mark_forward(self):
            super().mark_forward()
            self.mark = self.clock()

    target, draft = models["qwen2", "cycle"], models["qwen2", "draft-cycle"]
    prompt = PROMPTS["enter-loop"][1]  # a lap of the cycle with nothing to copy first, then long copies
    expected = plain(target, prompt, max_new_tokens=40)
    from saspec.policy import PolicySettings

    good = PolicySettings(neural_prior=0.9, neural_cost=0.05)  # a cheap and good assistant: it drafts
    for kw in ({}, {"assistant_model": draft}):
        timed = []
        with ModelClock(target, CHEAP, draft, draft_s=0.5) as clock, Forwards(target) as f, \
                Recording(8, clock=clock, min_match=1, policy_settings=good) as drafter:
            assert torch.equal(spec(target, prompt, max_new_tokens=40, saspec_drafter=drafter, **kw), expected)
        st = drafter.stats()
        # every forward's step drafts (or not), and a last step hands over the last forward's tokens
        assert st["steps"] == len(timed) == f.n + 1
        assert st["policy_timed"] == f.n - 1 and st["policy_ignored_timings"] == 1  # the prefill is not timed
        assert timed[0] == (0, None) and timed[1][1] != timed[1][1]  # the first step, then the prefill's: NaN
        assert all(s == pytest.approx(CHEAP(n)) for n, s in timed[2:]), timed  # a step's time is its forward's
        assert st["drafted_rows"] > 0 and (st["neural_rows"] > 0) == bool(kw), st


def test_policy_on_a_random_model_takes_few_more_forwards_than_the_fixed_rules():
    """A tiny random Qwen2 after a prompt repeating a 30-token block: the
    automaton's copies stop paying soon after the prompt ends. With the step
    costs of such a model (a fixed overhead, then a little per token) the policy
    takes at most 1.3x the forwards of the fixed rules."""
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
    with ModelClock(model, tiny) as clock, Forwards(model) as policy, sahf.drafter_for(clock=clock) as drafter:
        assert torch.equal(spec(model, prompt, max_new_tokens=60, saspec_drafter=drafter), expected)
    assert policy.n <= 1.3 * fixed.n, (policy.n, fixed.n)


def test_a_step_timed_at_zero_seconds_is_skipped(models):
    target = models["qwen2", "cycle"]
    prompt = PROMPTS["loop"][1]
    expected = plain(target, prompt, max_new_tokens=20)
    with Drafter(8, clock=lambda: 0.0) as drafter:  # a clock that never moves: every step takes 0 s
        assert torch.equal(spec(target, prompt, max_new_tokens=20, saspec_drafter=drafter), expected)
    st = drafter.stats()
    assert st["policy_timed"] == 0 and st["policy_ignored_timings"] > 0 and st["policy_automaton_rows"] > 0


def test_a_pool_kept_across_calls_drafts_from_the_earlier_outputs(models):
    from saspec import RequestPool

    target = models["qwen2", "cycle"]
    prompt = PROMPTS["enter-loop"][1]  # its first lap of the cycle has nothing to copy from in its own text
    expected = plain(target, prompt, max_new_tokens=60)
    pool = RequestPool(10_000)
    try:
        with Forwards(target) as first:
            assert torch.equal(spec(target, prompt, max_new_tokens=60, saspec_policy=False, saspec_pool=pool),
                               expected)
        pool.flush()
        # the output exactly (the pool keeps no prompt token by default) and a separator
        assert [t.tolist() for t in pool.texts()] == [expected[0, len(prompt):].tolist()]
        assert pool.stats()["texts"] == 1 and pool.tokens == 61, pool.stats()
        with Forwards(target) as second:
            assert torch.equal(spec(target, prompt, max_new_tokens=60, saspec_policy=False, saspec_pool=pool),
                               expected)
        assert second.n < first.n, "the second call copies the first one's lap of the cycle from the pool"
    finally:
        pool.close()
    with pytest.raises(ValueError, match="saspec_pool"):
        spec(target, prompt, max_new_tokens=5, saspec_pool=object())


def test_a_drafter_serves_several_calls(models):
    """One drafter across calls: each call is a new request, finished when it ends; its pool and the
    policy's evidence carry over (the second call copies the first one's output from the pool)."""
    target = models["qwen2", "cycle"]
    prompt = PROMPTS["enter-loop"][1]
    expected = plain(target, prompt, max_new_tokens=60)
    with ModelClock(target, CHEAP) as clock, Drafter(8, clock=clock, min_match=1, pool_tokens=10_000) as drafter:
        with Forwards(target) as first:
            assert torch.equal(spec(target, prompt, max_new_tokens=60, saspec_drafter=drafter), expected)
        st = drafter.stats()
        assert len(drafter) == 0 and st["finished"] == 1 and st["policy_timed"] == first.n - 1
        drafter.pool.flush(timeout=60)
        with Forwards(target) as second:
            assert torch.equal(spec(target, prompt, max_new_tokens=60, saspec_drafter=drafter), expected)
        st2 = drafter.stats()
    assert second.n < first.n and st2["pool_rows"] > 0
    assert st2["finished"] == 2 and st2["policy_timed"] == st["policy_timed"] + second.n - 1
    assert drafter.pool.closed  # the drafter made its pool and closed it; generate never closes a given drafter
