"""The acceptance simulator: hand-computed cases, equivalence of its two paths,
and the command end to end on a tiny configuration."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from saspec import SpecEngine
from saspec_bench.acceptance import stepwise, walk
from saspec_bench.positions import ADAPTIVE, HYBRID, NEURAL, NONE, SA, TREE
from saspec_bench.positions import Flat, neural_positions, sa_positions

K = 4


def flat_of(*pairs):
    return Flat.of([SimpleNamespace(prompt=np.asarray(p, np.int32), output=np.asarray(o, np.int32)) for p, o in pairs])


def run(flat, match, sa_acc, nn_acc, mode, threshold=1):
    hist = np.zeros(K + 2, np.int64)
    steps, sa_steps, extra = walk(flat.offsets, np.asarray(match, np.int32), np.asarray(sa_acc, np.int32),
                                  np.asarray(nn_acc, np.int32), K, mode, threshold, hist, 2.0)
    return steps, sa_steps, extra, hist


# -- a walk replays greedy speculative decoding step by step (hand-computed) -----------------------


def test_walk_hand_computed():
    flat = flat_of(([0], list(range(10))))
    match = [0, 5, 5, 5, 5, 2, 2, 0, 0, 0]
    sa_acc = [0, 4, 3, 2, 1, 0, 1, 0, 0, 0]
    nn_acc = [1, 0, 2, 0, 0, 3, 0, 0, 0, 4]
    # NONE: one token per step.
    assert run(flat, match, sa_acc, nn_acc, NONE)[0] == 10
    # NEURAL: pos0 a=2 -> pos2 a=3 -> pos5 a=4 -> pos9 a=min(4, 0)+1=1: 4 steps.
    steps, sa_steps, _, hist = run(flat, match, sa_acc, nn_acc, NEURAL)
    assert (steps, sa_steps) == (4, 0) and hist.tolist() == [0, 1, 1, 1, 1, 0]
    # SA only: pos0 (no match) a=1 -> pos1 a=5 -> pos6 a=2 -> pos8 a=1 -> pos9 a=1.
    assert run(flat, match, sa_acc, nn_acc, SA)[:2] == (5, 5)
    # HYBRID T=3: pos0 nn a=2 -> pos2 SA (m=5) a=4 -> pos6 nn (m=2) a=1 -> pos7 a=1 -> pos8 a=1 -> pos9 a=1.
    steps, sa_steps, _, _ = run(flat, match, sa_acc, nn_acc, HYBRID, threshold=3)
    assert (steps, sa_steps) == (6, 1)
    # TREE T=1: max of both where m >= 1; extra = K - min(both) on those steps.
    # pos0 nn a=2 -> pos2 max(3,2)+1=4, extra 4-2=2 -> pos6 max(1,0)+1=2, extra 4 -> pos8 1 -> pos9 1.
    steps, sa_steps, extra, _ = run(flat, match, sa_acc, nn_acc, TREE, threshold=1)
    assert (steps, sa_steps, extra) == (5, 2, 6)


def test_walk_caps_acceptance_at_the_output_end():
    flat = flat_of(([1], [5, 6, 7]))
    steps, _, _, hist = run(flat, [3, 3, 3], [4, 4, 4], [0, 0, 0], SA)
    assert steps == 1 and hist[3] == 1


def test_adaptive_prefers_the_better_source():
    rng = np.random.default_rng(0)
    n = 4000
    flat = flat_of(([1], list(range(n))))
    nn = rng.integers(1, 3, n)
    # Long matches are reliable, short ones are not.
    match = np.where(np.arange(n) % 200 < 100, 30, 1)
    sa_acc = np.where(match == 30, K, 0)
    steps_adaptive, sa_steps, _, _ = run(flat, match, sa_acc, nn, ADAPTIVE)
    steps_sa = run(flat, match, sa_acc, nn, SA)[0]
    steps_nn = run(flat, match, sa_acc, nn, NEURAL)[0]
    assert steps_adaptive < min(steps_sa, steps_nn)
    assert 0 < sa_steps < steps_adaptive


# -- the modeled neural drafter is seeded and follows its probabilities ----------------------------


def test_neural_model_is_seeded_and_matches_its_probabilities():
    flat = flat_of(([1], list(range(20000))))
    p = (0.9, 0.5, 0.5, 0.5)
    a = neural_positions(flat, p, seed=3)
    assert np.array_equal(a, neural_positions(flat, p, seed=3))
    assert not np.array_equal(a, neural_positions(flat, p, seed=4))
    # E[accepted] = sum of prefix products = 0.9 + 0.45 + 0.225 + 0.1125
    assert abs(a.mean() - 1.6875) < 0.03
    assert np.all((a >= 0) & (a <= 4))


def traces_with_repeats(seed=0, n=12):
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        base = rng.integers(0, 30, rng.integers(5, 40))
        prompt = np.concatenate([base, rng.integers(0, 30, 10)])
        out = np.concatenate([base[rng.integers(0, len(base)) :], rng.integers(0, 30, rng.integers(1, 10)), base])
        pairs.append((prompt, out))
    return flat_of(*pairs)


# -- the per-position SA pass equals the literal loop through the engine ---------------------------


@pytest.mark.parametrize("policy", ["first", "near-first", "recent"])
def test_per_position_pass_equals_the_literal_loop(policy):
    """SA-only steps from the per-position arrays equal the step-by-step loop
    through SpecEngine with multi-token accepts."""
    flat = traces_with_repeats()
    match, sa_acc = sa_positions(flat, K, policy)
    steps_walk = run(flat, match, sa_acc, np.zeros_like(sa_acc), SA)[0]
    hist = np.zeros(K + 2, np.int64)
    steps_loop = stepwise(flat, SpecEngine(occurrence=policy), K, hist)
    assert steps_walk == steps_loop == hist.sum()
    assert (hist * np.arange(K + 2)).sum() == flat.tokens.shape[0]


def test_sa_positions_hand_computed():
    flat = flat_of(([1, 2, 3, 9], [1, 2, 3, 4]))
    match, acc = sa_positions(flat, K, "first")
    # Position 0: the text 1 2 3 9 has no earlier-occurring suffix.
    # Position 1: after "1", the match "1" proposes 2 3 9 1: accepted 2 (2, 3).
    # Position 2: after "1 2", proposes 3 9 1 2: accepted 1. Position 3: after "1 2 3": 9 ...: 0.
    assert match.tolist() == [0, 1, 2, 3]
    assert acc.tolist() == [0, 2, 1, 0]


# -- the command writes results.json and the plots -------------------------------------------------


def test_simulate_command_end_to_end(tmp_path, capsys):
    from saspec_bench.cli import main

    rc = main(["simulate", "--workloads", "humaneval,humaneval-edit", "--size", "6", "--thresholds", "1,4",
               "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "results.json").read_text())
    rows = {r["drafter"]: r for r in res["workloads"]["humaneval-edit"]["rows"]}
    assert rows["none"]["AL"] == 1.0
    assert rows["neural"]["AL"] > 1.5
    assert (tmp_path / "al_vs_threshold.png").stat().st_size > 1000
    assert (tmp_path / "al_by_policy.png").stat().st_size > 1000
    assert (tmp_path / "accepted_distribution.png").stat().st_size > 1000


def test_the_pool_comparison_replays_each_workload_in_arrival_order(tmp_path):
    from saspec_bench.cli import main

    assert main(["simulate", "--workloads", "humaneval", "--size", "12", "--no-plots", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    pool = res["pool"]["humaneval"]
    rows = {r["drafter"]: r["AL"] for r in res["workloads"]["humaneval"]["rows"]}
    assert pool["off"]["al"] == pytest.approx(rows["sa:near-first"], abs=1e-9), "no pool: the simulator's own SA"
    assert pool["outputs"]["pool"]["added"] == 12 and pool["outputs"]["pool"]["texts"] == 12
    assert pool["outputs"]["al"] > pool["off"]["al"], "HumanEval completions repeat each other's code"
    assert "## Memory across requests" in (tmp_path / "tables.md").read_text()


# -- the first screen is a summary; every table is written to the output folder ---------------


def first_screen_of(out: str) -> list[str]:
    return out.strip("\n").splitlines()


def test_the_first_screen_is_a_short_summary_per_workload(tmp_path, capsys):
    from saspec_bench.cli import main

    assert main(["simulate", "--workloads", "humaneval,humaneval-edit", "--size", "6", "--out", str(tmp_path)]) == 0
    lines = first_screen_of(capsys.readouterr().out)
    assert len(lines) <= 40
    assert lines[0].startswith("saspec simulate: 2 workloads, K=8, SA policy near-first.")
    al = lines[lines.index("Tokens per target forward (AL):") + 1]
    assert al == "| workload | SA | n-gram | SA / n-gram | draft model | hybrid | hybrid / draft model |"
    speed = lines[lines.index("Modeled tokens/s of the hybrid over the draft model alone (and over no drafting):") + 1]
    assert "gpu-like B=1 | gpu-like B=64 |" in speed
    for name in ("humaneval", "humaneval-edit"):
        assert sum(x.startswith(f"| {name} | ") for x in lines) == 2, name  # one row in each table
    res = json.loads((tmp_path / "results.json").read_text())
    rows = {r["drafter"]: r["AL"] for r in res["workloads"]["humaneval-edit"]["rows"]}
    assert f"| humaneval-edit | {rows['sa:near-first']:.2f} | {rows['ngram']:.2f} | " in "\n".join(lines)


def test_the_last_line_says_where_every_table_and_plot_went(tmp_path, capsys):
    from saspec_bench.cli import main

    assert main(["simulate", "--workloads", "humaneval-edit", "--size", "6", "--out", str(tmp_path)]) == 0
    last = first_screen_of(capsys.readouterr().out)[-1]
    assert last == (f"full tables: {tmp_path / 'tables.md'}; results: {tmp_path / 'results.json'}; "
                    f"plots: al_vs_threshold.png, al_by_policy.png, accepted_distribution.png in {tmp_path}")
    tables = (tmp_path / "tables.md").read_text()
    for text in ("| humaneval-edit | hybrid:T=4 |", "| humaneval-edit | sa:recent |",  # every drafter and policy
                 "| workload | hybrid T=4 / neural | adaptive / neural |",  # the ratios
                 "best draft-length rule:", "| humaneval-edit | sa K=32 ",  # the cost model's study, speed table
                 "Cost model: time per step", "workloads built in"):
        assert text in tables, text


def test_without_plots_the_last_line_names_only_the_tables_and_results(traces_file, tmp_path, capsys):
    from saspec_bench.cli import main

    json_path = tmp_path / "elsewhere.json"
    assert main(["simulate", "--workloads", str(traces_file), "--no-plots", "--no-ngram", "--out", str(tmp_path / "o"),
                 "--json", str(json_path)]) == 0
    lines = first_screen_of(capsys.readouterr().out)
    assert lines[-1] == f"full tables: {tmp_path / 'o' / 'tables.md'}; results: {json_path}"
    assert any(x.startswith("| rec | 8.00 | - | - |") for x in lines)  # no n-gram run: its columns say so
    assert not list((tmp_path / "o").glob("*.png"))


@pytest.fixture
def traces_file(tmp_path):
    """A perfect copy task as a recorded-trace file named ``rec.jsonl``."""
    from saspec_bench.workloads import Trace, save_traces

    path = tmp_path / "rec.jsonl"
    traces = [Trace(prompt=np.array([1, 2, 3, 4] * 5, np.int32), output=np.array([1, 2, 3, 4] * 10, np.int32), meta={})]
    save_traces(path, traces, model="test")
    return path


# -- recorded traces and the runtime selector ---------------------------------------------


def test_simulate_replays_recorded_traces(traces_file, tmp_path, capsys):
    from saspec_bench.cli import main

    assert main(["simulate", "--workloads", str(traces_file), "--no-plots", "--no-ngram", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    rows = {r["drafter"]: r for r in res["workloads"]["rec"]["rows"]}
    assert rows["sa:first"]["AL"] == 40 / 5  # a perfect copy: 8 drafts + 1 bonus each step, 40 tokens
