"""A real draft model in the simulator: teacher-forced runs reproduce the loop exactly.

The property: for a greedy draft model and the target's greedy output, the
simulator's steps (target forwards) for ``draft-model`` and for the SA +
draft-model hybrid equal what ``generate.speculative_generate`` measures with
that draft model on the same output. Tiny Qwen2 models in fp32 (see
``test_generate``): successor models with clear logit margins, and a plain
random pair.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_generate import CYCLE, COUNT, NO_EOS, PROMPTS, perturbed, tiny_model  # noqa: E402

from saspec_bench import realsim  # noqa: E402
from saspec_bench.costmodel import gpu_like_profile  # noqa: E402
from saspec_bench.draft_runs import (  # noqa: E402
    DraftRuns,
    check_runs,
    compute_draft_runs,
    runs_from_argmax,
    teacher_forced_argmax,
)
from saspec_bench.loop import (  # noqa: E402
    SAModelDrafter,
    ModelDrafter,
    NoDrafter,
    SADrafter,
    speculative_generate,
)
from saspec_bench.acceptance import draft_model_rows, walk  # noqa: E402
from saspec_bench.positions import HYBRID, NEURAL  # noqa: E402
from saspec_bench.positions import Flat, sa_positions  # noqa: E402
from saspec_bench.workloads import Trace, TraceFormatError, load_traces, save_traces  # noqa: E402

MAX_NEW = 70


@pytest.fixture(scope="module")
def models():
    return {
        "cycle": tiny_model(1, CYCLE),
        "count": tiny_model(2, COUNT),
        "random": tiny_model(0),
        # draft models: a successor model that agrees with the target on most tokens, and a random one
        "draft-close": tiny_model(3, perturbed(CYCLE, 0.3, 7)),
        "draft-count": tiny_model(4, perturbed(COUNT, 0.3, 8)),
        "draft-random": tiny_model(5),
    }


CASES = {  # name: (prompt from test_generate, target, draft model)
    "enter-loop": ("enter-loop", "cycle", "draft-close"),
    "loop": ("loop", "cycle", "draft-close"),
    "count": ("count", "count", "draft-count"),
    "random": ("random", "random", "draft-random"),
}


@pytest.fixture(scope="module")
def traces(models):
    """Per case: (prompt, the target's greedy output, DraftRuns computed in chunks of 7 tokens)."""
    out = {}
    for name, (prompt_name, target, draft) in CASES.items():
        prompt = PROMPTS[prompt_name][1]
        output = speculative_generate(models[target], prompt, NoDrafter(), MAX_NEW, NO_EOS).tokens
        runs = compute_draft_runs(models[draft], prompt, output, draft, chunk=7)
        out[name] = (prompt, output, runs)
    return out


def flat_of(prompt, output, runs) -> Flat:
    return Flat.of([Trace(np.asarray(prompt), np.asarray(output), {}, runs)])


# -- teacher-forced runs give the loop's own steps: draft model, hybrid, SA ------------------------


def test_runs_are_not_trivial(traces):
    """The cases exercise short and long runs (otherwise the equality below proves little)."""
    all_runs = np.concatenate([r.runs for _, _, r in traces.values()])
    assert (all_runs == 0).mean() > 0.1
    assert (all_runs >= 8).mean() > 0.05


def test_teacher_forcing_matches_incremental_drafts(models, traces):
    """The argmax from one chunked pass equals the draft model's own first draft token at every position."""
    prompt, output, runs = traces["enter-loop"]
    draft = models["draft-close"]
    argmax = teacher_forced_argmax(draft, prompt, output, chunk=1000)
    assert np.array_equal(runs_from_argmax(argmax, np.asarray(output)), runs.runs)  # chunking does not matter
    md = ModelDrafter(draft, k=1)
    md.begin(prompt)
    seq = list(prompt)
    for p, tok in enumerate(output[:30]):
        d, _ = md.propose(seq)
        assert d[0] == argmax[p], p
        seq.append(tok)
        md.update(seq, 1)
    md.end()


@pytest.mark.parametrize("k", [3, 8])
@pytest.mark.parametrize("case", list(CASES))
def test_draft_model_steps_equal_loop(models, traces, case, k):
    prompt_name, target, draft = CASES[case]
    prompt, output, runs = traces[case]
    loop = speculative_generate(models[target], prompt, ModelDrafter(models[draft], k=k), MAX_NEW, NO_EOS)
    assert loop.tokens == output
    flat = flat_of(prompt, output, runs)
    hist = np.zeros(k + 2, np.int64)
    steps, _, _ = walk(flat.offsets, np.zeros(MAX_NEW, np.int32), np.zeros(MAX_NEW, np.int32),
                       np.minimum(flat.draft_runs, k).astype(np.int32), k, NEURAL, 0, hist, 1.0)
    assert steps == loop.stats.target_forwards
    arr = realsim.Arrays(flat, np.zeros(MAX_NEW, np.int32))
    res = realsim.run_costed(arr, gpu_like_profile(), 1, "neural", k_nn=k)
    assert res["steps"] == loop.stats.target_forwards
    assert res["draft_forwards_per_step"] * res["steps"] == loop.stats.draft_forwards
    assert res["AL"] == pytest.approx(loop.stats.al)


@pytest.mark.parametrize("k,threshold,patience,per_match", [(3, 2, 0, 0.0), (8, 4, 0, 0.0), (8, 2, 3, 2.0),
                                                           (5, 1, 1, 1.0)])
@pytest.mark.parametrize("case", ["enter-loop", "loop", "count", "random"])
def test_hybrid_steps_equal_loop(models, traces, case, k, threshold, patience, per_match):
    prompt_name, target, draft = CASES[case]
    prompt, output, runs = traces[case]
    drafter = SAModelDrafter(SADrafter(k, per_match=per_match), ModelDrafter(models[draft], k=k), threshold, patience)
    fed = []
    hook = models[draft].register_forward_pre_hook(lambda mod, args, kw: fed.append(kw["input_ids"].numel()),
                                                   with_kwargs=True)
    try:
        loop = speculative_generate(models[target], prompt, drafter, MAX_NEW, NO_EOS)
    finally:
        hook.remove()
    assert loop.tokens == output
    flat = flat_of(prompt, output, runs)
    arr = realsim.Arrays(flat, np.zeros(MAX_NEW, np.int32))
    rule, scale = ("fixed", 1.0) if per_match == 0 else ("per-match", per_match)
    res = realsim.run_costed(arr, gpu_like_profile(), 1, "hybrid", k_sa=k, k_nn=k, threshold=threshold,
                             patience=patience, rule=rule, scale=scale)
    assert res["steps"] == loop.stats.target_forwards
    assert round(res["sa_frac"] * res["steps"]) == loop.stats.steps["sa"]
    assert round(res["draft_forwards_per_step"] * res["steps"]) == loop.stats.draft_forwards == len(fed)
    if fed:  # the simulator leaves out the draft model's prefill of the prompt but its last token
        assert round(res["draft_fed_per_step"] * res["steps"]) == sum(fed) - (len(prompt) - 1)
    assert round(res["verified_per_step"] * res["steps"]) == (sum(loop.stats.drafted.values())
                                                              + loop.stats.target_forwards)
    if patience == 0 and per_match == 0:  # simulate.walk's HYBRID mode is the same rule
        match, sa_acc = sa_positions(flat, k, "near-first")
        hist = np.zeros(k + 2, np.int64)
        steps, sa_steps, _ = walk(flat.offsets, match, sa_acc, np.minimum(flat.draft_runs, k).astype(np.int32),
                                  k, HYBRID, threshold, hist, 1.0)
        assert (steps, sa_steps) == (loop.stats.target_forwards, loop.stats.steps["sa"])


def test_hybrid_cases_use_both_sources(models, traces):
    prompt, output, _ = traces["enter-loop"]
    drafter = SAModelDrafter(SADrafter(8), ModelDrafter(models["draft-close"], k=8), 4, 0)
    st = speculative_generate(models["cycle"], prompt, drafter, MAX_NEW, NO_EOS).stats
    assert st.steps["sa"] > 0 and st.steps["draft"] > 0


@pytest.mark.parametrize("k", [3, 8])
def test_sa_steps_equal_loop_with_draft_lengths(models, traces, k):
    prompt, output, runs = traces["enter-loop"]
    for per_match in (0.0, 1.0, 2.0):
        loop = speculative_generate(models["cycle"], prompt, SADrafter(k, per_match=per_match), MAX_NEW, NO_EOS)
        arr = realsim.Arrays(flat_of(prompt, output, runs), np.zeros(MAX_NEW, np.int32))
        rule = ("fixed", 1.0) if per_match == 0 else ("per-match", per_match)
        res = realsim.run_costed(arr, gpu_like_profile(), 1, "sa", k_sa=k, rule=rule[0], scale=rule[1])
        assert res["steps"] == loop.stats.target_forwards, per_match
        assert round(res["verified_per_step"] * res["steps"]) == sum(loop.stats.drafted.values()) + res["steps"]


def test_draft_model_rows_in_simulator(traces):
    prompt, output, runs = traces["enter-loop"]
    flat = flat_of(prompt, output, runs)
    match, sa_acc = sa_positions(flat, 8, "near-first")
    rows = {name: (res, note) for name, res, note in draft_model_rows(flat, 8, 4, (1, 2, 4, 8), match, sa_acc)}
    assert set(rows) == {"draft-model", "hybrid:draft-model:T=4", "hybrid:draft-model:best-T",
                         "hybrid:draft-model:adaptive", "tree:draft-model:T=4"}
    assert rows["draft-model"][1] == "draft-close"
    steps = {n: r[0] for n, (r, _) in rows.items()}
    assert steps["hybrid:draft-model:best-T"] <= steps["hybrid:draft-model:T=4"]
    assert steps["tree:draft-model:T=4"] <= steps["hybrid:draft-model:T=4"]


# -- run arrays are consistent, and trace files carry and check them -------------------------------


def test_runs_from_argmax_hand_computed():
    out = np.array([5, 6, 7, 8, 9, 10])
    am = np.array([5, 6, 0, 8, 9, 10])
    assert runs_from_argmax(am, out).tolist() == [2, 1, 0, 3, 2, 1]
    assert runs_from_argmax(am, out, max_run=2).tolist() == [2, 1, 0, 2, 2, 1]
    with pytest.raises(ValueError, match="one shape"):
        runs_from_argmax(am[:3], out)


def test_check_runs_rejects_inconsistent():
    check_runs([2, 1, 0, 3, 2, 1], 64)
    with pytest.raises(ValueError, match="outside"):
        check_runs([2, 1, 0, 3, 2, 2], 64)  # the last position has 1 token left
    with pytest.raises(ValueError, match="inconsistent"):
        check_runs([3, 1, 0, 1, 1, 1], 64)
    with pytest.raises(ValueError, match="max_run"):
        check_runs([0], 300)


def test_trace_file_roundtrip_and_validation(tmp_path):
    runs = DraftRuns("d", np.array([2, 1, 0], np.uint8))
    traces = [Trace(np.array([1, 2]), np.array([3, 4, 5]), {"x": 1}, runs), Trace(np.array([7]), np.array([8]))]
    for name in ("t.jsonl", "t.jsonl.gz"):
        path = tmp_path / name
        save_traces(path, traces, "m")
        back = load_traces(path)
        assert back.traces == traces and back.traces[0].draft_runs == runs
    with gzip.open(tmp_path / "t.jsonl.gz", "rt") as f:
        assert json.loads(f.readline())["draft_runs"] == {"model": "d", "max_run": 64, "runs": [2, 1, 0]}
    # an old file (no draft_runs) still loads
    (tmp_path / "old.jsonl").write_text(json.dumps({"prompt_ids": [1], "output_ids": [2, 3]}) + "\n")
    assert load_traces(tmp_path / "old.jsonl").traces[0].draft_runs is None
    bad = {"prompt_ids": [1], "output_ids": [2, 3]}
    for dr, msg in [({"model": "d", "runs": [1]}, "1 entries for 2"), ({"model": "d", "runs": [2, 0]}, "inconsistent"),
                    ({"runs": [0, 0]}, "must be an object"), ({"model": "d", "runs": [0, True]}, "list of ints"),
                    ({"model": "d", "runs": [0, 0], "max_run": 0}, "max_run")]:
        (tmp_path / "bad.jsonl").write_text("\n" + json.dumps({**bad, "draft_runs": dr}) + "\n")
        with pytest.raises(TraceFormatError, match=rf"bad.jsonl:2: .*{msg}"):
            load_traces(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="2 runs for 3"):
        Trace(np.array([1]), np.array([1, 2, 3]), {}, DraftRuns("d", np.array([1, 0])))


def test_flat_carries_runs_only_when_every_trace_has_them():
    r = DraftRuns("d", np.array([1, 0], np.uint8))
    both = Flat.of([Trace(np.array([1]), np.array([2, 3]), {}, r), Trace(np.array([1]), np.array([4, 5]), {}, r)])
    assert both.draft_runs.tolist() == [1, 0, 1, 0] and both.draft_model == "d"
    mixed = Flat.of([Trace(np.array([1]), np.array([2, 3]), {}, r), Trace(np.array([1]), np.array([4, 5]))])
    assert mixed.draft_runs is None


def test_teacher_forced_argmax_bad_inputs(models):
    with pytest.raises(ValueError, match="prompt is empty"):
        teacher_forced_argmax(models["random"], [], [1])
    with pytest.raises(ValueError, match="output is empty"):
        teacher_forced_argmax(models["random"], [1], [])
    with pytest.raises(ValueError, match="chunk"):
        teacher_forced_argmax(models["random"], [1], [2], chunk=0)
