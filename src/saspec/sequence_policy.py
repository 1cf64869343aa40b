"""The drafting policy of a decoding loop at batch 1 (:class:`SequencePolicy`)."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from .allocation import AUTOMATON, NEURAL
from .catch_up import CatchUpShare
from .draft_policy import DraftPolicy
from .policy_settings import Decision, PolicySettings, engine_cost, env_log
from .step_cost import StepCost


class SequencePolicy:
    """:class:`DraftPolicy` for one sequence (batch 1), in the call pattern of a decoding loop.

    Each step the loop:

    1. offers the automaton's draft (:meth:`offer`, before cutting it);
    2. asks :meth:`choose` for ``(source, length)``: ``"sa"``, ``"draft"``
       (the neural drafter) or ``"none"``;
    3. times the target forward (:meth:`observe_forward`; the neural drafter's
       calls apart, :meth:`observe_draft_call` or per forward
       :meth:`observe_draft_forward`), reports the neural draft's outcome
       (:meth:`observe` with ``"draft"``) and the tokens the step emitted
       (:meth:`observe_tokens`, which scores the automaton's offer).

    A neural drafter that must first read a long stretch (the prompt, when it
    has not drafted before) is charged a share of that catch-up
    (:class:`CatchUpShare`).

    Args:
        k_max: the most draft tokens of any source (>= 1).
        cost, settings, neural_catchup_sunk, log, clock: as :class:`DraftPolicy`.

    Attributes:
        policy: the :class:`DraftPolicy`.
        stats: ``steps``, ``sa``, ``draft``, ``none`` (steps by choice) and the policy's counters.
    """

    SOURCES = ("sa", "draft")

    def __init__(self, k_max: int, *, cost: StepCost | None = None, settings: PolicySettings | None = None,
                 neural_catchup_sunk: bool = False, log: Callable[[Decision], Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.policy = DraftPolicy(k_max, cost=cost, settings=settings, neural_catchup_sunk=neural_catchup_sunk,
                                  log=log, clock=clock)
        self.k_max = self.policy.k_max
        self.clock = clock
        self._offer: tuple[int, list[int], int] | None = None
        self._m = np.zeros(1, np.int64)
        self._off = np.zeros(1, np.int64)
        self._br = np.zeros(1, np.int32)
        self.catch_up = CatchUpShare()
        self._drafted = False  # the neural drafter has drafted in this sequence (begin: a new one): a gap
        self._counts = {"steps": 0, "sa": 0, "draft": 0, "none": 0}

    @classmethod
    def for_engine(cls, k_max: int, *, device: str = "cpu", settings: PolicySettings | None = None,
                   max_tokens: int | None = None, neural_catchup_sunk: bool = False,
                   log: Callable[[Decision], Any] | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> SequencePolicy:
        """The sequence policy an engine uses, with its cost model, as :meth:`DraftPolicy.for_engine`
        (same arguments and errors)."""
        ps = settings if settings is not None else PolicySettings()
        return cls(k_max, cost=engine_cost(ps, device, max_tokens), settings=ps,
                   neural_catchup_sunk=neural_catchup_sunk, log=log if log is not None else env_log(), clock=clock)

    @property
    def stats(self) -> dict[str, int]:
        return {**self.policy.stats, **self._counts}

    def offer(self, match: int, draft: Sequence[int], branched: bool = False) -> None:
        """The automaton's draft this step (before :meth:`choose` cuts it), made at a match of ``match``
        (``branched``: whose earlier occurrences went on with several tokens, ``SingleSequence.branched``)."""
        has = len(draft) and match > 0
        self._offer = (int(match), [int(t) for t in draft][: self.k_max], int(bool(branched))) if has else None
        self._br[0] = int(bool(branched)) if has else 0

    def withdraw_offer(self) -> None:
        """Drop the pending offer unscored (its sequence ended or changed)."""
        self._offer = None

    def begin(self) -> None:
        """A new sequence starts (a policy may serve several in turn): what the neural drafter has not read of
        it is a first read (its prompt), not a gap; a pending offer is dropped unscored."""
        self._offer = None
        self._drafted = False

    def choose(self, match: int, sa_len: int, model_k: int = 0, model_behind: int = 1,
               remaining: int | None = None) -> tuple[str, int]:
        """``(source, length)`` for this step: ``"sa"`` with up to ``sa_len`` tokens (the automaton's
        draft at a match of ``match``), ``"draft"`` with up to ``model_k`` neural tokens (it first reads
        the ``model_behind`` tokens it has not seen), or ``("none", 0)``. ``remaining``: the tokens the
        sequence may still emit (None: unknown, 256 assumed)."""
        self._counts["steps"] += 1
        self._m[0] = match if sa_len > 0 else 0
        self._off[0] = min(max(int(sa_len), 0), self.k_max)
        k_nn = min(max(int(model_k), 0), self.k_max)
        lengths, src = self.catch_up.decide(self.policy, self._m, self._off, k_nn, None, model_behind, 1, remaining,
                                            first=0 if self._drafted else model_behind, branched=self._br)
        d, s = int(lengths[0]), int(src[0])
        self._drafted |= s == NEURAL
        if s == AUTOMATON:
            self._counts["sa"] += 1
            return "sa", d
        if s == NEURAL:
            self._counts["draft"] += 1
            return "draft", d
        self._counts["none"] += 1
        return "none", 0

    def observe_forward(self, tokens: int, seconds: float) -> None:
        """A target forward over ``tokens`` tokens took ``seconds`` (ignored unless finite and > 0)."""
        self.policy.observe_step(tokens, seconds)

    def observe_draft_call(self, seconds: float, read: int, drafted: int) -> None:
        """A neural drafter call: ``seconds``, reading ``read`` tokens first, drafting ``drafted``."""
        self.policy.observe_neural(seconds, read, drafted)

    def observe_draft_forward(self, seconds: float, read: int) -> None:
        """One neural drafter forward over ``read`` tokens took ``seconds``."""
        self.policy.observe_neural(seconds, read, 1)

    def observe(self, source: str, match: int, drafted: int, accepted: int) -> None:
        """A step verified ``drafted`` tokens from ``source`` and accepted the first ``accepted``. The
        automaton's offers are scored by :meth:`observe_tokens` (this ignores ``"sa"``)."""
        if source not in self.SOURCES:
            raise ValueError(f"unknown source {source!r}; choose from {', '.join(self.SOURCES)}")
        if source == "draft":
            self.policy.observe_neural_outcome(int(drafted), int(accepted))
        elif not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")

    def observe_tokens(self, tokens: Sequence[int]) -> None:
        """The tokens the step emitted (accepted drafts and the target's own), in order."""
        tokens = [int(t) for t in tokens]
        self.catch_up.observe_tokens(len(tokens))
        if self._offer is None or not tokens:
            self._offer = None
            return
        match, draft, branched = self._offer
        self._offer = None
        n = min(len(draft), len(tokens))
        d = np.asarray(draft[:n], np.int64).reshape(1, n)
        t = np.asarray(tokens[:n], np.int64).reshape(1, n)
        self.policy.observe(np.array([match], np.int64), np.array([n], np.int64), d, t, np.array([n], np.int64),
                            np.array([branched], np.int32))
