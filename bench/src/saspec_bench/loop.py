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
    crop the target cache to len(seq) - 1; drafter.update(seq, n + 1, seconds=forward's)

The first step feeds the whole prompt, so prefill and the first verification
(of drafts made from the prompt alone) are the same forward; this is also what
``saspec_bench.commands.simulate`` models, so the SA-only acceptance of the loop and of the
simulator agree on the same output.

Drafters: :class:`NoDrafter`, :class:`ModelDrafter` (a small LM with its own KV
cache), :class:`SADrafter` (a suffix automaton), and :class:`SAModelDrafter`
(the SA when its match is at least ``T`` tokens, otherwise the small LM, which
then catches up on the tokens it did not see in one forward). Each drives one
library :class:`~saspec.drafter.Drafter` at batch 1, which holds the automaton,
the cross-request pool, the drafting policy (``policy=True``: which source
drafts, and how long, from costs timed as it runs) with the last step's offers,
and the sequence's drafting options: the drafters here are the loop's glue
(the draft model's KV cache, one ``Drafter.step`` per step with the tokens it
emitted and the loop's timing of the target forward that verified them).

Timing: :class:`GenStats` reports the prefill (the first step) and the decode
(every later step) apart, since tok/s over a whole generation hides the decode
speed-up behind the prefill. dtype: ``lm.pick_dtype`` runs models in bfloat16
only on CPUs with native bf16 matmuls, float32 elsewhere; every result names
the dtype it ran in. The model plumbing (``CausalLM``, the KV-cache helpers)
is in :mod:`.lm`.

Batch: the loop runs one sequence. The ``Drafter`` takes a batch of rows, so a
batched loop needs a ragged/padded target forward and per-row cache crops;
nothing else changes.
"""

from __future__ import annotations

import itertools
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
import torch

from saspec.drafter import POLICY, DraftBatch, Drafter
from saspec.options import parse_options
from saspec.policy import NEURAL
from saspec.pool import RequestPool
from saspec.integrations.hf import SMALL_ROWS, fast_small_linears  # noqa: F401  (re-exported for the loop's users)
from saspec.rules import HYBRID_THRESHOLD
from saspec.validate import as_tokens
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


class LoopDrafter(Protocol):
    """Proposes tokens that may follow a sequence.

    ``begin(prompt, options)`` starts a sequence (``options``: its drafting options,
    ``saspec.options``: ``enabled``, ``max_draft_tokens``, ``hints``; None: the
    defaults); ``propose(seq, limit)`` returns ``(tokens, source)``: at most
    ``k`` tokens (and at most ``limit`` unless it is None) and the source the
    drafter chose, ``"sa"``, ``"draft"`` or ``"none"``. The loop passes as
    ``limit`` the draft tokens it can still verify before ``max_new_tokens``, so
    no draft forward is spent on tokens it would cut. ``update(seq, n_new,
    seconds=, tokens=)`` reports that the last ``n_new`` tokens of ``seq`` were
    appended (verified) by a target forward over ``tokens`` tokens that took
    ``seconds`` (None: not timed, as the prefill); ``end()`` releases the
    sequence's state, ``close()`` the drafter's. ``clock``: the time source the
    loop times the target's forwards with (seconds).
    """

    name: str
    clock: Callable[[], float]

    def begin(self, prompt: Sequence[int], options: Any = None) -> None: ...

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]: ...

    def update(self, seq: list[int], n_new: int, *, seconds: float | None = None, tokens: int = 0) -> None: ...

    def end(self) -> None: ...

    def close(self) -> None: ...


class NoDrafter:
    """No drafts: plain greedy decoding, one target forward per token."""

    name = "none"
    clock = staticmethod(time.perf_counter)

    def begin(self, prompt: Sequence[int], options: Any = None) -> None:
        parse_options(options)  # a bad option is an error here too

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]:
        return [], "none"

    def update(self, seq: list[int], n_new: int, *, seconds: float | None = None, tokens: int = 0) -> None:
        pass

    def end(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Session:
    """One sequence at a time on a library :class:`~saspec.drafter.Drafter` at batch 1: the glue the
    loop's drafters share. The Drafter holds the automaton, the pool, the drafting policy, the last
    step's offers and the neural drafter's evidence; this holds which request runs and the tokens it
    gained since its last step, with the loop's timing of the forward that verified them.

    A sequence starts ``before_prefill`` (see :meth:`Drafter.start <saspec.drafter.Drafter.start>`):
    its first step hands over no tokens and drafts from the whole prompt, and the prefill verifies
    that draft. The Drafter is made at the first :meth:`begin` (a hybrid's parts never make theirs)
    and kept across sequences, so what its policy learnt carries over.

    Args:
        k: the Drafter's K: the most draft tokens of a step from any source (>= 1).
        length_rule: ``"policy"``, or a fixed rule of ``saspec.rules`` (see ``Drafter``).
        length_scale: the fixed rules' tokens per matched token.
        pool: a ``RequestPool`` the automaton also drafts from and each finished sequence joins.
        automaton: False: no automaton drafts (a draft model alone).
        automaton_k: the most automaton draft tokens of a step (default ``k``).
        clock: the Drafter's time source (seconds).
    """

    def __init__(self, k: int, *, length_rule: str, length_scale: float = 2.0, pool: RequestPool | None = None,
                 automaton: bool = True, automaton_k: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._settings = dict(length_rule=length_rule, length_scale=length_scale, min_match=1, pool=pool,
                              automaton=automaton, automaton_k=automaton_k, clock=clock)
        self.k = k
        self.clock = clock
        self.drafter: Drafter | None = None
        self._ids = itertools.count()
        self.rid: int | None = None
        self._new: list[int] = []  # the tokens the sequence gained since its last step
        self._seconds, self._tokens = math.nan, 0  # the forward that verified them

    def begin(self, prompt: Sequence[int], options: Any) -> None:
        tokens = as_tokens(prompt, "prompt")
        if tokens.shape[0] == 0:
            raise ValueError("prompt is empty")
        if self.drafter is None:
            self.drafter = Drafter(self.k, **self._settings)
        self.end()
        rid = next(self._ids)
        self.drafter.start(rid, tokens, options, before_prefill=True)
        self.rid, self._new = rid, []
        self._seconds, self._tokens = math.nan, 0

    def update(self, new: Sequence[int], seconds: float | None, tokens: int) -> None:
        self._new.extend(new)
        self._seconds, self._tokens = (math.nan if seconds is None else seconds), tokens

    def step(self, **neural: Any) -> DraftBatch:
        """The Drafter's step with the tokens gained since the last one (``neural``: its ``neural_k``,
        ``neural_behind``, ``remaining`` and ``max_draft``)."""
        if self.rid is None:
            raise RuntimeError("no sequence: call begin first")
        new = np.asarray([self._new], np.int32)
        batch = self.drafter.step([self.rid], new, np.array([new.shape[1]], np.int32), seconds=self._seconds,
                                  step_tokens=self._tokens, **neural)
        self._new = []
        self._seconds, self._tokens = math.nan, 0
        return batch

    def end(self) -> None:
        if self.rid is None:
            return
        try:
            if self._new and self.drafter.pool is not None:
                self.step()  # the pool gets the whole text, the last step's tokens too
        finally:
            self.drafter.finish(self.rid)
            self.rid, self._new = None, []

    def close(self) -> None:
        """End the sequence, if any, and close the Drafter (its builder thread)."""
        if self.drafter is not None:
            self.end()
            self.drafter.close()
            self.drafter = None


class ModelDrafter:
    """Greedy drafts from a small causal LM that shares the target's tokenizer.

    Its KV cache lags behind ``seq`` as little as possible: ``propose`` first
    feeds, in one forward, every token of ``seq`` the cache does not hold
    (after a rejection, or after steps the hybrid gave to the SA), then drafts
    one token per forward. Drafting stops after ``k`` tokens, or after a token
    whose probability under the draft model is below ``stop_below`` (that
    token is still proposed: verifying it costs little, drafting past it
    rarely pays).

    With ``policy``, each step drafts the length the drafting policy of its
    :class:`~saspec.drafter.Drafter` (``automaton=False``) chooses, or nothing
    where no draft pays; the Drafter times the draft forwards. Without, each
    step drafts ``k`` tokens (within the sequence's ``max_draft_tokens``). ``clock``:
    the time source of the Drafter and the loop (seconds; a test injects one).
    """

    name = "draft"

    def __init__(self, model: torch.nn.Module, k: int = 8, stop_below: float = 0.0, *, policy: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not 0.0 <= stop_below <= 1.0:
            raise ValueError(f"stop_below must be a probability in [0, 1], got {stop_below}")
        self.lm = CausalLM(model)
        self.k = k
        self.stop_below = stop_below
        self.policy = bool(policy)
        self.clock = clock
        self.session = _Session(k, length_rule=POLICY if policy else "fixed", automaton=False, clock=clock)
        self._fed: list[int] = []  # the tokens whose K/V are in the cache

    def begin(self, prompt: Sequence[int], options: Any = None) -> None:
        self.session.begin(prompt, options)
        self.reset()

    def reset(self) -> None:
        """Empty the draft model's cache (a new sequence)."""
        self.lm.reset()
        self._fed = []

    def behind(self, seq: list[int]) -> int:
        """The tokens of ``seq`` the draft model must read before it drafts."""
        return len(seq) - len(self._fed)

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]:
        k = _limited(self.k, limit)
        if not self.policy:
            k = int(self.session.step(max_draft=k).max_lengths[0])  # within the sequence's cap
            return (self.draft(seq, k) if k else []), "draft"
        batch = self.session.step(neural_k=k, neural_behind=self.behind(seq), remaining=limit)
        if batch.sources[0] != NEURAL:
            return [], "none"
        return _neural(self, self.session.drafter, seq, int(batch.lengths[0]))

    def draft(self, seq: list[int], k: int, timer: Drafter | None = None) -> list[int]:
        """Up to ``k`` greedy draft tokens after ``seq``; ``timer`` (the Drafter whose policy chose
        them) gets the time of each forward and how many tokens it read (a catch-up over a long
        stretch, like the first one after the prompt, reads many)."""
        feed = seq[len(self._fed):]
        if not feed:
            raise RuntimeError("draft model cache holds the whole sequence; expected at least the newest token to be new")
        out: list[int] = []
        clock = timer.clock if timer is not None else time.perf_counter
        for _ in range(k):
            t0 = clock()
            logits = self.lm.forward(feed, keep=1)[0].float()  # [V]
            if timer is not None and clock() > t0:  # a draft token, or a catch-up over len(feed) tokens
                timer.time_neural(clock() - t0, read=len(feed), drafted=1)
            self._fed.extend(feed)
            tok = int(torch.argmax(logits))
            out.append(tok)
            if self.stop_below > 0 and float(torch.softmax(logits, -1)[tok]) < self.stop_below:
                break
            feed = [tok]
        return out

    def update(self, seq: list[int], n_new: int, *, seconds: float | None = None, tokens: int = 0) -> None:
        self.session.update(seq[len(seq) - n_new:], seconds, tokens)
        self.keep(seq, n_new)

    def keep(self, seq: list[int], n_new: int) -> None:
        """Crop the cache to the longest prefix of what it holds that is still in ``seq`` (whose last
        ``n_new`` tokens are new)."""
        start = len(seq) - n_new
        keep = min(len(self._fed), start)
        while keep < min(len(self._fed), len(seq)) and self._fed[keep] == seq[keep]:
            keep += 1
        if keep < len(self._fed):
            self.lm.crop(keep)
            del self._fed[keep:]

    def end(self) -> None:
        self.session.end()
        self.release()

    def release(self) -> None:
        """Free the draft model's cache."""
        self.lm.cache = None
        self._fed = []

    def close(self) -> None:
        """End the sequence and close the Drafter."""
        self.release()
        self.session.close()


def _neural(model: ModelDrafter, drafter: Drafter, seq: list[int], n: int) -> tuple[list[int], str]:
    """The draft model's ``n`` tokens where the policy chose it, timed by ``drafter``, which learns
    how many it really made (a confidence stop makes fewer)."""
    out = model.draft(seq, n, drafter)
    if len(out) != n:
        drafter.neural_drafted([len(out)])
    return (out, "draft") if out else ([], "none")


def _limited(k: int, limit: int | None) -> int:
    """``k`` capped by a draft-token ``limit`` (None: no limit)."""
    return k if limit is None else max(0, min(k, limit))


class SADrafter:
    """Drafts from a suffix automaton over the sequence's own tokens (prompt included),
    held by a library :class:`~saspec.drafter.Drafter`. Each ``propose`` reports the
    match length (``self.match``, in tokens: the longest suffix of seq seen
    earlier) and up to ``k`` draft tokens. No draft when the match is empty.

    ``per_match`` > 0 drafts at most ``ceil(per_match * match)`` tokens: a
    short match rarely continues far, and every drafted token is verified by
    the target. 0 always drafts ``k`` (what ``saspec_bench.commands.simulate`` models).

    With ``policy`` the Drafter's drafting policy chooses the draft length from
    the match length instead (``per_match`` is unused), and nothing where no
    draft pays. ``pool``: a ``RequestPool`` the automaton drafts from too, and
    each finished sequence joins. ``clock``: the time source (seconds).
    """

    name = "sa"

    def __init__(self, k: int = 8, per_match: float = 0.0, *, policy: bool = False, pool: RequestPool | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if per_match < 0:
            raise ValueError(f"per_match must be >= 0, got {per_match}")
        self.k = k
        self.per_match = per_match
        self.policy = bool(policy)
        self.pool = pool
        self.clock = clock
        self.session = _Session(k, length_rule=self.length_rule, length_scale=self.length_scale, pool=pool, clock=clock)
        self.match = 0

    @property
    def length_rule(self) -> str:
        """The Drafter's ``length_rule``: the policy, or the fixed rule ``per_match`` names."""
        return POLICY if self.policy else "per-match" if self.per_match > 0 else "fixed"

    @property
    def length_scale(self) -> float:
        """The Drafter's ``length_scale``: ``per_match`` where it is set."""
        return self.per_match if self.per_match > 0 else 2.0

    def begin(self, prompt: Sequence[int], options: Any = None) -> None:
        self.session.begin(prompt, options)

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]:
        batch = self.session.step(max_draft=_limited(self.k, limit))
        self.match = int(batch.match[0])
        draft = batch.row(0)
        return (draft, "sa") if draft else ([], "none")

    def update(self, seq: list[int], n_new: int, *, seconds: float | None = None, tokens: int = 0) -> None:
        self.session.update(seq[len(seq) - n_new:], seconds, tokens)

    def end(self) -> None:
        self.session.end()

    def close(self) -> None:
        """End the sequence and close the Drafter."""
        self.session.close()


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

    With ``policy`` the drafting policy chooses instead (``threshold`` and
    ``patience`` are unused): each step, the SA's draft, the small LM's or
    none, at the length that is expected to make the most tokens per second;
    both sources then draft up to ``max(sa.k, model.k)`` tokens.

    The hybrid holds one :class:`~saspec.drafter.Drafter` of ``sa``'s settings
    (its ``per_match``, ``pool``), of K ``max(sa.k, model.k)`` (a step may
    accept that many draft-model tokens; with the fixed rules its automaton K is
    ``sa.k``), and drives ``model``'s LM itself; its parts take no ``policy`` of
    their own.
    """

    name = "hybrid"

    def __init__(self, sa: SADrafter, model: ModelDrafter, threshold: int = HYBRID_THRESHOLD,
                 patience: int = 0, *, policy: bool = False, clock: Callable[[], float] = time.perf_counter) -> None:
        if sa.policy or model.policy:
            raise ValueError("the hybrid's Drafter chooses between its SA and draft model: give them no policy")
        if threshold < 1 or patience < 0:
            raise ValueError(f"need threshold >= 1 and patience >= 0, got threshold={threshold}, patience={patience}")
        self.sa = sa
        self.model = model
        self.threshold = threshold
        self.patience = patience
        self.policy = bool(policy)
        self.clock = clock
        self.session = _Session(max(sa.k, model.k), length_rule=POLICY if policy else sa.length_rule,
                                length_scale=sa.length_scale, pool=sa.pool,
                                automaton_k=None if policy else sa.k, clock=clock)
        self._sa_draft: list[int] = []
        self._sa_failures = 0

    def begin(self, prompt: Sequence[int], options: Any = None) -> None:
        self.session.begin(prompt, options)
        self.model.reset()
        self._sa_draft, self._sa_failures = [], 0

    def propose(self, seq: list[int], limit: int | None = None) -> tuple[list[int], str]:
        model_k = _limited(self.model.k, limit)
        if self.policy:
            batch = self.session.step(neural_k=model_k, neural_behind=self.model.behind(seq), remaining=limit,
                                      max_draft=_limited(self.session.k, limit))
            source = int(batch.sources[0])
            if source == NEURAL:
                return _neural(self.model, self.session.drafter, seq, int(batch.lengths[0]))
            draft = batch.row(0)
            return (draft, "sa") if draft else ([], "none")
        batch = self.session.step()
        match, draft = int(batch.match[0]), batch.row(0)  # the fixed rule's draft, at most the SA's own K
        self._sa_draft = draft
        if draft and (match >= self.threshold or self._sa_failures < self.patience):
            return draft[: _limited(len(draft), limit)], "sa"
        model_k = min(model_k, int(batch.max_lengths[0]))  # the sequence's cap
        return (self.model.draft(seq, model_k) if model_k else []), "draft"

    def update(self, seq: list[int], n_new: int, *, seconds: float | None = None, tokens: int = 0) -> None:
        new = seq[len(seq) - n_new:]
        hit = bool(self._sa_draft) and self._sa_draft[0] == new[0]
        self._sa_failures = 0 if hit else self._sa_failures + 1
        self.session.update(new, seconds, tokens)
        self.model.keep(seq, n_new)

    def end(self) -> None:
        self.session.end()
        self.model.release()

    def close(self) -> None:
        """End the sequence and close the Drafter."""
        self.model.release()
        self.session.close()


def make_drafter(kind: str, *, draft_model: torch.nn.Module | None = None, k: int = 8,
                 draft_k: int | None = None, threshold: int = HYBRID_THRESHOLD,
                 stop_below: float = 0.0, per_match: float = 0.0, patience: int = 0,
                 policy: bool = False, pool: RequestPool | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> LoopDrafter:
    """A drafter by name (one of :data:`DRAFTERS`). ``k``: SA draft tokens
    (at most ``per_match`` per matched token when > 0); ``draft_k``: small-LM
    draft tokens (default ``k``), ``stop_below``: its confidence stop;
    ``threshold``, ``patience``: the hybrid's rule (see :class:`SAModelDrafter`).
    ``policy``: draft only where it pays, at the length that pays most, under
    costs timed while it runs (the drafting policy of the drafter's
    :class:`~saspec.drafter.Drafter`; ``per_match``, ``threshold`` and
    ``patience`` are then unused). ``pool``: the SA drafts from this
    cross-request pool too, and each finished sequence joins it. ``clock``:
    the time source of the policy's timings and the loop's (seconds)."""
    if kind not in DRAFTERS:
        raise ValueError(f"unknown drafter {kind!r}; choose from {', '.join(DRAFTERS)}")
    if kind in ("draft", "hybrid") and draft_model is None:
        raise ValueError(f"drafter {kind!r} needs a draft model")
    if draft_k is not None and draft_k < 1:
        raise ValueError(f"draft_k must be None or >= 1, got {draft_k}")
    if kind == "none":
        return NoDrafter()
    if kind == "sa":
        return SADrafter(k, per_match, policy=policy, pool=pool, clock=clock)
    if kind == "draft":
        return ModelDrafter(draft_model, draft_k or k, stop_below, policy=policy, clock=clock)
    return SAModelDrafter(SADrafter(k, per_match, pool=pool), ModelDrafter(draft_model, draft_k or k, stop_below),
                          threshold, patience, policy=policy, clock=clock)


# -- the loop --------------------------------------------------------------------


@torch.inference_mode()
def speculative_generate(
    target: torch.nn.Module,
    prompt: Sequence[int],
    drafter: LoopDrafter,
    max_new_tokens: int,
    eos_ids: Sequence[int] = EOS_IDS,
    options: Any = None,
) -> GenResult:
    """Greedy decoding of ``target`` after ``prompt`` (token ids), with drafts
    from ``drafter`` verified one target forward per step.

    Stops after ``max_new_tokens`` tokens or at the first token in ``eos_ids``
    (included in the output), exactly like ``generate(do_sample=False)``.
    ``options``: this generation's drafting options (``saspec.options``:
    ``enabled``, ``max_draft_tokens``, ``hints``; None: the defaults).
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
    clock = getattr(drafter, "clock", time.perf_counter)
    draft_forwards0 = draft_lm.forwards if draft_lm else 0
    seq = list(prompt)
    t0 = time.perf_counter()
    drafter.begin(prompt, options)
    try:
        while True:
            limit = max_new_tokens - (len(seq) - len(prompt)) - 1  # never verify past max_new_tokens
            drafts, source = drafter.propose(seq, limit)
            drafts = drafts[:limit]
            feed = seq[lm.cached:] + drafts
            t_forward = clock()
            picks = torch.argmax(lm.forward(feed, keep=len(drafts) + 1), dim=-1).tolist()  # [len(drafts)+1]
            forward_s = clock() - t_forward
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
            prefill = stats.target_forwards == 0
            if prefill:
                stats.prefill_s = time.perf_counter() - t0
                stats.prefill_tokens = len(new)
            stats.target_forwards += 1
            # the last step's tokens too (a pooled drafter keeps the whole text); the prefill is not a step's cost
            drafter.update(seq, len(new), seconds=None if prefill else forward_s, tokens=len(feed))
            if len(seq) - len(prompt) >= max_new_tokens or new[-1] in stop:
                break
    finally:
        drafter.end()
    stats.wall_s = time.perf_counter() - t0
    stats.new_tokens = len(seq) - len(prompt)
    stats.draft_forwards = (draft_lm.forwards - draft_forwards0) if draft_lm else 0
    return GenResult(seq[len(prompt):], stats)


def _draft_lm(drafter: LoopDrafter) -> CausalLM | None:
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
