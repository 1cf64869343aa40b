"""The share of a neural drafter's catch-up that a step is charged (:class:`CatchUpShare`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .allocation import NEURAL
from .draft_policy import DraftPolicy


class CatchUpShare:
    """The share of a neural drafter's catch-up that a step is charged, and the step's choice with it.

    A neural drafter that skipped steps must read what it skipped before it
    drafts again. Charged whole to the step that ends the skip, a long catch-up
    would keep the neural drafter out for good, and the skipped span grows
    while it is out; charged too little, it reads a long span for one draft
    and falls behind again at the next automaton step. A step is charged each
    part of the catch-up over the neural steps that part serves:

    - a first read (the prompt, where the drafter has never run for a row)
      serves every neural step of the request after it: the share of recent
      steps whose best choice, were the drafter in step, was the neural
      drafter, times the steps left (``remaining`` tokens over the tokens per
      step so far);
    - a gap (the tokens of the automaton's steps since the drafter last ran)
      serves one run of neural steps: the mean length of recent runs of steps
      whose best choice, in step, was the neural drafter (1 before any). In a
      code edit the neural drafter is best only at isolated steps between the
      automaton's copies, so its gaps are charged whole; in free text its
      runs are long.
    """

    def __init__(self) -> None:
        self.prefer_neural = 0.5  # the share of recent steps whose best choice, in step, was the neural drafter
        self.run_len = 1.0  # the mean length of recent runs of such steps
        self.per_step = 1.0  # tokens per row and step so far (mean of the latest 32)
        self._steps = 0
        self._run = 0  # the length of the current run

    def observe_tokens(self, tokens: float) -> None:
        """A step emitted ``tokens`` tokens per row."""
        self._steps += 1
        self.per_step += (float(tokens) - self.per_step) / min(self._steps, 32)

    def _count(self, src: np.ndarray) -> None:
        """Count a step's best choice in step (``src``: each row's source)."""
        prefer = bool(np.any(src == NEURAL))
        self.prefer_neural = 0.9 * self.prefer_neural + 0.1 * float(prefer)
        if prefer:
            self._run += 1
        elif self._run:
            self.run_len += 0.25 * (self._run - self.run_len)
            self._run = 0

    def share(self, policy: DraftPolicy, match_len: np.ndarray, offered: np.ndarray, neural_k: int, neural_rows: Any,
              behind: int, in_step: int, remaining: int | None = None, first: int = 0,
              branched: np.ndarray | None = None) -> float:
        """The share, in (0, 1], of the cost of a catch-up over ``behind`` tokens that this step is charged,
        where a drafter in step would read ``in_step`` (charged whole) and ``first`` of the others are first
        reads; the other arguments are ``policy.decide``'s (``remaining``: tokens a row may still emit; None:
        256 assumed). Call it (or :meth:`decide`) once per step: it also counts the step's best choice in
        step."""
        if not neural_k:
            return 1.0
        _, src = policy.decide(match_len, offered, neural_k, neural_rows, neural_behind=in_step, count=False,
                               branched=branched)
        self._count(src)
        if behind <= in_step:
            return 1.0
        left = 256 if remaining is None else max(int(remaining), 1)
        extra = behind - in_step  # what it reads beyond a forward in step, which the step pays whole
        first = min(max(int(first), 0), extra)
        serves_first = max(1.0, self.prefer_neural * left / max(self.per_step, 1.0))
        serves_gap = max(1.0, self.run_len, float(self._run))
        part = (first / serves_first + (extra - first) / serves_gap) / extra
        whole, own = policy.cost.seconds(behind), policy.cost.seconds(in_step)
        return min(1.0, (own + part * max(whole - own, 0.0)) / whole)

    def decide(self, policy: DraftPolicy, match_len: np.ndarray, offered: np.ndarray, neural_k: int,
               neural_rows: Any, behind: int, in_step: int, remaining: int | None = None,
               first: int = 0, branched: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``policy.decide`` for this step with the catch-up's share charged (arguments as :meth:`share`).
        Where the drafter is in step (``behind <= in_step``) its choice in step is the step's choice: one
        allocation, not two."""
        if neural_k and behind <= in_step:
            lengths, src = policy.decide(match_len, offered, neural_k, neural_rows, neural_behind=behind,
                                         branched=branched)
            self._count(src)
            return lengths, src
        share = self.share(policy, match_len, offered, neural_k, neural_rows, behind, in_step, remaining, first,
                           branched)
        return policy.decide(match_len, offered, neural_k, neural_rows, neural_behind=behind, catchup_share=share,
                             branched=branched)
