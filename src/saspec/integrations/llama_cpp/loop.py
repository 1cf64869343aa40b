"""saspec's speculative loop over a ``llama_cpp.Llama`` (llama.cpp's C API, one sequence).

Each step decodes the last emitted token and the draft in one ``llama_decode``
with logits only at those positions (the verified ones), keeps the longest prefix
of the draft the target agrees with plus the target's own next token, and removes
the rejected positions from the KV cache. llama-cpp-python's own loop
(``Llama(draft_model=...)``) instead computes logits for every prompt and draft
token, and its scores buffer overflows on prompts longer than ``n_batch`` unless
``logits_all=True``.

Greedy (``temperature=0``): every emitted token is the target's argmax at its
position given the tokens before it, as in plain decoding. The text can still
differ from one-token-at-a-time decoding where llama.cpp's batched kernels round
differently from its single-token ones and two logits are nearly tied.
Sampled (``temperature > 0``): exact speculative sampling for a deterministic
draft (every drafter here proposes point masses): draft token ``d`` is kept with
the target's probability ``p(d)``; at the first rejection the token is drawn from
``p`` with ``d`` removed, renormalised; so each emitted token has the target's
distribution (temperature, then top-k and top-p), as plain sampling does.

**The drafting step** is a :class:`saspec.drafter.Drafter` (batch 1), one per
:class:`Speculator`, built from the settings of the drafter given (an
``SADraftModel``, a ``ModelDrafter`` or a ``LlamaCppHybridDrafter``; an
``SADraftModel``'s pool becomes its pool, so memory across calls works). Each
sequence is one of its requests: started with the prompt (the automaton is built
while the target prefills), finished at the end (its text joins the pool). Each
step hands it the tokens the last step emitted and the seconds and tokens of the
target decode that verified them, and gets this step's source (the automaton, the
draft model, or none) and draft length; the loop runs the draft model where it is
chosen and hands over its seconds. By default (``policy=True``) the drafter's
policy chooses them for the most tokens per second: it scores every offer of the
automaton against the tokens that followed (drafted or not) and times every
target decode and draft-model call (``clock``, injectable), so the draft model
drafts only where it pays, its lazy catch-up (the tokens it skipped) counted in
its cost, and text where drafts are rarely kept gets plain steps.
``policy=False`` keeps the fixed rules: the automaton's match-length rule
(``SADraftModel``'s ``length_rule`` from ``min_match``) and, with the hybrid, the
automaton where its match is at least ``threshold`` tokens, the draft model
otherwise. Another drafter (any object with ``begin`` and ``propose``) decides
itself.

**Per-request options** (``saspec.options``): ``options={"enabled": False}``
drafts nothing for the call (one target forward per token),
``{"max_draft_tokens": n}`` never verifies more than ``n`` draft tokens in a step
(from either source), ``{"hints": ids}`` lets the automaton's drafts copy from
``ids`` beside the sequence's own text.

**The step-cost profile.** A llama.cpp decode on a CPU costs nearly a forward
per token at small sizes and flattens later, which no prior shape knows; so
before a fresh policy's first step the loop times decodes of ``PROFILE_SIZES``
tokens (each ``PROFILE_REPEATS`` times, the minimum kept; positions after the
cached ones, removed again) and the policy starts from that curve; a draft
model's one-token decode is timed too, and until its calls are timed in step
its cost is taken as that share of the target's. The profile is taken once per
``Llama`` (about 2 s for a 1.5B model on 2 threads) and reused by every later
``Speculator`` on it; ``profile=False`` keeps the prior shape.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ...drafter import POLICY, Drafter
from ...options import DraftOptions, parse_options
from ...policy import AUTOMATON, NEURAL, NONE, DraftPolicy, PolicySettings, StepCost, engine_cost
from ...rules import DEFAULT_LENGTH_RULE
from ...validate import check_int
from .drafter import LlamaCppHybridDrafter, ModelDrafter, SADraftModel, as_history
from .lowlevel import Context


@dataclass
class GenerateResult:
    """What :func:`generate` returns.

    Attributes:
        tokens: the generated token ids (the prompt not included).
        steps: target decode calls after the prefill.
        drafted, accepted: draft tokens verified, and kept, per source
            (``"sa"``, ``"pool"``, ``"draft"``).
        steps_by_source: steps per source (``"none"``: no draft).
        prefill_s, decode_s, draft_s: seconds in the prefill, in target
            decodes after it, and in the drafter (``time.perf_counter``).
        stop: ``"eog"`` (an end-of-generation token, kept in ``tokens``),
            ``"length"`` (``max_tokens``) or ``"context"`` (the context is full).
    """

    tokens: list[int]
    steps: int = 0
    drafted: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    steps_by_source: dict[str, int] = field(default_factory=dict)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    stop: str = "length"


#: llama.cpp's seed meaning "a random seed" (a ``uint32``: -1 as llama-cpp-python passes it).
LLAMA_DEFAULT_SEED = 0xFFFFFFFF


class Sampler:
    """The target's token distribution from logits, as llama-cpp-python's sampler chain builds it.

    The chain is llama.cpp's (``Llama._init_sampler``): penalties over the last
    ``penalty_last_n`` tokens generated in this call, top-k, top-p, min-p (on the
    temperature-1 distribution), then temperature. ``temperature == 0`` is greedy:
    the argmax after the penalties.

    Args:
        temperature: 0 for greedy, else > 0.
        top_k: keep the ``top_k`` highest logits (0: all).
        top_p: keep the most likely tokens up to probability ``top_p``, in (0, 1].
        min_p: keep tokens at least ``min_p`` times as likely as the best, in [0, 1).
        repeat_penalty: divide positive (multiply negative) logits of recent
            tokens by this (>= 0; 1: off). 0 is taken as llama.cpp takes it:
            recent tokens with a positive logit get +inf (the others 0), so
            greedy decoding takes the first of them and sampling draws among
            them alike.
        frequency_penalty, presence_penalty: subtract ``count * frequency +
            presence`` from the logits of recent tokens.
        penalty_last_n: how many recent generated tokens the penalties see (>= 0).
        seed: the random generator's seed: None, or an int read as llama.cpp's
            ``uint32`` seed (modulo 2**32), where -1 (``0xFFFFFFFF``,
            ``LLAMA_DEFAULT_SEED``) means fresh entropy, as it does there.

    Raises:
        ValueError, TypeError: a bad argument.
    """

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 repeat_penalty: float = 1.0, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 penalty_last_n: int = 64, seed: int | None = None) -> None:
        temperature, top_p, min_p = float(temperature), float(top_p), float(min_p)
        if not (np.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if not 0.0 <= min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {min_p}")
        self.repeat_penalty = float(repeat_penalty)
        if not (np.isfinite(self.repeat_penalty) and self.repeat_penalty >= 0):
            raise ValueError(f"repeat_penalty must be a finite number >= 0, got {repeat_penalty}")
        self.frequency_penalty, self.presence_penalty = float(frequency_penalty), float(presence_penalty)
        if not (np.isfinite(self.frequency_penalty) and np.isfinite(self.presence_penalty)):
            raise ValueError("frequency_penalty and presence_penalty must be finite numbers")
        self.temperature, self.top_p, self.min_p = temperature, top_p, min_p
        self.top_k = check_int(top_k, "top_k", 0)
        self.penalty_last_n = check_int(penalty_last_n, "penalty_last_n", 0)
        self.penalized = self.penalty_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0)
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise TypeError(f"seed must be None or an int, got {seed!r}")
            seed = int(seed) % 2**32  # llama.cpp's uint32, as ctypes passes it
        self.rng = np.random.default_rng(None if seed == LLAMA_DEFAULT_SEED else seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def penalize(self, logits: np.ndarray, recent: Sequence[int]) -> np.ndarray:
        """``logits`` after the penalties for the tokens ``recent`` (a copy where changed)."""
        if not self.penalized or not len(recent):
            return logits
        ids, counts = np.unique(np.asarray(recent[-self.penalty_last_n:], dtype=np.int64), return_counts=True)
        z = logits.copy()
        v = z[ids]
        with np.errstate(divide="ignore"):  # repeat_penalty 0: +inf, as llama.cpp's division gives
            v = np.where(v <= 0, v * np.float32(self.repeat_penalty), v / np.float32(self.repeat_penalty))
        z[ids] = v - (counts * np.float32(self.frequency_penalty) + np.float32(self.presence_penalty))
        return z

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """The distribution (float64 [n_vocab]) of one row of (penalised) logits."""
        z = logits.astype(np.float64)
        if self.repeat_penalty == 0.0:  # recent tokens may be +inf, infinitely likely: drawn alike
            top = np.isposinf(z)  # (llama.cpp's softmax makes their probabilities NaN)
            if top.any():
                return top / top.sum()
        if self.top_k and self.top_k < z.size:
            cut = np.partition(z, -self.top_k)[-self.top_k]
            z = np.where(z >= cut, z, -np.inf)
        if self.top_p < 1.0:
            p = np.exp(z - z.max())
            p /= p.sum()
            order = np.argsort(-p, kind="stable")
            keep = order[: int(np.searchsorted(np.cumsum(p[order]), self.top_p)) + 1]
            masked = np.full_like(z, -np.inf)
            masked[keep] = z[keep]
            z = masked
        if self.min_p > 0.0:
            z = np.where(z >= z.max() + np.log(self.min_p), z, -np.inf)
        p = np.exp((z - z.max()) / self.temperature)
        return p / p.sum()

    def first(self, logits: np.ndarray, recent: Sequence[int]) -> int:
        """One token from one row of logits."""
        z = self.penalize(logits, recent)
        return int(np.argmax(z)) if self.greedy else self.draw(self.probs(z))

    def draw(self, p: np.ndarray) -> int:
        return int(self.rng.choice(p.size, p=p))

    def verify(self, logits: np.ndarray, draft: Sequence[int], recent: Sequence[int] = ()) -> list[int]:
        """Tokens to emit after a step: the kept draft prefix and one token of the target.

        Args:
            logits: float32 [len(draft) + 1, n_vocab]; row ``i`` the target's
                logits after the draft's first ``i`` tokens.
            draft: the draft tokens.
            recent: the tokens generated before this step (for the penalties).
        """
        out: list[int] = []
        hist = list(recent)
        for i, d in enumerate(draft):
            z = self.penalize(logits[i], hist)
            if self.greedy:
                t = int(np.argmax(z))
                if t != d:
                    return out + [t]
            else:
                p = self.probs(z)
                if self.rng.random() >= p[d]:
                    p[d] = 0.0  # the residual (p - q)+ of a point-mass draft, renormalised
                    return out + [self.draw(p / p.sum())]
            out.append(int(d))
            hist.append(int(d))
        return out + [self.first(logits[len(draft)], hist)]


def drafter_parts(drafter: Any) -> tuple[SADraftModel | None, ModelDrafter | None] | None:
    """``(automaton, draft model)`` of a drafter a :class:`~saspec.drafter.Drafter` can drive (either
    may be None), or None for another drafter (its own ``propose`` decides)."""
    if isinstance(drafter, SADraftModel):
        return drafter, None
    if isinstance(drafter, ModelDrafter):
        return None, drafter
    if isinstance(drafter, LlamaCppHybridDrafter):
        return drafter.sa, drafter.model
    return None


#: Tokens per decode the step-cost profile times, and how often each (the minimum counts).
PROFILE_SIZES = (1, 2, 3, 5, 9, 17, 33)
PROFILE_REPEATS = 2

#: Each profiled ``Llama``'s curve: ``(sizes, seconds)``, reused by every ``Speculator`` on it.
_profiles: weakref.WeakKeyDictionary[Any, tuple[np.ndarray, np.ndarray]] = weakref.WeakKeyDictionary()


def profile_cost(ctx: Context, max_tokens: int, clock: Callable[[], float] = time.perf_counter,
                 sizes: Sequence[int] = PROFILE_SIZES, repeats: int = PROFILE_REPEATS) -> tuple[np.ndarray, np.ndarray]:
    """Time decodes of each of ``sizes`` tokens (at most ``max_tokens`` and what the context and a batch
    hold; logits at every position, as a verifying step asks) after the cached positions, which are
    left as they were. Returns ``(sizes, seconds)``: float64 arrays, the minimum of ``repeats`` runs each.

    Raises:
        ValueError: no room in the context for even one token.
    """
    base = ctx.n_past
    top = min(int(max_tokens), ctx.n_batch, ctx.n_ctx - base - 1)
    if top < 1:
        raise ValueError(f"no room left in the context ({ctx.n_ctx}) after {base} cached tokens to profile")
    chosen = sorted({min(int(n), top) for n in sizes if int(n) >= 1})

    def run_step(n: int) -> None:
        ctx.decode([(7 * i) % ctx.n_vocab for i in range(1, n + 1)], want_from=0)
        ctx.truncate(base)

    cost = StepCost.profile(run_step, chosen, repeats=repeats, clock=clock, max_tokens=max(chosen))
    return np.asarray(chosen, dtype=np.float64), cost.shape[np.asarray(chosen)]


def _cached_profile(ctx: Context, max_tokens: int, clock: Callable[[], float]) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`profile_cost` of ``ctx``'s ``Llama``, once per ``Llama`` (a profile up to fewer tokens than asked
    is taken again); None where the clock did not move (an injected one) or the context has no room."""
    curve = _profiles.get(ctx.llama)
    if curve is None or curve[0][-1] < min(max_tokens, ctx.n_batch, ctx.n_ctx - ctx.n_past - 1):
        try:
            curve = _profiles[ctx.llama] = profile_cost(ctx, max(max_tokens, int(curve[0][-1]) if curve else 1),
                                                        clock)
        except ValueError:
            return None
    return curve


def make_drafter(parts: tuple[SADraftModel | None, ModelDrafter | None], policy: bool | PolicySettings,
                 clock: Callable[[], float]) -> Drafter:
    """The :class:`~saspec.drafter.Drafter` (batch 1) for ``parts`` (see :func:`drafter_parts`): its K the
    larger of the two drafters', the automaton's pool and occurrence rule; with ``policy`` (True or
    ``PolicySettings``) the drafting policy on the compute-bound prior cost shape (llama.cpp on a CPU:
    a step costs about a fixed part plus its token count) unless ``PolicySettings.cost_shape`` says
    otherwise, else the automaton's fixed length rule from its ``min_match``."""
    sa, model = parts
    k = max(p.k for p in parts if p is not None)
    common: dict[str, Any] = {"device": "cpu", "max_rows": 1, "clock": clock, "automaton": sa is not None,
                              "pool": None if sa is None else sa.pool,
                              "occurrence": None if sa is None else sa.occurrence}
    if policy is False:
        rule = {"length_rule": DEFAULT_LENGTH_RULE} if sa is None else \
            {"length_rule": sa.length_rule, "length_scale": sa.length_scale, "min_match": sa.min_match}
        return Drafter(k, **rule, **common)
    ps = policy if isinstance(policy, PolicySettings) else PolicySettings()
    # The policy is offered the automaton's whole draft at any match and cuts it itself. Its cost model
    # spans StepCost's default size, not K + 1: a draft model's catch-up may read a whole prompt.
    return Drafter(k, length_rule=POLICY, min_match=1, policy_settings=ps, cost=engine_cost(ps, "cpu"), **common)


class Speculator:
    """saspec's speculative loop on one ``llama_cpp.Llama``, step by step.

    Args:
        llama: the target ``llama_cpp.Llama``.
        drafter: ``None`` (plain decoding); an ``SADraftModel``, ``ModelDrafter``
            or ``LlamaCppHybridDrafter`` (a :class:`saspec.drafter.Drafter` is
            built from its settings: see the module doc); or any object with
            ``begin(prompt)`` and ``propose(new_tokens) -> list[int]`` (it
            drafts itself, every step).
        max_draft: cut every draft to this many tokens (default ``n_batch - 1``).
        policy: ``True`` (default): the drafting policy chooses each step's
            source and draft length (it keeps learning across the calls of this
            ``Speculator``); a ``saspec.policy.PolicySettings`` for its
            settings; ``False``: the fixed rules.
        clock: seconds, for the policy's timings (default ``time.perf_counter``).
        profile: start the policy from the step-cost curve of ``llama``,
            profiled once per ``Llama`` (see the module doc; not where
            ``PolicySettings.cost_shape`` is set).

    Attributes:
        drafts: the :class:`saspec.drafter.Drafter` (None for plain decoding or
            another drafter).
        policy: its :class:`saspec.policy.DraftPolicy`, or None.

    Raises:
        TypeError, ValueError: a bad argument.

    Close it (:meth:`close`, or use it as a context manager) to stop the
    drafter's background builder.
    """

    def __init__(self, llama: Any, drafter: Any = None, max_draft: int | None = None, *,
                 policy: bool | PolicySettings = True, clock: Callable[[], float] | None = None,
                 profile: bool = True) -> None:
        if drafter is not None and not (callable(getattr(drafter, "begin", None)) and callable(getattr(drafter, "propose", None))):
            raise TypeError(f"drafter must have begin(prompt) and propose(new_tokens), got {type(drafter).__name__}")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be callable, got {type(clock).__name__}")
        if not isinstance(policy, (bool, PolicySettings)):
            raise TypeError(f"policy must be a bool or a saspec.policy.PolicySettings, got {type(policy).__name__}")
        self.ctx = Context(llama)
        self.llama, self.drafter = llama, drafter
        self.max_draft = self.ctx.n_batch - 1 if max_draft is None else check_int(max_draft, "max_draft", 0, self.ctx.n_batch - 1)
        self.clock = clock or time.perf_counter
        self._parts = drafter_parts(drafter)
        self.threshold = drafter.threshold if isinstance(drafter, LlamaCppHybridDrafter) else None
        self.drafts = make_drafter(self._parts, policy, self.clock) if self._parts is not None else None
        self._ids = itertools.count()
        self._rid: int | None = None  # the sequence the drafter has started and not finished
        own_shape = isinstance(policy, PolicySettings) and policy.cost_shape is not None
        if profile and self.policy is not None and not own_shape:
            self._use_profile()

    @property
    def policy(self) -> DraftPolicy | None:
        return None if self.drafts is None else self.drafts.policy

    def close(self) -> None:
        """Stop the drafter's background builder (idempotent; an ``SADraftModel``'s pool stays open)."""
        if self.drafts is not None:
            self._finish()
            self.drafts.close()

    def __enter__(self) -> Speculator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _use_profile(self) -> None:
        """Give the policy the target's profiled step cost and, with a draft model, its cost as a share of
        the target's one-token decode (see the module doc); the prior where a clock did not move."""
        pol = self.policy
        curve = _cached_profile(self.ctx, pol.k_max + 1, self.clock)
        if curve is None:
            return
        ps = pol.settings
        pol.cost = StepCost.from_points(*curve, window=ps.window, max_age=ps.max_age, quantile=ps.quantile)
        model = self._parts[1]
        if model is not None:
            small = _cached_profile(model.ctx, 1, self.clock)
            if small is not None:  # before the draft model is timed in step: its one-token decode over the target's
                pol.neural_cost = float(small[1][0] / curve[1][0])

    def check_prompt(self, prompt_ids: Any) -> np.ndarray:
        """``prompt_ids`` as int32 [L]; ``ValueError`` where it is empty, does not fit or holds bad ids."""
        prompt = as_history(prompt_ids)
        if prompt.size == 0:
            raise ValueError("prompt_ids must hold at least one token")
        if prompt.size >= self.ctx.n_ctx:
            raise ValueError(f"the prompt ({prompt.size} tokens) does not fit the context ({self.ctx.n_ctx})")
        if int(prompt.max()) >= self.ctx.n_vocab:
            raise ValueError(f"prompt_ids must be below the vocabulary size {self.ctx.n_vocab}")
        return prompt

    def check_options(self, options: Any) -> DraftOptions:
        """``options`` (None, a ``saspec.options.DraftOptions`` or a mapping of its keys) as ``DraftOptions``;
        ``TypeError``/``ValueError`` naming a bad one, or hints where no automaton drafts or ids at or
        above the vocabulary size (a draft of them could not be decoded)."""
        opts = parse_options(options, "options")
        if opts.hints is not None:
            if self._parts is None or self._parts[0] is None:
                raise ValueError("options: hints need saspec's automaton (an SADraftModel or a LlamaCppHybridDrafter "
                                 f"as the drafter), got {type(self.drafter).__name__}")
            if int(opts.hints.max()) >= self.ctx.n_vocab:
                raise ValueError(f"options: hints must be token ids below the vocabulary size {self.ctx.n_vocab}")
        return opts

    def steps(self, prompt_ids: Any, sampler: Sampler, stats: GenerateResult | None = None,
              max_tokens: int | None = None, options: Any = None) -> Iterator[list[int]]:
        """Yield the tokens each step emits (the first: the prefill's one token) until the context is full.

        The consumer stops when it has enough (and closes the generator: the
        drafter then finishes the sequence; a later call finishes one left
        open); the KV cache then holds the prompt and the emitted tokens but
        the last one (positions of ``llama.input_ids``, ``llama.n_tokens``),
        plus any later tokens of the step it stopped in. ``max_tokens``
        (optional): drafts are cut so that no step emits past this many tokens
        in all. ``stats`` (optional) is updated in place. ``options``: the
        sequence's drafting options (:meth:`check_options`).

        Raises:
            TypeError, ValueError: a bad prompt or option, at the first ``next`` and before the model runs.
        """
        prompt = self.check_prompt(prompt_ids)
        opts = self.check_options(options)
        res = stats if stats is not None else GenerateResult(tokens=[])
        ctx, drafter, drafts, clock = self.ctx, self.drafter, self.drafts, self.clock
        model = None if self._parts is None else self._parts[1]
        self._finish()  # a sequence whose consumer stopped without closing it: its KV cache is gone anyway
        t0 = time.perf_counter()
        rid = None
        if drafts is not None:  # the automaton is built on a background thread while the target prefills
            rid = self._rid = next(self._ids)
            drafts.start(rid, prompt, self._capped(opts), max_new_tokens=max_tokens)
        t1 = time.perf_counter()
        keep = min(ctx.common_prefix(prompt), prompt.size - 1)  # the last prompt token is decoded again for its logits
        ctx.truncate(keep)
        logits = ctx.decode(prompt[keep:].tolist(), want_last=True)
        new = [sampler.first(logits, ())]
        res.prefill_s += time.perf_counter() - t1
        t = time.perf_counter()
        if model is not None:
            model.begin(prompt)
        elif drafts is None and drafter is not None:
            drafter.begin(prompt)
        res.draft_s += time.perf_counter() - t + (t1 - t0)
        limit = self.max_draft if opts.drafts else 0  # another drafter's cap
        if opts.max_draft_tokens is not None:
            limit = min(limit, opts.max_draft_tokens)
        recent: list[int] = []
        emitted = 0
        seconds, verified = math.nan, 0  # the last target decode (none yet: the prefill is not a step)
        try:
            while True:
                yield new
                emitted += len(new)
                recent.extend(new)
                if len(recent) > 2 * max(sampler.penalty_last_n, 1):
                    del recent[: len(recent) - sampler.penalty_last_n]
                room = ctx.n_ctx - ctx.n_past - 1  # positions left after the last emitted token's
                if room < 0:
                    res.stop = "context"
                    return
                draft: list[int] = []
                source = "none"
                cap = min(self.max_draft, room)
                if max_tokens is not None:
                    cap = min(cap, max(max_tokens - emitted - 1, 0))
                if drafts is not None:
                    source, draft = self._draft(rid, new, cap, None if max_tokens is None else max_tokens - emitted,
                                                seconds, verified, res)
                elif drafter is not None and room > 0:
                    t = time.perf_counter()
                    draft = drafter.propose(new)
                    res.draft_s += time.perf_counter() - t
                    draft = [int(d) for d in draft[:min(cap, limit)]]
                    source = getattr(drafter, "source", "sa") if draft else "none"
                t, c0 = time.perf_counter(), clock()
                base = ctx.n_past
                rows = ctx.decode([new[-1]] + draft, want_from=0)
                new = sampler.verify(rows, draft, recent)
                ctx.truncate(base + len(new))  # the last emitted token and the kept drafts stay
                res.decode_s += time.perf_counter() - t
                seconds, verified = clock() - c0, 1 + len(draft)  # the whole step: decode and verify
                res.steps += 1
                res.steps_by_source[source] = res.steps_by_source.get(source, 0) + 1
                if draft:
                    res.drafted[source] = res.drafted.get(source, 0) + len(draft)
                    res.accepted[source] = res.accepted.get(source, 0) + len(new) - 1
        finally:
            self._finish(rid)

    def _capped(self, opts: DraftOptions) -> DraftOptions:
        """``opts`` with ``max_draft`` as its cap where that is lower (the policy then drafts within it)."""
        cap = opts.max_draft_tokens
        if self.max_draft < self.drafts.k and (cap is None or cap > self.max_draft):
            return dataclasses.replace(opts, max_draft_tokens=self.max_draft)
        return opts

    def _finish(self, rid: int | None = None) -> None:
        """Finish the drafter's sequence (``rid``, or whichever is open): its text joins the pool."""
        if self._rid is not None and (rid is None or rid == self._rid):
            self.drafts.finish(self._rid)
            self._rid = None

    def _draft(self, rid: int, new: list[int], cap: int, remaining: int | None, seconds: float, verified: int,
               res: GenerateResult) -> tuple[str, list[int]]:
        """This step's ``(source, draft)`` from the drafter, at most ``cap`` tokens: it takes the tokens the
        last step emitted and that step's decode (``seconds`` over ``verified`` tokens); the draft model
        runs, timed, where it is chosen, and otherwise reads the new tokens when it next drafts."""
        drafts = self.drafts
        sa, model = self._parts
        t = time.perf_counter()
        model_k = min(model.k, cap) if model is not None else 0
        behind = model.behind(new) if model_k else 1
        batch = drafts.step([rid], np.asarray(new, np.int32).reshape(1, -1), np.array([len(new)], np.int32),
                            width=self.ctx.n_ctx, seconds=seconds, step_tokens=verified,
                            neural_k=model_k if drafts.policy is not None else 0, neural_behind=behind,
                            remaining=remaining)
        res.draft_s += time.perf_counter() - t
        source, n = int(batch.sources[0]), int(batch.lengths[0])
        if drafts.policy is None:  # the fixed rules: the automaton past the hybrid's threshold, else the draft model
            if source == AUTOMATON and self.threshold is not None and batch.match[0] < self.threshold:
                source = NONE
            if source != AUTOMATON and model_k and batch.max_lengths[0] > 0:
                source, n = NEURAL, min(model_k, int(batch.max_lengths[0]))
        if source == NEURAL:
            t, c0, f0 = time.perf_counter(), self.clock(), model.forwards
            draft = model.propose(new, k=min(n, cap))
            spent = self.clock() - c0
            res.draft_s += time.perf_counter() - t
            drafts.time_neural(spent, read=behind, drafted=max(model.forwards - f0, 1))
            if len(draft) != n:
                drafts.neural_drafted([len(draft)])
            return ("draft" if draft else "none"), draft
        if model is not None:
            model.note(new)  # read when it next drafts
        if source == AUTOMATON:
            draft = batch.row(0)[: min(cap, sa.k)]
            if draft:
                return ("pool" if drafts.drafts.source[0] else "sa"), draft
        return "none", []

    def generate(self, prompt_ids: Any, max_tokens: int, sampler: Sampler | None = None,
                 stop_at_eog: bool = True, options: Any = None) -> GenerateResult:
        """Up to ``max_tokens`` tokens after ``prompt_ids`` (see :func:`generate`)."""
        max_tokens = check_int(max_tokens, "max_tokens", 1)
        sampler = sampler if sampler is not None else Sampler()
        res = GenerateResult(tokens=[])
        out = res.tokens
        with contextlib.closing(self.steps(prompt_ids, sampler, res, max_tokens, options)) as steps:
            for new in steps:
                for t in new:
                    out.append(t)
                    if stop_at_eog and self.ctx.is_eog(t):
                        res.stop = "eog"
                        return res
                    if len(out) >= max_tokens:
                        res.stop = "length"
                        return res
        return res


def generate(llama: Any, prompt_ids: Any, max_tokens: int, drafter: Any = None, *, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
             stop_at_eog: bool = True, max_draft: int | None = None, policy: bool | PolicySettings = True,
             clock: Callable[[], float] | None = None, profile: bool = True, options: Any = None) -> GenerateResult:
    """Generate up to ``max_tokens`` tokens after ``prompt_ids`` with speculative decoding.

    Args:
        llama: a ``llama_cpp.Llama`` (the target). Its KV cache is reused for
            the longest prefix it shares with ``prompt_ids`` and left holding
            the prompt and the output (its ``n_tokens``/``input_ids`` say so).
        prompt_ids: 1-D token ids, at least one, below the vocabulary size.
        max_tokens: the most tokens to generate (>= 1).
        drafter: ``None`` (plain decoding, one token per step), an
            ``SADraftModel``, ``ModelDrafter`` or ``LlamaCppHybridDrafter``, or
            another object with ``begin(prompt)`` and ``propose(new_tokens) -> list[int]``.
        temperature, top_k, top_p, min_p, seed: the sampling (:class:`Sampler`;
            temperature 0 is greedy).
        stop_at_eog: stop after an end-of-generation token (kept in the output).
        max_draft: cut every draft to this many tokens (default ``n_batch - 1``).
        policy, clock, profile: the drafting choice (:class:`Speculator`; default:
            the policy, on this ``Llama``'s profiled step cost; ``False``: the
            fixed rules).
        options: this call's drafting options: None, or a mapping (or
            ``saspec.options.DraftOptions``) of ``enabled`` (False: no drafts),
            ``max_draft_tokens`` (int >= 0: no step verifies more draft tokens)
            and ``hints`` (token ids the automaton's drafts may copy from; they
            need an ``SADraftModel`` or the hybrid, and ids below the vocabulary size).

    Returns:
        a :class:`GenerateResult` (``tokens``: the generated ids, prompt excluded).

    Raises:
        ValueError, TypeError: a bad argument or option (raised before the model runs).
    """
    sampler = Sampler(temperature, top_k, top_p, min_p, seed=seed)
    with Speculator(llama, drafter, max_draft, policy=policy, clock=clock, profile=profile) as spec:
        spec.check_prompt(prompt_ids)
        spec.check_options(options)
        return spec.generate(prompt_ids, max_tokens, sampler, stop_at_eog, options)
