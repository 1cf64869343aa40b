"""The speculative decoding loop is token-identical to plain greedy decoding.

Tiny Qwen2-architecture models (2 layers, hidden 64), randomly initialised
with fixed seeds, fp32, built from a ``Qwen2Config``: nothing is downloaded.

"Successor" models make greedy output predictable enough to steer the SA: the
embedding is large and random, and the LM head row of ``succ[t]`` is token
``t``'s embedding, so the argmax after token ``t`` is ``succ[t]`` (the random
attention/MLP layers only perturb the hidden state slightly, but they are
computed, cached and cropped like in any model).

* cycle: ``succ`` is a permutation made of cycles, and the prompt walks one of
  them, so the output loops and the SA drafts long accepted runs;
* count: ``succ[t] = t + 1`` and the prompt avoids the tokens the output will
  count through, so no output token was seen before: the SA never matches.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from saspec_bench.loop import (  # noqa: E402
    DRAFTERS,
    SMALL_ROWS,
    SAModelDrafter,
    ModelDrafter,
    SADrafter,
    fast_small_linears,
    hf_generate,
    make_drafter,
    speculative_generate,
)

V = 256
NO_EOS: tuple[int, ...] = ()


def tiny_model(seed: int, succ: np.ndarray | None = None) -> torch.nn.Module:
    """A 2-layer Qwen2 LM with vocabulary V; with ``succ`` a successor model (see module doc)."""
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                   tie_word_embeddings=False, use_cache=True)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg).float().eval()
    if succ is not None:
        g = torch.Generator().manual_seed(seed + 1)
        emb = torch.randn(V, 64, generator=g)
        head = torch.empty_like(emb)
        head[torch.as_tensor(succ)] = emb  # row succ[t] = emb[t]
        with torch.no_grad():
            model.model.embed_tokens.weight.copy_(emb)
            model.lm_head.weight.copy_(head)
    return model


def cycles(lengths: list[int], seed: int) -> np.ndarray:
    """A permutation of range(V) made of cycles of the given lengths, the remaining tokens one more cycle."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(V)
    succ = np.empty(V, np.int64)
    start = 0
    for n in [*lengths, V - sum(lengths)]:
        cyc = order[start:start + n]
        succ[cyc] = np.roll(cyc, -1)
        start += n
    return succ


COUNT = (np.arange(V) + 1) % V
CYCLE = cycles([13, 29], seed=5)


def cycle_start(succ: np.ndarray, length: int) -> int:
    """Smallest token on a cycle of ``length`` tokens of the permutation ``succ``."""
    for t in range(V):
        if walk(succ, t, length + 1)[-1] == t and len(set(walk(succ, t, length))) == length:
            return t
    raise ValueError(f"no cycle of length {length}")


def walk(succ: np.ndarray, start: int, n: int) -> list[int]:
    out = [start]
    for _ in range(n - 1):
        out.append(int(succ[out[-1]]))
    return out


def perturbed(succ: np.ndarray, frac: float, seed: int) -> np.ndarray:
    """``succ`` with about ``frac`` of its entries swapped around (still a permutation)."""
    rng = np.random.default_rng(seed)
    out = succ.copy()
    idx = rng.choice(V, size=int(frac * V), replace=False)
    out[idx] = out[rng.permutation(idx)]
    return out


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {
        "random": tiny_model(0),
        "cycle": tiny_model(1, CYCLE),
        "count": tiny_model(2, COUNT),
        "draft-close": tiny_model(3, perturbed(CYCLE, 0.3, 7)),
        "draft-count": tiny_model(4, perturbed(COUNT, 0.3, 8)),
        "draft-random": tiny_model(5),
    }


def greedy(model, prompt, max_new_tokens, eos=NO_EOS) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                         eos_token_id=list(eos) or None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


RNG = np.random.default_rng(0)
PROMPTS = {
    # cycle model, prompt walks the 29-cycle twice after some noise: SA matches from the start
    "loop": ("cycle", RNG.integers(0, V, 20).tolist() + walk(CYCLE, cycle_start(CYCLE, 29), 58)),
    # cycle model, prompt off the 13-cycle but for its last token: the output runs the
    # 13-cycle, which the SA matches from its second lap on
    "enter-loop": ("cycle", [t for t in RNG.integers(0, V, 45).tolist() if t not in walk(CYCLE, cycle_start(CYCLE, 13), 13)]
                   + [cycle_start(CYCLE, 13)]),
    # counting model: prompt tokens from [200, 256) then 0; output 1, 2, 3, ... never seen before
    "count": ("count", RNG.integers(200, V, 30).tolist() + [0]),
    # a plain random model
    "random": ("random", RNG.integers(0, V, 25).tolist()),
}
DRAFT_FOR = {"cycle": "draft-close", "count": "draft-count", "random": "draft-random"}


def run(models, prompt_name, kind, max_new=60, eos=NO_EOS, options=None, **kw):
    target_name, prompt = PROMPTS[prompt_name]
    drafter = make_drafter(kind, draft_model=models[DRAFT_FOR[target_name]], **kw)
    return speculative_generate(models[target_name], prompt, drafter, max_new, eos, options)


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_identical_to_hf_greedy(models, prompt_name, kind):
    target_name, prompt = PROMPTS[prompt_name]
    res = run(models, prompt_name, kind, k=5)
    assert res.tokens == greedy(models[target_name], prompt, 60)
    st = res.stats
    assert st.new_tokens == 60
    assert sum(st.steps.values()) == st.target_forwards
    assert 1.0 <= st.al <= 6.0
    if kind == "none":
        assert st.target_forwards == 60
    if kind in ("none", "sa"):
        assert st.draft_forwards == 0


def test_sa_fires_on_repetitive_output(models):
    for prompt_name in ("loop", "enter-loop"):
        for kind in ("sa", "hybrid"):
            st = run(models, prompt_name, kind, k=8).stats
            assert st.steps["sa"] > 0, (prompt_name, kind)
            assert st.accepted["sa"] / st.steps["sa"] > 1.0, (prompt_name, kind)
            assert st.al > 2.0, (prompt_name, kind, st.al)
    # the prompt already holds the loop: nearly every step is a full SA draft
    st = run(models, "loop", "sa", k=8).stats
    assert st.al > 6.0
    assert st.frac("sa") == 1.0


def test_sa_never_fires_on_new_tokens(models):
    target_name, prompt = PROMPTS["count"]
    out = run(models, "count", "none").tokens
    assert out == list(range(1, 61))  # the model counts, and no output token occurs earlier
    for kind in ("sa", "hybrid"):
        st = run(models, "count", kind, k=8).stats
        assert st.steps["sa"] == 0
        assert st.drafted["sa"] == 0
    st = run(models, "count", "sa", k=8).stats
    assert st.target_forwards == 60  # nothing drafted: plain greedy
    st = run(models, "count", "hybrid", k=8).stats
    assert st.frac("draft") == 1.0 and st.al > 1.5  # the close draft model carries it
    st = run(models, "count", "hybrid", k=8, patience=5).stats
    assert st.frac("draft") == 1.0  # patience never holds back the draft model when the SA has no draft


def test_hybrid_runs_draft_model_only_when_picked(models):
    draft_only = run(models, "enter-loop", "draft", k=8).stats
    hybrid = run(models, "enter-loop", "hybrid", k=8).stats
    assert hybrid.steps["sa"] > 0 and hybrid.steps["draft"] > 0
    assert hybrid.draft_forwards < draft_only.draft_forwards
    assert hybrid.al >= draft_only.al


def test_eos_stops_like_hf(models):
    target_name, prompt = PROMPTS["count"]
    expected = greedy(models[target_name], prompt, 60, eos=(17,))
    assert expected == list(range(1, 18))
    for kind in DRAFTERS:
        res = run(models, "count", kind, eos=(17,), k=6)
        assert res.tokens == expected, kind
    target_name, prompt = PROMPTS["loop"]
    eos = (int(greedy(models[target_name], prompt, 30)[25]),)  # a token inside a long accepted SA run
    expected = greedy(models[target_name], prompt, 60, eos=eos)
    for kind in DRAFTERS:
        assert run(models, "loop", kind, eos=eos, k=8).tokens == expected, kind


@pytest.mark.parametrize("max_new", [1, 2, 7, 9, 10])
def test_max_new_tokens_boundaries(models, max_new):
    target_name, prompt = PROMPTS["loop"]
    expected = greedy(models[target_name], prompt, max_new)
    for kind in DRAFTERS:
        res = run(models, "loop", kind, max_new=max_new, k=8)
        assert res.tokens == expected, kind
        assert res.stats.new_tokens == max_new
        # one draft-model forward per draft token: none is spent on tokens past max_new_tokens
        assert res.stats.draft_forwards == res.stats.drafted["draft"], kind


@pytest.mark.parametrize("policy", [False, True])
@pytest.mark.parametrize("kind", DRAFTERS)
def test_propose_keeps_to_the_limit(models, kind, policy):
    """``propose(seq, limit)`` returns at most ``limit`` tokens, and at limit 0
    none, without running the draft model."""
    target_name, prompt = PROMPTS["loop"]
    draft_model = models[DRAFT_FOR[target_name]]
    for limit in (0, 2):
        drafter = make_drafter(kind, draft_model=draft_model, k=8, policy=policy)
        lm = getattr(drafter, "lm", None) or getattr(getattr(drafter, "model", None), "lm", None)
        drafter.begin(prompt)
        tokens, source = drafter.propose(list(prompt), limit)
        assert len(tokens) <= limit, (kind, limit)
        if limit == 0:
            assert lm is None or lm.forwards == 0, kind
        drafter.end()


def test_draft_k_larger_than_sa_k_and_early_stop(models):
    """More accepted tokens per step than the SA's K+1 (fed to the engine in chunks),
    and the draft model's confidence stop."""
    target_name, prompt = PROMPTS["enter-loop"]
    expected = greedy(models[target_name], prompt, 80)
    draft = models[DRAFT_FOR[target_name]]
    drafter = SAModelDrafter(SADrafter(k=3), ModelDrafter(draft, k=12), threshold=2)
    assert speculative_generate(models[target_name], prompt, drafter, 80, NO_EOS).tokens == expected
    drafter = ModelDrafter(draft, k=12, stop_below=0.9)
    res = speculative_generate(models[target_name], prompt, drafter, 80, NO_EOS)
    assert res.tokens == expected


@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_sa_draft_capped_per_matched_token(models, prompt_name):
    target_name, prompt = PROMPTS[prompt_name]
    expected = greedy(models[target_name], prompt, 60)
    for kind in ("sa", "hybrid"):
        res = run(models, prompt_name, kind, k=8, per_match=1.5, threshold=2)
        assert res.tokens == expected, kind
    for patience in (1, 3):
        res = run(models, prompt_name, "hybrid", k=8, per_match=2.0, patience=patience)
        assert res.tokens == expected, patience
    sa = SADrafter(k=8, per_match=1.0)
    sa.begin(prompt)
    seq = list(prompt)
    for t in expected[:20]:
        draft, source = sa.propose(seq)
        assert len(draft) <= sa.match
        seq.append(t)
        sa.update(seq, 1)
    sa.end()


def test_hf_baselines_match(models):
    target_name, prompt = PROMPTS["enter-loop"]
    target, draft = models[target_name], models[DRAFT_FOR[target_name]]
    expected = greedy(target, prompt, 40)
    plain = hf_generate(target, prompt, 40, NO_EOS)
    assert plain.tokens == expected and plain.stats.target_forwards == 40
    lookup = hf_generate(target, prompt, 40, NO_EOS, prompt_lookup=5)
    assert lookup.tokens == expected and lookup.stats.target_forwards < 40
    assisted = hf_generate(target, prompt, 40, NO_EOS, assistant=draft)
    assert assisted.tokens == expected and assisted.stats.draft_forwards > 0


def test_bad_arguments(models):
    with pytest.raises(ValueError, match="unknown drafter"):
        make_drafter("eagle")
    with pytest.raises(ValueError, match="needs a draft model"):
        make_drafter("hybrid")
    with pytest.raises(ValueError, match="prompt is empty"):
        speculative_generate(models["random"], [], make_drafter("none"), 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(models["random"], [1, 2], make_drafter("none"), 0)


# -- dtype choice and the prefill / decode split ------------------------------------

X86_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
X86_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_pick_dtype():
    from saspec_bench.lm import cpu_flags, pick_dtype

    assert cpu_flags(X86_AVX2) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert "bf16" in cpu_flags(ARM_BF16)
    assert pick_dtype("auto", cpu_flags(X86_AVX2))[0] == "float32"
    assert pick_dtype("auto", cpu_flags(X86_BF16))[0] == "bfloat16"
    assert pick_dtype("auto", cpu_flags(ARM_BF16))[0] == "bfloat16"
    name, why = pick_dtype("auto", cpu_flags(X86_AVX2))
    assert "lacks native bf16" in why
    assert pick_dtype("bfloat16", cpu_flags(X86_AVX2)) == ("bfloat16", "as requested")
    assert pick_dtype("float32", cpu_flags(X86_BF16)) == ("float32", "as requested")
    assert pick_dtype("auto")[0] in ("float32", "bfloat16")  # this machine's /proc/cpuinfo
    with pytest.raises(ValueError, match="unknown dtype"):
        pick_dtype("float16")
    from saspec_bench.cli import build_parser

    parser = build_parser()
    for cmd in (["generate", "--prompt", "x"], ["bench-e2e"]):
        assert parser.parse_args(cmd).dtype == "auto"
        assert parser.parse_args([*cmd, "--dtype", "float32"]).dtype == "float32"


def test_prefill_and_decode_are_timed_apart(models):
    target_name, prompt = PROMPTS["loop"]
    st = run(models, "loop", "sa", k=8).stats
    assert st.dtype == "float32"
    # the first forward (prompt + drafts made from the prompt) emits 1 + accepted drafts: the loop is in the prompt
    assert 2 <= st.prefill_tokens <= 9
    assert st.decode_tokens == st.new_tokens - st.prefill_tokens
    assert 0 < st.prefill_s < st.wall_s
    assert st.decode_s == pytest.approx(st.wall_s - st.prefill_s)
    assert st.decode_tok_per_s == pytest.approx(st.decode_tokens / st.decode_s)
    d = st.as_dict()
    assert {"dtype", "prefill_s", "prefill_tokens", "decode_s", "decode_tokens", "decode_tok_per_s"} <= set(d)
    assert "float32" in st.summary() and "decode" in st.summary()
    plain = hf_generate(models[target_name], prompt, 30, NO_EOS)
    assert plain.stats.prefill_tokens == 1 and plain.stats.decode_tokens == 29  # plain greedy: one token per step
    assert 0 < plain.stats.prefill_s < plain.stats.wall_s and plain.stats.dtype == "float32"
    lookup = hf_generate(models[target_name], prompt, 30, NO_EOS, prompt_lookup=8)
    assert lookup.stats.prefill_tokens > 1  # the first step already accepted prompt-lookup drafts
    one = run(models, "count", "none", max_new=1).stats
    assert (one.prefill_tokens, one.decode_tokens, one.decode_tok_per_s) == (1, 0, 0.0)


def test_dtype_is_the_models(models):
    bf16 = tiny_model(0).to(torch.bfloat16)
    res = speculative_generate(bf16, PROMPTS["random"][1], make_drafter("sa"), 3, NO_EOS)
    assert res.stats.dtype == "bfloat16" and len(res.tokens) == 3
    assert hf_generate(bf16, PROMPTS["random"][1], 2, NO_EOS).stats.dtype == "bfloat16"


def test_bench_report_shows_dtype_and_decode(models):
    from saspec_bench.commands.e2e import format_report, summarize

    target_name, prompt = PROMPTS["enter-loop"]
    runs = []
    for method, res in (("hf-plain", hf_generate(models[target_name], prompt, 30, NO_EOS)),
                        ("sa", run(models, "enter-loop", "sa", max_new=30, k=8))):
        runs.append({"prompt": "p0", "kind": "code-edit", "method": method, "prompt_tokens": len(prompt),
                     "contention": 0.0, "tries": 1, "exact": True, **res.stats.as_dict()})
    summary = summarize(runs, ["hf-plain", "sa"])
    a, base = summary["code-edit"]["sa"], summary["code-edit"]["hf-plain"]
    assert a["decode_tok_per_s"] == pytest.approx(runs[1]["decode_tokens"] / runs[1]["decode_s"])
    assert a["decode_speedup"] == pytest.approx(a["decode_tok_per_s"] / base["decode_tok_per_s"])
    assert a["prefill_s"] == pytest.approx(runs[1]["prefill_s"])
    info = {"target": "tiny", "dtype": "float32", "dtype_reason": "auto: CPU lacks native bf16", "threads": 1,
            "k": 8, "draft_k": 8, "stop_below": 0.0, "threshold": 4, "per_match": 0.0, "patience": 0,
            "prompt_lookup_num_tokens": [8], "torch": "x", "transformers": "y", "cores": 2}
    md = format_report(info, summary, runs, [], {}, ["hf-plain", "sa"])
    assert "(float32)" in md and "auto: CPU lacks native bf16" in md
    assert "| decode tok/s |" in md and "| prefill s |" in md
    assert f"| p0 | sa | float32 | {len(prompt)} | 30 |" in md


# -- the faster product for verify-sized inputs ---------------------------------------


def test_fast_small_linears_keeps_values_and_plain_decoding():
    model = tiny_model(11)
    ref = tiny_model(11)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert fast_small_linears(model) == n_linear
    assert fast_small_linears(model) == n_linear  # idempotent
    ids = torch.tensor([RNG.integers(0, V, 40).tolist()])
    with torch.inference_mode():
        for n in (1, 2, 3, 5, SMALL_ROWS, SMALL_ROWS + 1):
            got, want = model(input_ids=ids[:, :n]).logits, ref(input_ids=ids[:, :n]).logits
            if n == 1 or n > SMALL_ROWS:
                assert torch.equal(got, want), n  # F.linear itself
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    prompt = PROMPTS["random"][1]
    assert greedy(model, prompt, 20) == greedy(ref, prompt, 20)
    res = speculative_generate(model, prompt, make_drafter("sa", k=4), 20, NO_EOS)
    assert res.tokens == greedy(ref, prompt, 20)
    assert fast_small_linears(tiny_model(12).to(torch.bfloat16)) == 0
    with pytest.raises(ValueError, match="max_rows"):
        fast_small_linears(model, 1)


def test_draft_model_proposals_equal_its_fresh_greedy_run(models):
    """After rejections the draft model's cache is cropped back: on the random
    model, whose next token depends on the whole context, every proposal
    equals a fresh (no cache) greedy run of the draft model from the sequence."""
    prompt = PROMPTS["random"][1]
    dm = models["draft-random"]
    for kind, kw in (("draft", dict(k=5)), ("hybrid", dict(k=3, draft_k=7, threshold=2))):
        drafter = make_drafter(kind, draft_model=dm, **kw)
        checked = []
        propose = drafter.propose

        def checking(seq, limit=None, *, propose=propose, checked=checked):
            out, source = propose(seq, limit)
            if source == "draft" and out:
                checked.append(out == greedy(dm, list(seq), len(out)))
            return out, source

        drafter.propose = checking
        assert speculative_generate(models["random"], prompt, drafter, 40, NO_EOS).tokens == \
            greedy(models["random"], prompt, 40)
        assert len(checked) > 5 and all(checked), (kind, checked)


def test_a_rejected_prompt_leaves_the_drafter_usable(models):
    drafter = SADrafter(4)
    with pytest.raises(ValueError):
        speculative_generate(models["cycle"], [-1, 3], drafter, 5, NO_EOS)
    prompt = PROMPTS["loop"][1]
    assert speculative_generate(models["cycle"], prompt, drafter, 5, NO_EOS).tokens == \
        greedy(models["cycle"], prompt, 5)


def test_prompt_shapes_and_drafter_settings_are_checked(models):
    prompt = PROMPTS["loop"][1]
    as_batch = torch.tensor([prompt])
    assert speculative_generate(models["cycle"], as_batch, SADrafter(4), 5, NO_EOS).tokens == \
        greedy(models["cycle"], prompt, 5)
    with pytest.raises(ValueError, match="batch 1"):
        speculative_generate(models["cycle"], torch.tensor([[7], [9]]), SADrafter(4), 5, NO_EOS)
    with pytest.raises(ValueError, match="draft_k"):
        make_drafter("draft", draft_model=models["draft-close"], draft_k=0)
    with pytest.raises(ValueError, match="stop_below"):
        make_drafter("draft", draft_model=models["draft-close"], stop_below=2.0)
    with pytest.raises(ValueError, match="threshold >= 1"):
        make_drafter("hybrid", draft_model=models["draft-close"], threshold=0)


def test_sliding_window_model(models):
    """A cache of sliding-window layers cannot be cropped once its window is full:
    the loop keeps every position, and the window still applies through the masks."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                   tie_word_embeddings=False, use_sliding_window=True, sliding_window=16,
                                   max_window_layers=0)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).float().eval()
    prompt = np.random.default_rng(0).integers(0, V, 40).tolist()
    expected = greedy(model, prompt, 30)
    for kind in ("sa", "draft"):
        drafter = make_drafter(kind, draft_model=models["draft-random"], k=4)
        assert speculative_generate(model, prompt, drafter, 30, NO_EOS).tokens == expected, kind


# -- drafting only where it pays (the policy), under an injected clock -----------

from clocks import ModelClock  # noqa: E402

DEAR = lambda n: float(n)  # noqa: E731  (every verified token costs a forward: bf16 on a CPU without bf16 matmuls)
CHEAP = lambda n: 1.0 + 0.01 * (n - 1)  # noqa: E731  (verifying is nearly free: a GPU at small batch)


@pytest.mark.parametrize("prompt_name", list(PROMPTS))
@pytest.mark.parametrize("kind", ["sa", "draft", "hybrid"])
def test_drafters_with_the_policy_keep_greedy_output(models, prompt_name, kind):
    target_name, prompt = PROMPTS[prompt_name]
    expected = greedy(models[target_name], prompt, 60)
    res = run(models, prompt_name, kind, k=8, policy=True)  # costs timed with the real clock
    assert res.tokens == expected
    assert sum(res.stats.steps.values()) == res.stats.target_forwards


def _with_policy(models, prompt_name, kind, cost, draft_s=0.3, k=8):
    """A run of a drafter with the policy under a clock that the models' forwards advance."""
    target_name, prompt = PROMPTS[prompt_name]
    target, draft = models[target_name], models[DRAFT_FOR[target_name]]
    with ModelClock(target, cost, draft, draft_s) as clock:
        drafter = make_drafter(kind, draft_model=draft, k=k, policy=True, clock=clock)
        res = speculative_generate(target, prompt, drafter, 60, NO_EOS)
    assert res.tokens == greedy(target, prompt, 60)
    return res.stats, clock.t - len(prompt)  # the decode's time: the prefill costs len(prompt)


def test_policy_costs_about_plain_decoding_where_verify_is_dear(models):
    for prompt_name in PROMPTS:
        for kind in ("sa", "draft", "hybrid"):
            st, decode = _with_policy(models, prompt_name, kind, DEAR)
            # plain: 59 one-token forwards. Finding out costs a few steps: the policy takes two timings of
            # a size before it believes it dearer than its prior shape says (one slow timing moves nothing),
            # and a neural step that finds out also pays its draft forwards.
            bound = 1.35
            assert decode <= bound * 59 + 1, (prompt_name, kind, decode, st.steps)


def test_policy_drafts_where_verify_is_cheap(models):
    st, _ = _with_policy(models, "loop", "sa", CHEAP)
    assert st.frac("sa") > 0.6 and st.al > 5.0  # the long copy is drafted at full length
    st, _ = _with_policy(models, "count", "hybrid", CHEAP)
    assert st.steps["sa"] == 0 and st.steps["draft"] > 0 and st.al > 1.5  # no SA match: the close draft model
    st, _ = _with_policy(models, "count", "hybrid", CHEAP, draft_s=5.0)
    assert st.draft_forwards <= 8 + 1  # tried once at its prior cost, then never: a draft token dearer than a step


def test_the_hybrid_drives_its_parts(models):
    for sa_policy, model_policy in ((True, False), (False, True)):
        with pytest.raises(ValueError, match="give them no policy"):
            SAModelDrafter(SADrafter(8, policy=sa_policy), ModelDrafter(models["draft-close"], 8, policy=model_policy),
                           policy=True)


def test_policy_does_not_start_the_draft_model_where_each_verified_token_costs_a_forward(models):
    target_name, prompt = PROMPTS["count"]
    clock = [0.0]
    drafter = ModelDrafter(models[DRAFT_FOR[target_name]], 8, policy=True, clock=lambda: clock[0])
    drafter.begin(prompt)
    seq = list(prompt)
    for _ in range(30):
        draft, _ = drafter.propose(seq, limit=30)
        seq.append(int(seq[-1]) % 50 + 1)
        # each verified token costs a forward
        drafter.update(seq, 1, seconds=0.3 * (1 + len(draft)), tokens=1 + len(draft))
    assert drafter.lm.forwards <= 8 + 1  # tried once at most: the catch-up over the prompt never pays
    drafter.end()


def test_bench_e2e_fixed_methods_run_the_fixed_rules_beside_the_policy(models):
    """``saspec bench-e2e --methods sa,sa-fixed`` interleaves the SA with the policy and the fixed rules in one run."""
    from argparse import Namespace

    from saspec_bench.commands.e2e import run_method

    target_name, prompt = PROMPTS["loop"]
    args = Namespace(k=8, draft_k=8, threshold=4, stop_below=0.0, per_match=2.0, patience=0, policy=True)
    fixed = run_method("sa-fixed", models[target_name], models[DRAFT_FOR[target_name]], prompt, 40, args)
    plain_rules = speculative_generate(models[target_name], prompt, make_drafter("sa", k=8, per_match=2.0), 40)
    assert fixed.tokens == plain_rules.tokens and fixed.stats.target_forwards == plain_rules.stats.target_forwards
    assert fixed.stats.steps == plain_rules.stats.steps


def test_a_pool_across_generations_drafts_from_the_earlier_outputs(models):
    from saspec import RequestPool

    target_name, prompt = PROMPTS["count"]
    expected = greedy(models[target_name], prompt, 60)  # 1, 2, 3, ...: nothing to copy from its own text
    pool = RequestPool(10_000)
    first = run(models, "count", "sa", k=8, pool=pool)
    pool.flush()
    second = run(models, "count", "sa", k=8, pool=pool)
    pool.flush()
    assert first.tokens == second.tokens == expected
    assert first.stats.target_forwards == 60 and second.stats.target_forwards < 15, "the second copies the first"
    # whole outputs exactly, the last step's too (the pool keeps no prompt token by default), each with the
    # pool's separator
    assert [t.tolist() for t in pool.texts()] == [expected, expected]
    assert pool.stats()["texts"] == 2 and pool.stats()["tokens"] == 2 * (60 + 1)


# -- the library's Drafter holds the policy; per-request options pass through -------


def _library_objects(obj, seen=None):
    """The saspec library objects ``obj`` (a drafter of the loop) holds, looking through the loop's own
    objects (its parts, its session), lists, tuples and dicts; the draft model (torch) is left alone."""
    import saspec_bench.loop as loop

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    values = list(obj.values()) if isinstance(obj, dict) else list(obj) if isinstance(obj, (list, tuple)) else \
        list(vars(obj).values()) if type(obj).__module__ == loop.__name__ else []
    out = []
    for v in values:
        mod = type(v).__module__
        if mod == "saspec" or mod.startswith("saspec."):
            out.append(v)
        elif mod == loop.__name__ or isinstance(v, (dict, list, tuple)):
            out.extend(_library_objects(v, seen))
    return out


@pytest.mark.parametrize("kind", ["sa", "draft", "hybrid"])
def test_the_policy_lives_in_the_library_drafter(models, kind):
    """A drafter of the loop holds one ``saspec.drafter.Drafter`` (with the policy, its ``DraftPolicy``)
    and no other library state: no policy, cost model, offers or automaton of its own."""
    from saspec import RequestPool
    from saspec.drafter import Drafter
    from saspec.policy import DraftPolicy

    target_name, prompt = PROMPTS["enter-loop"]
    pool = RequestPool(10_000)
    for policy in (False, True):
        drafter = make_drafter(kind, draft_model=models[DRAFT_FOR[target_name]], k=8, policy=policy, pool=pool)
        res = speculative_generate(models[target_name], prompt, drafter, 30, NO_EOS)
        assert res.tokens == greedy(models[target_name], prompt, 30)
        held = _library_objects(drafter)
        drafters = [o for o in held if isinstance(o, Drafter)]
        others = [type(o).__name__ for o in held if not isinstance(o, (Drafter, RequestPool))]
        assert len(drafters) == 1 and not others, (kind, policy, others)
        assert isinstance(drafters[0].policy, DraftPolicy) if policy else drafters[0].policy is None
        assert drafters[0].stats()["steps"] > 0
        drafter.close()
    pool.close()


def _recording(drafter):
    """``drafter`` with every proposal recorded in the returned list."""
    proposed = []
    propose = drafter.propose

    def recording(seq, limit=None):
        out, source = propose(seq, limit)
        proposed.append(out)
        return out, source

    drafter.propose = recording
    return proposed


@pytest.mark.parametrize("policy", [False, True])
@pytest.mark.parametrize("kind", ["sa", "draft", "hybrid"])
def test_per_request_options_pass_through(models, kind, policy):
    target_name, prompt = PROMPTS["loop"]
    target = models[target_name]
    expected = greedy(target, prompt, 40)
    drafter = make_drafter(kind, draft_model=models[DRAFT_FOR[target_name]], k=8, policy=policy)
    proposed = _recording(drafter)
    off = speculative_generate(target, prompt, drafter, 40, NO_EOS, options={"enabled": False})
    assert off.tokens == expected
    assert off.stats.target_forwards == 40 and off.stats.draft_forwards == 0  # one target forward per token
    assert not any(proposed)
    proposed.clear()
    capped = speculative_generate(target, prompt, drafter, 40, NO_EOS, options={"max_draft_tokens": 2})
    assert capped.tokens == expected
    assert max(map(len, proposed)) <= 2
    if not policy:  # the fixed rules draft K = 8 on this copy: the cap is what cut them
        assert max(map(len, proposed)) == 2 and capped.stats.target_forwards >= 40 / 3
    with pytest.raises(ValueError, match="max_draft_tokens"):
        speculative_generate(target, prompt, drafter, 40, NO_EOS, options={"max_draft_tokens": -1})
    with pytest.raises(ValueError, match="enable"):
        speculative_generate(target, prompt, drafter, 40, NO_EOS, options={"enable": False})
    assert speculative_generate(target, prompt, drafter, 40, NO_EOS).tokens == expected  # still usable
    drafter.close()


def test_hints_give_the_automaton_text_to_copy(models):
    """The count model's output occurs nowhere in its prompt; given as hints, the SA copies it."""
    target_name, prompt = PROMPTS["count"]
    expected = greedy(models[target_name], prompt, 60)
    plain = run(models, "count", "sa", k=8)
    hinted = run(models, "count", "sa", k=8, options={"hints": expected})
    assert plain.tokens == hinted.tokens == expected
    assert plain.stats.target_forwards == 60 and hinted.stats.target_forwards < 15
    with pytest.raises(ValueError, match="options"):
        speculative_generate(models[target_name], prompt, make_drafter("none"), 5, NO_EOS, options={"hint": [1]})


def test_the_commands_turn_the_policy_off_with_no_policy():
    from saspec_bench.cli import build_parser

    parser = build_parser()
    for cmd in (["generate", "--prompt", "x"], ["bench-e2e"]):
        assert parser.parse_args(cmd).policy is True
        assert parser.parse_args([*cmd, "--no-policy"]).policy is False
        with pytest.raises(SystemExit):
            parser.parse_args([*cmd, "--no-gate"])
