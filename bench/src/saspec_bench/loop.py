"""Greedy speculative decoding over Hugging Face causal LMs, written out.

No framework: one loop, a few drafters, and the target's ``DynamicCache``.
The output is token-identical to plain greedy decoding (``model.generate(
do_sample=False)``) for every drafter in float32, because every emitted token
is the target's own argmax given everything before it. (In bfloat16 a verify
forward over several tokens rounds differently from one-token steps, so an
exact tie between the top two logits can break the other way.)

State of one sequence::

    seq     prompt + generated tokens (python ints)
    target  KV cache over seq[:cached]; after each step cached == len(seq) - 1
            (the newest token, the target's own last pick, is fed with the next
            step's drafts)

One step::

    drafts = drafter.propose(seq, limit)           # up to K tokens that may follow seq, at most limit
    logits = target(seq[cached:] + drafts)          # ONE forward; keep the last len(drafts)+1 rows
    picks  = argmax(logits)                         # picks[i]: target's token after seq + drafts[:i]
    n      = longest prefix with drafts[:n] == picks[:n]
    seq   += drafts[:n] + [picks[n]]                # n accepted drafts + the bonus token
    crop the target cache to len(seq) - 1; drafter.update(seq)

The first step feeds the whole prompt, so prefill and the first verification
(of drafts made from the prompt alone) are the same forward; this is also what
``saspec_bench.commands.simulate`` models, so the SA-only acceptance of the loop and of the
simulator agree on the same output.

Drafters: :class:`NoDrafter`, :class:`ModelDrafter` (a small LM with its own KV
cache), :class:`SADrafter` (a :class:`~saspec.SpecEngine` suffix automaton),
and :class:`SAModelDrafter` (the SA when its match is at least ``T`` tokens,
otherwise the small LM, which then catches up on the tokens it did not see in
one forward).

Timing: :class:`GenStats` reports the prefill (the first step) and the decode
(every later step) apart, since tok/s over a whole generation hides the decode
speed-up behind the prefill. dtype: ``lm.pick_dtype`` runs models in bfloat16
only on CPUs with native bf16 matmuls, float32 elsewhere; every result names
the dtype it ran in. The model plumbing (``CausalLM``, the KV-cache helpers)
is in :mod:`.lm`.

Batch: the loop runs one sequence. Drafter state is per sequence and the SA
already goes through the engine's batch API, so a batched loop needs a
ragged/padded target forward and per-row cache crops; nothing else changes.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, Sequence

import numpy as np
import torch

from saspec.engine import SpecEngine
from saspec.pool import RequestPool
from saspec.policy import SequencePolicy
from saspec.integrations.hf import SMALL_ROWS, fast_small_linears  # noqa: F401  (re-exported for the loop's users)
from saspec.rules import DRAFT_LENGTH_RULES, HYBRID_THRESHOLD, draft_length
from saspec.single import SingleSequence
from .lm import CausalLM, count_forwards, model_dtype
from .models import EOS_IDS

DRAFTERS = ("none", "draft", "sa", "hybrid")


# -- stats -----------------------------------------------------------------------


@dataclass
class GenStats:
    """What one generation did.

    ``target_forwards`` counts every target forward, the first (prefill) one
    included; ``al`` is ``new_tokens / target_forwards`` (tokens per target
    forward, the same quantity ``saspec simulate`` reports). Step counts are
    per draft source: ``sa``, ``draft`` (the small LM) or ``none`` (no draft).

    Times are seconds of wall clock. The prefill is the first step: the target
    forward over the whole prompt (which also verifies the drafts made from
    the prompt alone), with whatever drafting preceded it; it emitted
    ``prefill_tokens`` tokens in ``prefill_s`` seconds. The decode is the
    rest: ``decode_tokens`` tokens in ``decode_s`` seconds, so
    ``decode_tok_per_s`` is the steady-state speed that a prefill would
    otherwise hide in ``tok_per_s``. ``dtype`` is the target's parameter dtype
    (``"float32"``, ``"bfloat16"``, ...).
    """

    new_tokens: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    steps: dict[str, int] = field(default_factory=lambda: {"sa": 0, "draft": 0, "none": 0})
    drafted: dict[str, int] = field(default_factory=lambda: {"sa": 0, "draft": 0, "none": 0})
    accepted: dict[str, int] = field(default_factory=lambda: {"sa": 0, "draft": 0, "none": 0})
    prefill_s: float = 0.0
    prefill_tokens: int = 0
    wall_s: float = 0.0
    dtype: str = ""

    @property
    def al(self) -> float:
        return self.new_tokens / max(self.target_forwards, 1)

    @property
    def tok_per_s(self) -> float:
        """Generated tokens per second of the whole generation, prefill included."""
        return self.new_tokens / max(self.wall_s, 1e-9)

    @property
    def decode_s(self) -> float:
        return max(self.wall_s - self.prefill_s, 0.0)

    @property
    def decode_tokens(self) -> int:
        return self.new_tokens - self.prefill_tokens

    @property
    def decode_tok_per_s(self) -> float:
        """Tokens per second after the prefill step (0 when nothing followed it)."""
        return self.decode_tokens / self.decode_s if self.decode_tokens > 0 and self.decode_s > 0 else 0.0

    def frac(self, source: str) -> float:
        """Fraction of steps whose draft came from ``source``."""
        return self.steps.get(source, 0) / max(sum(self.steps.values()), 1)

    def as_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "new_tokens": self.new_tokens, "target_forwards": self.target_forwards,
                "draft_forwards": self.draft_forwards, "al": self.al, "tok_per_s": self.tok_per_s,
                "wall_s": self.wall_s, "prefill_s": self.prefill_s, "prefill_tokens": self.prefill_tokens,
                "decode_s": self.decode_s, "decode_tokens": self.decode_tokens,
                "decode_tok_per_s": self.decode_tok_per_s, "steps": dict(self.steps),
                "drafted": dict(self.drafted), "accepted": dict(self.accepted),
                "sa_frac": self.frac("sa"), "draft_frac": self.frac("draft")}

    def summary(self) -> str:
        return (f"[{self.dtype or '?'}] {self.new_tokens} tokens in {self.wall_s:.2f} s = {self.tok_per_s:.2f} tok/s; "
                f"prefill {self.prefill_s:.2f} s ({self.prefill_tokens} tokens), decode {self.decode_tokens} tokens "
                f"in {self.decode_s:.2f} s = {self.decode_tok_per_s:.2f} tok/s; "
                f"{self.target_forwards} target forwards, AL {self.al:.2f}; "
                f"steps SA {self.frac('sa'):.0%} / draft model {self.frac('draft'):.0%} / none {self.frac('none'):.0%}; "
                f"draft-model forwards {self.draft_forwards}")


@dataclass
class GenResult:
    """``tokens``: the generated ids (prompt excluded), EOS included when hit."""

    tokens: list[int]
    stats: GenStats


# -- drafters --------------------------------------------------------------------


class Drafter(Protocol):
    """Proposes tokens that may follow a sequence.

    ``begin(prompt)`` starts a sequence; ``propose(seq, limit)`` returns
    ``(tokens, source)``: at most ``k`` tokens (and at most ``limit`` unless
    it is None) and the source the drafter chose, ``"sa"``, ``"draft"`` or
    ``"none"``. The loop passes as ``limit`` the draft tokens it can still
    verify before ``max_new_tokens``, so no draft forward is spent on tokens it
    would cut. ``update(seq, n_new)`` reports that the last ``n_new`` tokens of
    ``seq`` were appended (verified); ``end()`` releases the sequence's state.
    ``gate``: the drafter's :class:`~saspec.policy.SequencePolicy` or None; the loop
    reports every verify forward's size and time to it.
    """

    name: str
    gate: SequencePolicy | None

    def begin(self, prompt: Sequence[int]) -> None: ...

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]: ...

    def update(self, seq: list[int], n_new: int) -> None: ...

    def end(self) -> None: ...


class NoDrafter:
    """No drafts: plain greedy decoding, one target forward per token."""

    name = "none"
    gate = None

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]:
        return [], "none"

    def update(self, seq: list[int], n_new: int) -> None:
        pass

    def end(self) -> None:
        pass


class ModelDrafter:
    """Greedy drafts from a small causal LM that shares the target's tokenizer.

    Its KV cache lags behind ``seq`` as little as possible: ``propose`` first
    feeds, in one forward, every token of ``seq`` the cache does not hold
    (after a rejection, or after steps the hybrid gave to the SA), then drafts
    one token per forward. Drafting stops after ``k`` tokens, or after a token
    whose probability under the draft model is below ``stop_below`` (that
    token is still proposed: verifying it costs little, drafting past it
    rarely pays).

    With a ``gate`` (:class:`~saspec.policy.SequencePolicy`), each step drafts the
    length the gate chooses, or nothing where no draft pays; the gate times
    the draft forwards.
    """

    name = "draft"

    def __init__(self, model: torch.nn.Module, k: int = 8, stop_below: float = 0.0,
                 gate: SequencePolicy | None = None) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not 0.0 <= stop_below <= 1.0:
            raise ValueError(f"stop_below must be a probability in [0, 1], got {stop_below}")
        self.lm = CausalLM(model)
        self.k = k
        self.stop_below = stop_below
        self.gate = gate
        self._fed: list[int] = []  # the tokens whose K/V are in the cache
        self._last: list[int] = []  # the gated draft of the current step

    def begin(self, prompt: Sequence[int]) -> None:
        self.lm.reset()
        self._fed = []
        self._last = []

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]:
        k = _limited(self.k, limit)
        if self.gate is None:
            return (self.draft(seq, k) if k else []), "draft"
        if k == 0:
            return [], "none"
        source, n = self.gate.choose(0, 0, k, len(seq) - len(self._fed), remaining=limit)
        if source == "probe":
            return seq[-1:], "none"  # a guess: only the verify's cost is wanted
        self._last = self.draft(seq, n, self.gate) if source == "draft" else []
        return (self._last, "draft") if self._last else ([], "none")

    def draft(self, seq: list[int], k: int, timer: SequencePolicy | None = None) -> list[int]:
        """Up to ``k`` greedy draft tokens after ``seq``; ``timer`` gets the
        time of each forward and how many tokens it read (a catch-up over a
        long stretch, like the first one after the prompt, reads many)."""
        feed = seq[len(self._fed):]
        if not feed:
            raise RuntimeError("draft model cache holds the whole sequence; expected at least the newest token to be new")
        out: list[int] = []
        clock = timer.clock if timer is not None else time.perf_counter
        for _ in range(k):
            t0 = clock()
            logits = self.lm.forward(feed, keep=1)[0].float()  # [V]
            if timer is not None and clock() > t0:  # a draft token, or a catch-up over len(feed) tokens
                timer.observe_draft_forward(clock() - t0, read=len(feed))
            self._fed.extend(feed)
            tok = int(torch.argmax(logits))
            out.append(tok)
            if self.stop_below > 0 and float(torch.softmax(logits, -1)[tok]) < self.stop_below:
                break
            feed = [tok]
        return out

    def update(self, seq: list[int], n_new: int) -> None:
        if self.gate is not None and self._last:
            self.gate.observe("draft", 0, len(self._last), _accepted(self._last, seq, n_new))
            self._last = []
        # Keep the longest prefix of what the cache holds that is still in seq.
        start = len(seq) - n_new
        keep = min(len(self._fed), start)
        while keep < min(len(self._fed), len(seq)) and self._fed[keep] == seq[keep]:
            keep += 1
        if keep < len(self._fed):
            self.lm.crop(keep)
            del self._fed[keep:]

    def end(self) -> None:
        self.lm.cache = None
        self._fed = []
        self._last = []


def _limited(k: int, limit: int | None) -> int:
    """``k`` capped by a draft-token ``limit`` (None: no limit)."""
    return k if limit is None else max(0, min(k, limit))


def _accepted(draft: list[int], seq: list[int], n_new: int) -> int:
    """How many leading tokens of ``draft`` the last ``n_new`` tokens of ``seq`` confirm."""
    new = seq[len(seq) - n_new:]
    n = 0
    while n < min(len(draft), len(new)) and draft[n] == new[n]:
        n += 1
    return n


_FIXED, _PER_MATCH = DRAFT_LENGTH_RULES.index("fixed"), DRAFT_LENGTH_RULES.index("per-match")


class SADrafter:
    """Drafts from a suffix automaton over the sequence's own tokens (prompt included).

    Each ``propose`` feeds the tokens accepted since the last call to the
    automaton (:class:`~saspec.single.SingleSequence`) and reads back the
    match length (``self.match``, in tokens: the longest suffix of seq seen
    earlier) and up to ``k`` draft tokens. No draft when the match is empty.

    ``per_match`` > 0 drafts at most ``ceil(per_match * match)`` tokens: a
    short match rarely continues far, and every drafted token is verified by
    the target. 0 always drafts ``k`` (what ``saspec_bench.commands.simulate`` models).

    With a ``gate`` (:class:`~saspec.policy.SequencePolicy`) the gate chooses the
    draft length from the match length instead (``per_match`` is unused),
    and nothing where no draft pays; it is offered the automaton's draft
    every step.
    """

    name = "sa"

    def __init__(self, k: int = 8, engine: Any = None, per_match: float = 0.0, gate: SequencePolicy | None = None) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if per_match < 0:
            raise ValueError(f"per_match must be >= 0, got {per_match}")
        self.k = k
        self.per_match = per_match
        self.gate = gate
        self.engine = engine if engine is not None else SpecEngine()
        self._seq: SingleSequence | None = None
        self._pending: list[int] = []
        self.match = 0
        self.branched = False  # the last lookup's match went on with several tokens earlier

    def begin(self, prompt: Sequence[int]) -> None:
        self.end()
        self._seq = SingleSequence(self.engine, np.asarray(prompt, dtype=np.int32), self.k)  # validates the prompt
        self._pending = []

    def lookup(self, capped: bool = True) -> tuple[int, list[int]]:
        """Feed pending tokens; return (match length, draft tokens), the
        draft cut by :meth:`draft_length` unless ``capped`` is False."""
        self.match, draft = self._seq.extend(self._pending)
        self.branched = self._seq.branched
        self._pending = []
        if capped:
            draft = draft[: self.draft_length(self.match)]
        return self.match, draft

    def draft_length(self, match: int) -> int:
        """SA tokens to draft after a match of ``match`` tokens: the library's
        ``lengths.draft_length`` rule (``per-match`` with scale ``per_match``,
        ``fixed`` K when ``per_match`` is 0)."""
        if self.per_match > 0:
            return draft_length(match, self.k, _PER_MATCH, self.per_match, -1)
        return draft_length(match, self.k, _FIXED, 1.0, -1)

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]:
        if self.gate is not None:
            match, draft = self.lookup(capped=False)
            self.gate.offer(match, draft, self.branched)
            if limit == 0:
                return [], "none"
            draft = draft[: _limited(len(draft), limit)]
            source, n = self.gate.choose(match, len(draft))
            if source == "probe" and not draft:
                return seq[-1:], "none"  # a guess: only the verify's cost is wanted
            draft = draft[:n] if source in ("sa", "probe") else []
            return (draft, "sa") if draft else ([], "none")
        match, draft = self.lookup()
        if match == 0 or not draft:
            return [], "none"
        return draft[: _limited(len(draft), limit)], "sa"

    def update(self, seq: list[int], n_new: int) -> None:
        new = seq[len(seq) - n_new:]
        if self.gate is not None:
            self.gate.observe_tokens(new)
        self._pending.extend(new)

    def end(self) -> None:
        if self._seq is not None:
            if self._pending and self.engine.request_pool is not None:
                self._seq.extend(self._pending)  # the pool gets the whole text
            self._seq.close()
            self._seq = None


class SAModelDrafter:
    """The SA's draft when its match is at least ``threshold`` tokens, else the
    small LM's. The SA sees every accepted token; the small LM runs only on
    the steps it drafts and catches up on the rest then.

    ``patience`` > 0 also keeps a weak SA match (below ``threshold``) until
    the SA has failed on that many steps in a row (its draft, used or not,
    matched none of the accepted tokens). The SA's draft costs nothing to
    make, the small LM's costs forwards (and a prefill on first use), so
    where the SA recovers right after a short novel span, as in code edits,
    the small LM is not worth waking; in prose, where the SA keeps failing,
    it is. 0 is the plain threshold rule.

    With a ``gate`` (:class:`~saspec.policy.SequencePolicy`) the gate makes the
    choice instead (``threshold`` and ``patience`` are unused): each step,
    the SA's draft, the small LM's or none, at the length that is expected
    to make the most tokens per second. The SA and the small LM must then
    have no gate of their own.
    """

    name = "hybrid"

    def __init__(self, sa: SADrafter, model: ModelDrafter, threshold: int = HYBRID_THRESHOLD,
                 patience: int = 0, gate: SequencePolicy | None = None) -> None:
        if gate is not None and (sa.gate is not None or model.gate is not None):
            raise ValueError("a gated hybrid drives its SA and draft model itself: give them no gate")
        if threshold < 1 or patience < 0:
            raise ValueError(f"need threshold >= 1 and patience >= 0, got threshold={threshold}, patience={patience}")
        self.sa = sa
        self.model = model
        self.threshold = threshold
        self.patience = patience
        self.gate = gate
        self._sa_draft: list[int] = []
        self._sa_failures = 0
        self._last: tuple[str, int, list[int]] = ("none", 0, [])  # the gated step: source, match, draft

    def begin(self, prompt: Sequence[int]) -> None:
        self.sa.begin(prompt)
        self.model.begin(prompt)
        self._sa_draft, self._sa_failures = [], 0
        self._last = ("none", 0, [])

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]:
        model_k = _limited(self.model.k, limit)
        if self.gate is not None:
            match, draft = self.sa.lookup(capped=False)
            self.gate.offer(match, draft, self.sa.branched)
            if limit == 0:
                self._last = ("none", match, [])
                return [], "none"
            draft = draft[: _limited(len(draft), limit)]
            source, n = self.gate.choose(match, len(draft), model_k, len(seq) - len(self.model._fed), remaining=limit)
            if source == "probe":
                if not draft:
                    return seq[-1:], "none"  # a guess: only the verify's cost is wanted
                source = "sa"
            if source == "draft":
                draft = self.model.draft(seq, n, self.gate)
            self._last = (source, match, draft[:n] if source != "none" else [])
            return (self._last[2], source) if self._last[2] else ([], "none")
        match, draft = self.sa.lookup()
        self._sa_draft = draft
        if draft and (match >= self.threshold or self._sa_failures < self.patience):
            return draft[: _limited(len(draft), limit)], "sa"
        return (self.model.draft(seq, model_k) if model_k else []), "draft"

    def update(self, seq: list[int], n_new: int) -> None:
        source, match, draft = self._last
        new = seq[len(seq) - n_new:]
        if self.gate is not None:
            if source == "draft" and draft:
                self.gate.observe("draft", 0, len(draft), _accepted(draft, seq, n_new))
            self.gate.observe_tokens(new)  # scores the automaton's offer
            self._last = ("none", 0, [])
        hit = bool(self._sa_draft) and self._sa_draft[0] == new[0]
        self._sa_failures = 0 if hit else self._sa_failures + 1
        self.sa.update(seq, n_new)
        self.model.update(seq, n_new)

    def end(self) -> None:
        self.sa.end()
        self.model.end()


def make_drafter(kind: str, *, draft_model: torch.nn.Module | None = None, k: int = 8,
                 draft_k: int | None = None, threshold: int = HYBRID_THRESHOLD,
                 stop_below: float = 0.0, per_match: float = 0.0, patience: int = 0,
                 gate: bool = False, pool: RequestPool | None = None) -> Drafter:
    """A drafter by name (one of :data:`DRAFTERS`). ``k``: SA draft tokens
    (at most ``per_match`` per matched token when > 0); ``draft_k``: small-LM
    draft tokens (default ``k``), ``stop_below``: its confidence stop;
    ``threshold``, ``patience``: the hybrid's rule (see :class:`SAModelDrafter`).
    ``gate``: draft only where it pays, at the length that pays most, under
    costs timed while it runs (a fresh :class:`~saspec.policy.SequencePolicy`;
    ``per_match``, ``threshold`` and ``patience`` are then unused). ``pool``:
    the SA's engine drafts from this cross-request pool too, and each finished
    sequence joins it."""
    if kind not in DRAFTERS:
        raise ValueError(f"unknown drafter {kind!r}; choose from {', '.join(DRAFTERS)}")
    if kind in ("draft", "hybrid") and draft_model is None:
        raise ValueError(f"drafter {kind!r} needs a draft model")
    if draft_k is not None and draft_k < 1:
        raise ValueError(f"draft_k must be None or >= 1, got {draft_k}")
    cost_gate = SequencePolicy.for_engine(max(k, draft_k or k)) if gate else None
    if kind == "none":
        return NoDrafter()
    engine = SpecEngine(pool=pool) if pool is not None else None
    if kind == "sa":
        return SADrafter(k, engine=engine, per_match=per_match, gate=cost_gate)
    if kind == "draft":
        return ModelDrafter(draft_model, draft_k or k, stop_below, gate=cost_gate)
    return SAModelDrafter(SADrafter(k, engine=engine, per_match=per_match),
                         ModelDrafter(draft_model, draft_k or k, stop_below), threshold, patience, gate=cost_gate)


# -- the loop --------------------------------------------------------------------


@torch.inference_mode()
def speculative_generate(
    target: torch.nn.Module,
    prompt: Sequence[int],
    drafter: Drafter,
    max_new_tokens: int,
    eos_ids: Sequence[int] = EOS_IDS,
) -> GenResult:
    """Greedy decoding of ``target`` after ``prompt`` (token ids), with drafts
    from ``drafter`` verified one target forward per step.

    Stops after ``max_new_tokens`` tokens or at the first token in ``eos_ids``
    (included in the output), exactly like ``generate(do_sample=False)``.
    """
    if isinstance(prompt, (torch.Tensor, np.ndarray)) and prompt.ndim != 1:
        if prompt.ndim != 2 or prompt.shape[0] != 1:
            raise ValueError(f"prompt must be 1-D token ids or [1, T] (batch 1), got shape {tuple(prompt.shape)}")
        prompt = prompt[0]
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("prompt is empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    stop = set(int(e) for e in eos_ids)
    lm = CausalLM(target)
    lm.reset()
    stats = GenStats(dtype=model_dtype(target))
    draft_lm = _draft_lm(drafter)
    gate = getattr(drafter, "gate", None)
    clock = gate.clock if gate is not None else time.perf_counter
    draft_forwards0 = draft_lm.forwards if draft_lm else 0
    seq = list(prompt)
    t0 = time.perf_counter()
    drafter.begin(prompt)
    try:
        while True:
            t_step = clock()
            limit = max_new_tokens - (len(seq) - len(prompt)) - 1  # never verify past max_new_tokens
            drafts, source = drafter.propose(seq, limit)
            drafts = drafts[:limit]
            drafting_s = clock() - t_step if source == "draft" else 0.0  # the draft model's, timed per token apart
            feed = seq[lm.cached:] + drafts
            picks = torch.argmax(lm.forward(feed, keep=len(drafts) + 1), dim=-1).tolist()  # [len(drafts)+1]
            n = 0
            while n < len(drafts) and drafts[n] == picks[n]:
                n += 1
            new = drafts[:n] + [picks[n]]
            for i, t in enumerate(new):  # stop at EOS
                if t in stop:
                    new = new[: i + 1]
                    break
            seq.extend(new)
            lm.crop(len(seq) - 1)
            stats.steps[source] += 1
            stats.drafted[source] += len(drafts)
            stats.accepted[source] += min(n, len(new))
            if stats.target_forwards == 0:
                stats.prefill_s = time.perf_counter() - t0
                stats.prefill_tokens = len(new)
            stats.target_forwards += 1
            drafter.update(seq, len(new))  # the last step's too: a pooled drafter keeps the whole text
            if len(seq) - len(prompt) >= max_new_tokens or new[-1] in stop:
                break
            step_s = clock() - t_step - drafting_s
            if gate is not None and stats.target_forwards > 1 and step_s > 0:  # the first step is the prefill
                gate.observe_forward(len(feed), step_s)
    finally:
        drafter.end()
    stats.wall_s = time.perf_counter() - t0
    stats.new_tokens = len(seq) - len(prompt)
    stats.draft_forwards = (draft_lm.forwards - draft_forwards0) if draft_lm else 0
    return GenResult(seq[len(prompt):], stats)


def _draft_lm(drafter: Drafter) -> CausalLM | None:
    if isinstance(drafter, ModelDrafter):
        return drafter.lm
    if isinstance(drafter, SAModelDrafter):
        return drafter.model.lm
    return None


# -- Hugging Face baselines --------------------------------------------------------


class _StepClock:
    """A transformers streamer that times the steps of ``generate``.

    ``generate`` first puts the prompt, then each step's new tokens (one per
    step for plain decoding, one or more for assisted decoding). ``first``
    holds (seconds since ``t0``, tokens) of the first step after the prompt.
    """

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.puts = 0
        self.first: tuple[float, int] | None = None

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = (time.perf_counter() - self.t0, int(value.numel()))

    def end(self) -> None:
        pass


@torch.inference_mode()
def hf_generate(
    target: torch.nn.Module,
    prompt: Sequence[int],
    max_new_tokens: int,
    eos_ids: Sequence[int] = EOS_IDS,
    *,
    assistant: torch.nn.Module | None = None,
    prompt_lookup: int | None = None,
) -> GenResult:
    """Greedy ``target.generate`` (plain, with ``assistant_model=assistant``, or
    with ``prompt_lookup_num_tokens=prompt_lookup``), timed, with its target
    forwards counted. The prefill (the first step, see :class:`GenStats`) is
    timed by a streamer. Step sources are not known for HF and stay zero."""
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=next(target.parameters()).device)
    kwargs: dict[str, Any] = {}
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    if prompt_lookup is not None:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup
    eos = list(eos_ids) or None
    stats = GenStats(dtype=model_dtype(target))
    with count_forwards(target) as n_target:
        with count_forwards(assistant) if assistant is not None else _nullcount() as n_draft:
            t0 = time.perf_counter()
            clock = _StepClock(t0)
            out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=max_new_tokens, eos_token_id=eos,
                                  pad_token_id=eos[0] if eos else 0, temperature=None, top_p=None, top_k=None,
                                  streamer=clock, **kwargs)
            stats.wall_s = time.perf_counter() - t0
    tokens = out[0, ids.shape[1]:].tolist()
    if eos:  # generate pads finished rows; a single row stops at its EOS anyway
        for i, t in enumerate(tokens):
            if t in eos:
                tokens = tokens[: i + 1]
                break
    stats.new_tokens = len(tokens)
    stats.target_forwards = n_target[0]
    stats.draft_forwards = n_draft[0]
    if clock.first is not None:
        stats.prefill_s = clock.first[0]
        stats.prefill_tokens = min(clock.first[1], len(tokens))
    return GenResult(tokens, stats)


@contextmanager
def _nullcount() -> Iterator[list[int]]:
    yield [0]
