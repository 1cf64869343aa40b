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

**The drafting choice.** By default (``policy=True``) a
:class:`saspec.policy.SequencePolicy` chooses each step's source (the automaton,
the draft model, or none) and draft length, for the most tokens per second: it
is offered the automaton's draft at its match every step (and scores it against
the tokens the step emitted, drafted or not), and it times every target decode
and every draft-model call (``clock``, injectable). So the draft model drafts
only where it pays, its lazy catch-up (the tokens it skipped) counted in its
cost, and text where drafts are rarely kept gets plain steps. ``policy=False``
keeps the fixed rules: the drafter's own ``propose`` (the automaton's
match-length rule, the hybrid's threshold).

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

import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ...policy import PolicySettings, SequencePolicy, StepCost
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
    """``(automaton, draft model)`` of a drafter the policy can drive (either may be None), or None
    for another drafter (its own ``propose`` decides)."""
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


def make_policy(setting: Any, k_max: int, clock: Callable[[], float] | None = None) -> SequencePolicy | None:
    """The policy for ``policy=setting``: None (off), the given ``SequencePolicy`` (``k_max`` at
    least ``k_max``), or a fresh one with the compute-bound prior cost shape (llama.cpp on a CPU:
    a step costs about a fixed part plus its token count) unless ``PolicySettings.cost_shape`` says
    otherwise, timed by ``clock`` (default ``time.perf_counter``). ``TypeError``/``ValueError`` for
    anything else."""
    if setting is False or setting is None:
        return None
    if isinstance(setting, SequencePolicy):
        if setting.k_max < k_max:
            raise ValueError(f"the policy's k_max ({setting.k_max}) must be >= the drafters' k ({k_max})")
        return setting
    if setting is True or isinstance(setting, PolicySettings):
        return SequencePolicy.for_engine(max(int(k_max), 1), device="cpu",
                                         settings=setting if isinstance(setting, PolicySettings) else None,
                                         clock=clock or time.perf_counter)
    raise TypeError("policy must be a bool, a saspec.policy.PolicySettings or a saspec.policy.SequencePolicy, "
                    f"got {type(setting).__name__}")


class Speculator:
    """saspec's speculative loop on one ``llama_cpp.Llama``, step by step.

    Args:
        llama: the target ``llama_cpp.Llama``.
        drafter: ``None`` (plain decoding), or an object with ``begin(prompt)``
            and ``propose(new_tokens) -> list[int]`` (``SADraftModel``,
            ``ModelDrafter``, ``LlamaCppHybridDrafter``).
        max_draft: cut every draft to this many tokens (default ``n_batch - 1``).
        policy: ``True`` (default): a :class:`saspec.policy.SequencePolicy`
            chooses each step's source and draft length (for the drafters
            above; another drafter's ``propose`` decides itself); a
            ``PolicySettings`` for its settings; a ``SequencePolicy`` to share
            or inspect one (it keeps learning across :meth:`generate` calls);
            ``False``: the drafter's fixed rules.
        clock: seconds, for the policy's timings (default ``time.perf_counter``;
            a given ``SequencePolicy`` keeps its own).
        profile: give a policy made here the step-cost curve of ``llama``,
            profiled once per ``Llama`` (see the module doc; not where
            ``PolicySettings.cost_shape`` is set or a ``SequencePolicy`` is given).

    Attributes:
        policy: the ``SequencePolicy`` in use, or None.

    Raises:
        TypeError, ValueError: a bad argument.
    """

    def __init__(self, llama: Any, drafter: Any = None, max_draft: int | None = None, *,
                 policy: bool | PolicySettings | SequencePolicy = True,
                 clock: Callable[[], float] | None = None, profile: bool = True) -> None:
        if drafter is not None and not (callable(getattr(drafter, "begin", None)) and callable(getattr(drafter, "propose", None))):
            raise TypeError(f"drafter must have begin(prompt) and propose(new_tokens), got {type(drafter).__name__}")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be callable, got {type(clock).__name__}")
        if not isinstance(policy, (bool, PolicySettings, SequencePolicy)):
            raise TypeError("policy must be a bool, a saspec.policy.PolicySettings or a saspec.policy.SequencePolicy, "
                            f"got {type(policy).__name__}")
        parts = drafter_parts(drafter)
        k_max = max((p.k for p in parts or () if p is not None), default=1)
        pol = make_policy(policy, k_max, clock) if parts is not None else None
        self.ctx = Context(llama)
        self.llama, self.drafter = llama, drafter
        self.max_draft = self.ctx.n_batch - 1 if max_draft is None else check_int(max_draft, "max_draft", 0, self.ctx.n_batch - 1)
        self.policy = pol
        self._parts = parts if pol is not None else None
        self.clock = pol.clock if pol is not None else (clock or time.perf_counter)
        own_shape = isinstance(policy, PolicySettings) and policy.cost_shape is not None
        if profile and pol is not None and not isinstance(policy, SequencePolicy) and not own_shape:
            self._use_profile(pol, parts[1])

    def _use_profile(self, pol: SequencePolicy, model: ModelDrafter | None) -> None:
        """Give ``pol`` the target's profiled step cost and, with a draft model, its cost as a share of the
        target's one-token decode (see the module doc); the prior where a clock did not move."""
        curve = _cached_profile(self.ctx, pol.k_max + 1, self.clock)
        if curve is None:
            return
        ps = pol.policy.settings
        pol.policy.cost = StepCost.from_points(*curve, window=ps.window, max_age=ps.max_age, quantile=ps.quantile)
        if model is not None:
            small = _cached_profile(model.ctx, 1, self.clock)
            if small is not None:  # before the draft model is timed in step: its one-token decode over the target's
                pol.policy.neural_cost = float(small[1][0] / curve[1][0])

    def _policy_draft(self, new: list[int], cap: int, remaining: int | None, res: GenerateResult) -> tuple[str, list[int]]:
        """This step's ``(source, draft)`` as the policy chooses, at most ``cap`` tokens; times the
        draft model's call for the policy."""
        sa, model = self._parts
        pol, clock = self.policy, self.clock
        match, offer = 0, []
        t = time.perf_counter()
        if sa is not None:
            match, offer = sa.lookup(new)
        pol.offer(match, offer, sa is not None and sa.branched)  # scored against what this step emits, drafted or not
        offer = offer[:cap]
        model_k = min(model.k, cap) if model is not None else 0
        behind = model.behind(new) if model_k else 1
        res.draft_s += time.perf_counter() - t
        source, n = pol.choose(match, len(offer), model_k, behind, remaining=remaining)
        if source == "draft" and n > 0:
            t, c0, f0 = time.perf_counter(), clock(), model.forwards
            draft = model.propose(new, k=min(n, cap))[:cap]
            spent = clock() - c0
            res.draft_s += time.perf_counter() - t
            if spent > 0:
                pol.observe_draft_call(spent, read=behind, drafted=max(model.forwards - f0, 1))
            return ("draft" if draft else "none"), draft
        if model is not None:
            model.note(new)  # read when it next drafts
        if source == "sa" and n > 0:
            return sa.source, offer[:n]
        return "none", []

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

    def steps(self, prompt_ids: Any, sampler: Sampler, stats: GenerateResult | None = None,
              max_tokens: int | None = None) -> Iterator[list[int]]:
        """Yield the tokens each step emits (the first: the prefill's one token) until the context is full.

        The consumer stops when it has enough; the KV cache then holds the
        prompt and the emitted tokens but the last one (positions of
        ``llama.input_ids``, ``llama.n_tokens``), plus any later tokens of the
        step it stopped in. ``max_tokens`` (optional): drafts are cut so that
        no step emits past this many tokens in all. ``stats`` (optional) is
        updated in place.
        """
        prompt = self.check_prompt(prompt_ids)
        res = stats if stats is not None else GenerateResult(tokens=[])
        ctx, drafter = self.ctx, self.drafter
        t0 = time.perf_counter()
        keep = min(ctx.common_prefix(prompt), prompt.size - 1)  # the last prompt token is decoded again for its logits
        ctx.truncate(keep)
        logits = ctx.decode(prompt[keep:].tolist(), want_last=True)
        new = [sampler.first(logits, ())]
        res.prefill_s += time.perf_counter() - t0
        if drafter is not None:
            t = time.perf_counter()
            drafter.begin(prompt)
            res.draft_s += time.perf_counter() - t
        pol, clock = self.policy, self.clock
        if pol is not None:
            pol.begin()  # a new sequence: its prompt is a first read; an offer left by an early stop is dropped
        recent: list[int] = []
        emitted = 0
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
            if pol is not None and room > 0:
                source, draft = self._policy_draft(new, cap, None if max_tokens is None else max_tokens - emitted, res)
            elif drafter is not None and room > 0:
                t = time.perf_counter()
                draft = drafter.propose(new)
                res.draft_s += time.perf_counter() - t
                source = getattr(drafter, "source", "sa") if len(draft) else "none"
                draft = [int(d) for d in draft[:cap]]
            t, c0 = time.perf_counter(), clock()
            base = ctx.n_past
            rows = ctx.decode([new[-1]] + draft, want_from=0)
            new = sampler.verify(rows, draft, recent)
            ctx.truncate(base + len(new))  # the last emitted token and the kept drafts stay
            res.decode_s += time.perf_counter() - t
            if pol is not None:
                pol.observe_forward(1 + len(draft), clock() - c0)  # the whole step: decode and verify
                if source == "draft":
                    pol.observe("draft", 0, len(draft), len(new) - 1)
                pol.observe_tokens(new)
            res.steps += 1
            res.steps_by_source[source] = res.steps_by_source.get(source, 0) + 1
            if draft:
                res.drafted[source] = res.drafted.get(source, 0) + len(draft)
                res.accepted[source] = res.accepted.get(source, 0) + len(new) - 1

    def generate(self, prompt_ids: Any, max_tokens: int, sampler: Sampler | None = None,
                 stop_at_eog: bool = True) -> GenerateResult:
        """Up to ``max_tokens`` tokens after ``prompt_ids`` (see :func:`generate`)."""
        max_tokens = check_int(max_tokens, "max_tokens", 1)
        sampler = sampler if sampler is not None else Sampler()
        res = GenerateResult(tokens=[])
        out = res.tokens
        for new in self.steps(prompt_ids, sampler, res, max_tokens):
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
             stop_at_eog: bool = True, max_draft: int | None = None,
             policy: bool | PolicySettings | SequencePolicy = True,
             clock: Callable[[], float] | None = None, profile: bool = True) -> GenerateResult:
    """Generate up to ``max_tokens`` tokens after ``prompt_ids`` with speculative decoding.

    Args:
        llama: a ``llama_cpp.Llama`` (the target). Its KV cache is reused for
            the longest prefix it shares with ``prompt_ids`` and left holding
            the prompt and the output (its ``n_tokens``/``input_ids`` say so).
        prompt_ids: 1-D token ids, at least one, below the vocabulary size.
        max_tokens: the most tokens to generate (>= 1).
        drafter: ``None`` (plain decoding, one token per step), or an object
            with ``begin(prompt)`` and ``propose(new_tokens) -> list[int]`` (an
            ``SADraftModel``, ``ModelDrafter`` or ``LlamaCppHybridDrafter``).
        temperature, top_k, top_p, min_p, seed: the sampling (:class:`Sampler`;
            temperature 0 is greedy).
        stop_at_eog: stop after an end-of-generation token (kept in the output).
        max_draft: cut every draft to this many tokens (default ``n_batch - 1``).
        policy, clock, profile: the drafting choice (:class:`Speculator`; default:
            the policy, on this ``Llama``'s profiled step cost; ``False``: the
            drafter's fixed rules).

    Returns:
        a :class:`GenerateResult` (``tokens``: the generated ids, prompt excluded).

    Raises:
        ValueError, TypeError: a bad argument (raised before the model runs).
    """
    sampler = Sampler(temperature, top_k, top_p, min_p, seed=seed)
    spec = Speculator(llama, drafter, max_draft, policy=policy, clock=clock, profile=profile)
    spec.check_prompt(prompt_ids)
    return spec.generate(prompt_ids, max_tokens, sampler, stop_at_eog)
