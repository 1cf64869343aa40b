"""What a user sets (:class:`PolicySettings`), what each step chose (:class:`Decision`) and where it is
logged, and the cost model an engine starts from (:func:`engine_cost`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .allocation import AUTOMATON, NEURAL, NONE
from .step_cost import StepCost, cpu_like, gpu_like


@dataclass(frozen=True)
class Decision:
    """One step's choice, as ``log`` receives it.

    Attributes:
        step: the policy's step count.
        lengths: int32 [B] draft tokens per row.
        sources: int32 [B] :data:`NONE` / :data:`AUTOMATON` / :data:`NEURAL` per row.
        rate: expected tokens per second of the step as chosen.
        plain_rate: expected tokens per second without drafts.
        neural_k: draft tokens the neural drafter makes this step (0: it drafts nothing).
    """

    step: int
    lengths: np.ndarray
    sources: np.ndarray
    rate: float
    plain_rate: float
    neural_k: int


#: Where setting this environment variable (to anything but empty) makes the integrations log every decision.
LOG_ENV = "SASPEC_POLICY_LOG"


def log_decision(d: Decision) -> None:
    """A ``log`` for :class:`DraftPolicy` that writes each decision to the ``saspec.policy`` logger (INFO):
    step, rows by source, draft tokens, expected tokens per second against plain, the neural K."""
    import logging

    src = d.sources
    logging.getLogger("saspec.policy").info(
        "step %d: %d rows (automaton %d, neural %d, none %d), %d draft tokens, rate %.4g vs plain %.4g, neural k %d",
        d.step, len(src), int((src == AUTOMATON).sum()), int((src == NEURAL).sum()), int((src == NONE).sum()),
        int(d.lengths.sum()), d.rate, d.plain_rate, d.neural_k)


def env_log() -> Callable[[Decision], Any] | None:
    """:func:`log_decision` where ``$SASPEC_POLICY_LOG`` is set, else None."""
    import os

    return log_decision if os.environ.get(LOG_ENV, "").strip() else None


def check_prob(value: Any, name: str, open_top: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    v = float(value)
    if not (0.0 <= v <= 1.0) or (open_top and v >= 1.0):
        raise ValueError(f"{name} must be in [0, 1{')' if open_top else ']'}, got {value!r}")
    return v


def check_positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


@dataclass
class PolicySettings:
    """What a user sets (every field has a default; all are validated by :class:`DraftPolicy`).

    Attributes:
        prior_weight: pseudo-tokens of prior behind each acceptance estimate (finite, > 0).
        neural_prior: the neural drafter's per-token acceptance before any evidence, in [0, 1).
        neural_cost: a neural drafter forward's cost as a share of a target forward over the same
            tokens, before it is timed (finite, > 0).
        neural_memory: per step, how much of the neural drafter's acceptance evidence is kept (0, 1].
        row_memory: per step, how much of a row's own acceptance evidence is kept (0, 1].
        step_tolerance: with more than one row, the policy takes the shortest step whose expected
            tokens per second are within this share of the best, in [0, 0.5) (0: the best): where the
            rate is flat (verification compute-bound) longer steps buy next to nothing and delay every
            row and any prefill that waits for them.
        rate_memory: per step, how much of the running rate's tokens and seconds is kept, in [0, 1) (0:
            none): a step drafts no token whose chance does not pay its cost at the tokens a second the
            rows have emitted of late (see :mod:`saspec.policy`).
        cost_shape: the cost curve's prior shape (see :class:`StepCost`) where no profile is given.
        window, max_age, quantile: the cost model's refresh rule (see :class:`StepCost`).
    """

    prior_weight: float = 8.0
    neural_prior: float = 0.6
    neural_cost: float = 0.25
    neural_memory: float = 0.995
    row_memory: float = 0.9
    step_tolerance: float = 0.02
    rate_memory: float = 0.999
    cost_shape: Any = field(default=None)
    window: int = 16
    max_age: int = 64
    quantile: float = 0.25


def check_settings(settings: PolicySettings) -> dict[str, float]:
    """The numbers of ``settings`` a policy uses, checked: ``prior_weight``, ``neural_prior``, ``neural_cost``,
    ``step_tolerance``, ``neural_memory``, ``row_memory`` and ``rate_memory`` (as floats).

    Raises:
        ValueError: one out of range (named in the message).
    """
    s = settings
    out = {"prior_weight": check_positive(s.prior_weight, "prior_weight"),
           "neural_prior": check_prob(s.neural_prior, "neural_prior", open_top=True),
           "neural_cost": check_positive(s.neural_cost, "neural_cost"),
           "step_tolerance": check_prob(s.step_tolerance, "step_tolerance", open_top=True)}
    if out["step_tolerance"] >= 0.5:
        raise ValueError(f"step_tolerance must be in [0, 0.5), got {s.step_tolerance!r}")
    out["rate_memory"] = check_prob(s.rate_memory, "rate_memory", open_top=True)
    for name in ("neural_memory", "row_memory"):
        v = out[name] = check_prob(getattr(s, name), name)
        if v == 0.0:
            raise ValueError(f"{name} must be in (0, 1], got 0")
    return out


def engine_cost(settings: PolicySettings, device: str = "cpu", max_tokens: int | None = None) -> StepCost:
    """The :class:`StepCost` of an engine on ``device`` (``"cpu"``: the :func:`cpu_like` prior shape, else
    :func:`gpu_like`) unless ``settings.cost_shape`` is set, with ``settings``' refresh rule and
    ``max_tokens`` where given (see :meth:`DraftPolicy.for_engine`)."""
    shape = settings.cost_shape or (cpu_like if device == "cpu" else gpu_like)
    extra = {} if max_tokens is None else {"max_tokens": max(int(max_tokens), 1)}
    return StepCost(shape, window=settings.window, max_age=settings.max_age, quantile=settings.quantile, **extra)
