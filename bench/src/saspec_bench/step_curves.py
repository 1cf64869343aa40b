"""Step-cost curves for the served replay: a step's modeled seconds as a function of the tokens it processes.

A :class:`Curve` is a table of ``(tokens, seconds)`` points, linearly interpolated between them, flat below the
first and extended along the last segment above the last (never falling there). It stands for the machine in
``saspec_bench.served_sim``: every step of the replay costs ``curve(tokens)`` seconds, the step's tokens being
its prefills, its rows and their draft tokens. Each curve also names the prior cost shape the drafting policy is
given in that regime (``"cpu"``: ``saspec.policy.cpu_like``, ``"gpu"``: ``gpu_like``), as a deployment on that
machine would.

The shipped curves (their sources in BENCHMARKS.md, "Drafting policy"):

* :data:`CPU`: this project's CPU serving the 0.5B target in vLLM, the linear model of its served steps as the
  policy timed them;
* :data:`GPU`: a published step-cost measurement of Qwen3-14B on an H200 (8.71 ms for 8 tokens, 8.77 ms for 16,
  42.3 ms for 1,024).

**The curve file** (``--curve PATH``; written by :meth:`Curve.save`, by :func:`profile_curve` from
``saspec.step_cost.StepCost.profile``, or by a device run):

* JSON: an object ``{"points": [[tokens, seconds], ...], "prior": "gpu" | "cpu", "name": str, "source": str}``
  (only ``points`` required; ``prior`` defaults to ``"gpu"``, ``name`` to the file's stem), or a bare list of
  ``[tokens, seconds]`` pairs;
* CSV: a header ``tokens,seconds``, then one point a line; lines starting with ``#`` are comments, and a comment
  ``# prior: cpu`` (or ``gpu``) sets the prior.

Token counts are integers >= 1, all different (any order); seconds finite and > 0.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

#: The prior cost shapes a curve may name (``saspec.policy.cpu_like`` / ``gpu_like``).
PRIORS = ("cpu", "gpu")


@dataclass(frozen=True)
class Curve:
    """A step-cost curve (see the module doc).

    Args:
        name: what tables call the regime.
        tokens: the points' token counts (ints >= 1, increasing).
        seconds: the points' seconds (finite, > 0), as many as ``tokens``.
        prior: the policy's prior cost shape in this regime, one of :data:`PRIORS`.
        source: where the points come from (free text).

    Raises:
        ValueError: no points, counts not increasing integers >= 1, seconds not finite and > 0, lengths that
            differ, or an unknown prior.
    """

    name: str
    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    prior: str = "gpu"
    source: str = ""

    def __post_init__(self) -> None:
        tokens, seconds = tuple(self.tokens), tuple(self.seconds)
        if not tokens or len(tokens) != len(seconds):
            raise ValueError(f"curve {self.name!r}: needs at least one point and as many seconds as token counts, "
                             f"got {len(tokens)} token counts and {len(seconds)} seconds")
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
                raise ValueError(f"curve {self.name!r}: token counts must be integers >= 1, got {t!r}")
        if any(b <= a for a, b in zip(tokens, tokens[1:])):
            raise ValueError(f"curve {self.name!r}: token counts must be increasing, got {list(tokens)}")
        for s in seconds:
            if isinstance(s, bool) or not isinstance(s, (int, float, np.floating, np.integer)) \
                    or not math.isfinite(s) or s <= 0:
                raise ValueError(f"curve {self.name!r}: seconds must be finite and > 0, got {s!r}")
        if self.prior not in PRIORS:
            raise ValueError(f"curve {self.name!r}: prior must be one of {PRIORS}, got {self.prior!r}")
        object.__setattr__(self, "tokens", tuple(int(t) for t in tokens))
        object.__setattr__(self, "seconds", tuple(float(s) for s in seconds))

    @classmethod
    def linear(cls, fixed: float, per_token: float, *, name: str = "linear", prior: str = "cpu",
               source: str = "") -> Curve:
        """The linear model ``fixed + per_token * n`` seconds as a curve (two points, extended beyond).

        Raises:
            ValueError: ``per_token`` below 0, or a step of 1 or 2 tokens not > 0 seconds.
        """
        if not (math.isfinite(per_token) and per_token >= 0):
            raise ValueError(f"per_token must be finite and >= 0, got {per_token!r}")
        return cls(name, (1, 2), (fixed + per_token, fixed + 2 * per_token), prior, source)

    def __call__(self, tokens: int) -> float:
        """Seconds of a step over ``tokens`` tokens (interpolated; flat below the first point, along the last
        segment above the last, never falling there)."""
        xs, ys = self.tokens, self.seconds
        if tokens <= xs[0]:
            return ys[0]
        if tokens >= xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
            return ys[-1] + max(slope, 0.0) * (tokens - xs[-1])
        return float(np.interp(tokens, xs, ys))

    def points(self) -> list[tuple[int, float]]:
        """The ``(tokens, seconds)`` points."""
        return list(zip(self.tokens, self.seconds))

    def save(self, path: str | Path) -> None:
        """Write the curve as a JSON curve file (see the module doc)."""
        Path(path).write_text(json.dumps({"name": self.name, "prior": self.prior, "source": self.source,
                                          "points": [[t, s] for t, s in self.points()]}, indent=1) + "\n")


def _sorted_points(pairs: Sequence[Sequence[Any]], where: str) -> tuple[list[Any], list[Any]]:
    """Pairs sorted by token count; duplicates and malformed pairs rejected, naming ``where``."""
    for p in pairs:
        if not isinstance(p, (list, tuple)) or len(p) != 2:
            raise ValueError(f"{where}: each point must be a pair [tokens, seconds], got {p!r}")
    pairs = sorted(pairs, key=lambda p: p[0] if isinstance(p[0], (int, float)) else math.inf)
    tokens = [p[0] for p in pairs]
    dup = sorted({t for a, t in zip(tokens, tokens[1:]) if a == t})
    if dup:
        raise ValueError(f"{where}: token counts {dup} appear more than once (aggregate them first)")
    return tokens, [p[1] for p in pairs]


def _csv_number(text: str, kind: type, where: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a number of {kind.__name__}") from None


def load_curve(path: str | Path, *, prior: str | None = None) -> Curve:
    """A curve file (JSON or CSV; see the module doc) as a :class:`Curve`.

    Args:
        path: the file (``.csv``: CSV; anything else: JSON).
        prior: overrides the file's prior (``"cpu"`` or ``"gpu"``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a curve file (naming the problem and the file).
    """
    path = Path(path)
    text = path.read_text()
    where = str(path)
    name, source, file_prior = path.stem, "", "gpu"
    if path.suffix.lower() == ".csv":
        rows, comments = [], []
        for line in text.splitlines():
            (comments if line.lstrip().startswith("#") else rows).append(line)
        for c in comments:
            key, _, value = c.lstrip()[1:].partition(":")
            if key.strip() == "prior":
                file_prior = value.strip()
        table = [r for r in csv.reader(io.StringIO("\n".join(rows))) if r]
        if not table or [h.strip() for h in table[0]] != ["tokens", "seconds"]:
            raise ValueError(f"{where}: a CSV curve file starts with the header 'tokens,seconds'")
        pairs = []
        for i, r in enumerate(table[1:], 2):
            if len(r) != 2:
                raise ValueError(f"{where}: row {i} must hold two values (tokens, seconds), got {r}")
            pairs.append((_csv_number(r[0].strip(), int, where), _csv_number(r[1].strip(), float, where)))
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
        if isinstance(data, dict):
            if "points" not in data:
                raise ValueError(f"{where}: a JSON curve file needs 'points': [[tokens, seconds], ...]")
            name, source = str(data.get("name", name)), str(data.get("source", ""))
            file_prior = data.get("prior", file_prior)
            pairs = data["points"]
        else:
            pairs = data
        if not isinstance(pairs, list):
            raise ValueError(f"{where}: points must be a list of [tokens, seconds] pairs")
    tokens, seconds = _sorted_points(pairs, where)
    try:
        return Curve(name, tuple(tokens), tuple(seconds), prior or file_prior, source)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def profile_curve(run_step: Callable[[int], Any], sizes: Sequence[int], *, name: str = "profiled",
                  prior: str = "gpu", source: str = "", **profile_args: Any) -> Curve:
    """A curve measured by ``saspec.step_cost.StepCost.profile(run_step, sizes, **profile_args)``: its shape at
    ``sizes`` (each size's fastest of its repeats). ``profile_args``: ``repeats``, ``clock``.

    Raises:
        ValueError: what ``StepCost.profile`` raises (no sizes, a size below 1, a step timed at 0 s or less).
    """
    from saspec.step_cost import StepCost

    if not sizes:
        raise ValueError("profile_curve needs at least one size")
    cost = StepCost.profile(run_step, sizes, max_tokens=max(max(sizes), 2), **profile_args)
    xs = sorted(set(int(s) for s in sizes))
    return Curve(name, tuple(xs), tuple(float(cost.shape[s]) for s in xs), prior, source)


#: This project's CPU serving the 0.5B target: 0.2 s + 10.1 ms a token (BENCHMARKS.md, "Drafting policy").
CPU = Curve.linear(0.2, 0.0101, name="cpu", prior="cpu",
                   source="the 0.5B target's served steps on this project's CPU, as the policy timed them")
#: Qwen3-14B on an H200, as published: flat to 16 tokens, then about 0.033 ms a token.
GPU = Curve("gpu", (8, 16, 1024), (8.71e-3, 8.77e-3, 42.3e-3), "gpu",
            "Qwen3-14B on an H200, published: 8.71 ms for 8 tokens, 8.77 ms for 16, 42.3 ms for 1,024")
#: The shipped curves by name.
CURVES = {"cpu": CPU, "gpu": GPU}
