"""benchmarks/gpu_step_curves.py on the CPU with a tiny architecture: the grid of shapes, the curve file the served
replay reads, the curve's points from a grid, and bad arguments."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from saspec_bench.step_curves import load_curve

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_step_curves.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("gpu_step_curves", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_count_several_shapes_give_takes_their_median_and_the_curve_never_falls(script):
    rows = [{"tokens": 4, "seconds": 3.0}, {"tokens": 4, "seconds": 1.0}, {"tokens": 4, "seconds": 2.0},
            {"tokens": 1, "seconds": 1.5}, {"tokens": 8, "seconds": 1.0}, {"tokens": 16, "seconds": 4.0}]
    assert script.curve_points(rows) == ([1, 4, 8, 16], [1.5, 2.0, 2.0, 4.0])


def test_the_tiny_model_on_the_cpu_writes_its_grid_and_a_curve_file_the_replay_loads(script, tmp_path):
    pytest.importorskip("transformers")
    rc = script.main(["--out", str(tmp_path), "--models", "tiny", "--device", "cpu", "--batches", "1", "2",
                      "--tokens", "1", "3", "--context", "8", "--repeats", "1"])
    assert rc == 0
    grid = json.loads((tmp_path / "tiny.grid.json").read_text())
    shapes = [(r["batch"], r["tokens_per_row"], r["tokens"], r["mode"]) for r in grid["rows"]]
    assert shapes == [(1, 1, 1, "eager"), (1, 3, 3, "eager"), (2, 1, 2, "eager"), (2, 3, 6, "eager")]
    assert all(r["seconds"] > 0 for r in grid["rows"])
    assert grid["context"] == 8 and grid["device_name"] == "cpu"
    curve = load_curve(tmp_path / "tiny.json")
    assert curve.tokens == (1, 2, 3, 6) and curve.prior == "gpu" and curve.name == "tiny"
    assert list(curve.seconds) == sorted(curve.seconds)


@pytest.mark.parametrize("args", [["--batches", "0"], ["--tokens", "1", "-2"], ["--repeats", "0"],
                                  ["--context", "-1"], ["--models", "llama-70b"]])
def test_bad_arguments_stop_before_any_model_is_built(script, tmp_path, args):
    with pytest.raises(SystemExit):
        script.main(["--out", str(tmp_path / "out"), "--device", "cpu", *args])
    assert not (tmp_path / "out").exists()
