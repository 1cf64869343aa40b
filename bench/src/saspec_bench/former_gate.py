"""The former per-request cost gate, kept as a baseline for the replay (``gate_replay``): the library's
choice is :class:`saspec.policy.SequencePolicy`, with the same calls. Draft only where a draft pays for its
verification, learnt as a sequence runs.

A step that verifies ``d`` draft tokens costs a target forward over ``d + 1``
tokens, plus ``d`` draft-model forwards for a model's draft (the SA's costs
nothing to make). If each draft token is accepted with probability ``q``
given the ones before it, the step emits ``1 + q + ... + q**d`` tokens on
average (the target's own token always counts), while a plain step emits one.
``CostGate`` takes, each step, the source and length with the most expected
tokens per second, or no draft. On a GPU at small batch verification is
nearly free and nearly every draft pays; on a CPU without native bf16
matmuls a verified bf16 token costs a whole forward and almost none does.

It learns both sides from the running sequence:

* **costs**, in seconds: the caller times every step
  (:meth:`CostGate.observe_forward`), bucketed by the forward's size (1, 2,
  3-4, 5-8, ... tokens; a bucket costs the same over its span, as rows padded
  to a power of two make it on CPUs), and every draft-model forward
  (:meth:`CostGate.observe_draft_call`: draft tokens, or a catch-up over the
  tokens the draft model has not read, which choosing it again pays for).
  Timing noise only ever adds time, so a bucket costs the second fastest of
  its last ``window`` timings once it has four (one outlier, slow or fast,
  moves nothing), the faster of its last two before that; a plain step, timed
  at every plain step, keeps ``UNIT_WINDOWS`` windows (the verify costs timed
  at other moments are weighed against it, so a run of slow plain steps in a
  burst of load must not make them look cheap). The buckets timed
  recently set a curve, interpolated between them and extrapolated along its
  last segment, so a curve that flattens (a fixed overhead, then little per
  token) is not taken for a steep one; a bucket not timed for a while costs no
  less than that curve says, one timed once no more; where two disagree, the
  more recent timing wins.
* **acceptance**: for the SA per match-length bucket (``adaptive.match_bucket``)
  and for the draft model, counts of accepted and rejected tokens with
  ``prior_weight`` pseudo-tokens of prior: ``model_prior`` for the draft
  model; for the SA, odds of ``m`` to 1 at a match of ``m``, scaled by how the
  sequence's SA drafts fared at every match so far.

**Exploration.** Estimates fed only by what the gate chooses can lock it out:
once no draft seems worth its verification nothing is verified any more, and
nothing can show the gate it was wrong. So it keeps measuring what it does
not choose:

1. The SA's draft is free, so the caller offers it every step
   (:meth:`CostGate.offer`) and reports the tokens each step emitted
   (:meth:`CostGate.observe_tokens`): the SA's acceptance is scored against
   the text that followed, whether the draft was verified or not.
2. Warm-up: two plain steps (the unit of cost, timed twice so that a cold
   first step sets nothing), then one step verifies a one-token *probe*: the
   SA's first draft token when it has one (plain steps wait up to
   ``PROBE_WAIT`` steps for it), else a guess. Meanwhile an SA draft almost
   sure to be accepted (``WARM_COPY``: a long copy of the prompt) is verified
   in full instead, since accepted tokens pay for any verify.
3. Re-tries with backoff: every size bucket has a re-try period, 8 steps at
   first. When a bucket has not been timed for that long, and a draft of its
   size (or a plain step) would beat the current choice at what a re-try may
   find (untimed and suspiciously slow sizes at what the sizes below them
   say, at half their slope), the gate takes it once. A re-try that confirms
   the estimate (within ``CONFIRMS``) doubles the period (at most 256), a
   slower one (perhaps a burst) leaves it, a faster one resets it, and so does
   choosing the bucket on its estimate. The smallest verify, when due, is
   doubted down to a plain step's cost (at a step where a one-token SA draft
   is more likely accepted than not, so that the re-try is cheap, or at any
   step a period later), a plain step, when due, to its fastest recent
   timing, and the draft model's acceptance up to its prior: slow first
   timings, a cold process or a burst of load hold nothing off for good.

Where no draft pays but verifying one token costs less than a plain step (on
some CPUs a 2-row product is faster than a 1-row one), the gate verifies a
free guess: a plain step, done faster.

What exploration costs, in steps: the warm-up is two plain steps and one
probe. After it each re-try is one step that verifies what the gate would not
have chosen: where timings are steady, one climb through the
untimed sizes that a long match makes look worth it, and the smallest verify
about ``log2(steps / 8)`` times; under noise, each size at most about that
often between two choices of it on merit. ``stats`` counts every kind of
step; git history has its measurements (BENCHMARKS.md, "Drafting policy", compares it with the policy).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np
from saspec import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from saspec.policy import N_BUCKETS, match_bucket
from saspec.validate import check_count, check_int, check_seconds


@njit(cache=True)
def expected_tokens(q, d):
    """Mean tokens a step emits: ``1 + q + ... + q**d`` (float), for ``d``
    draft tokens each accepted with probability ``q`` given the ones before."""
    e = 1.0
    p = 1.0
    for _ in range(d):
        p *= q
        e += p
    return e


@njit(cache=True)
def best_draft_length(q, k_max, verify_cost, draft_cost):
    """``(d, gain)``: the draft length in ``0..k_max`` with the most expected
    tokens per unit of time, and that rate relative to plain decoding.

    ``q``: per-token acceptance probability (0..1); ``verify_cost``: float64
    [>= k_max + 1], ``verify_cost[d]`` the time of a target forward over
    ``d + 1`` tokens in units of a 1-token forward; ``draft_cost``: time to
    make one draft token, same units. ``gain = expected_tokens(q, d) /
    (verify_cost[d] + d * draft_cost)``, 1.0 for ``d = 0``; a longer draft
    must beat a shorter one strictly.
    """
    best_d = 0
    best = 1.0
    e = 1.0
    p = 1.0
    for d in range(1, min(k_max, verify_cost.shape[0] - 1) + 1):
        p *= q
        e += p
        g = e / (verify_cost[d] + d * draft_cost)
        if g > best:
            best = g
            best_d = d
    return best_d, best


#: Warm-up steps a probe waits for an SA draft before it verifies a guess instead.
PROBE_WAIT = 8
#: During the warm-up, an SA draft whose tokens are each at least this likely accepted is verified in full:
#: accepted, a verified token costs no more than the plain step it replaces, on any machine.
WARM_COPY = 0.9
#: A re-try confirms a size's estimate when it takes between 1/CONFIRMS and CONFIRMS times as long.
CONFIRMS = 1.5
#: How many times cheaper than making a draft token the draft model is guessed to read a token it has not seen
#: (one batched forward over many), until it is timed.
CATCHUP_PRIOR = 16
#: The steps a draft model, once started or caught up, is expected to draft in a row: its catch-up is charged
#: over them.
CATCHUP_STEPS = 32
#: A plain step's cost is taken from this many times ``window`` of its latest timings.
UNIT_WINDOWS = 3


def _cost_bucket(n: int) -> int:
    """Bucket of a forward over ``n`` tokens: 0 for 1, then 2, 3-4, 5-8, ... (powers of two)."""
    return (n - 1).bit_length()


def _rates(q: float, k: int, seconds: np.ndarray, draft_s: float, start_s: float = 0.0) -> np.ndarray:
    """Expected tokens per second of a step with ``d = 0..k`` draft tokens:
    ``seconds[d]`` is a forward over ``d + 1`` tokens, ``draft_s`` the time to
    make one draft token and ``start_s`` the time to start drafting at all
    (``d = 0``: a plain step)."""
    d = np.arange(k + 1)
    emitted = np.cumsum(q ** d)  # 1, 1 + q, 1 + q + q^2, ...
    return emitted / (seconds[: k + 1] + d * draft_s + np.where(d > 0, start_s, 0.0))


class _Timings:
    """The latest ``window`` timings of one kind of forward, each with the step it was taken at.

    ``estimate()``: ``(seconds, step)`` of what it costs now: the
    second fastest once there are four (so one outlier either way moves
    nothing, nor two slow timings of four), before that the faster of the
    last two."""

    def __init__(self, window: int) -> None:
        self.recent = np.full((window, 2), np.inf)  # (seconds, step), inf = empty
        self.seen = 0
        self.window = window

    def add(self, seconds: float, step: int) -> None:
        self.recent[self.seen % self.window] = (seconds, step)
        self.seen += 1

    def estimate(self) -> tuple[float, float]:
        if min(self.seen, self.window) >= 4:
            i = np.argsort(self.recent[:, 0], kind="stable")[1]
        else:  # the faster of the last two: one old timing must not outlive a change
            last = [(self.seen - j) % self.window for j in (1, 2) if self.seen - j >= 0]
            i = min(last, key=lambda j: self.recent[j, 0])
        s, step = self.recent[i]
        return float(s), float(step)

    def fastest(self) -> float:
        """The fastest of the latest timings: what the forward costs when nothing else runs."""
        return float(self.recent[:, 0].min())


class CostGate:
    """Chooses, for one sequence and each step, the draft source and length
    that make the most tokens per second, or no draft (see the module doc for
    the rule and its exploration).

    Each step the caller:

    1. offers the SA's draft, if any (:meth:`offer`);
    2. asks :meth:`choose` what to verify;
    3. times the step (:meth:`observe_forward`, the draft model's calls
       apart with :meth:`observe_draft_call`), reports the draft model's
       outcome (:meth:`observe`) and the tokens the step emitted
       (:meth:`observe_tokens`).

    ``clock`` is the time source the integrations read: replace it (e.g. with
    a counter a test advances) and nothing in them reads the real time.

    Args:
        k_max: the most draft tokens of any source (>= 1).
        verify_cost: a fixed cost table instead of timing forwards: float
            [>= k_max + 1], ``verify_cost[d]`` a forward over ``d + 1`` tokens
            in units of a 1-token forward (finite, > 0).
        draft_cost: fixed cost of one draft-model token (units of a 1-token
            target forward, >= 0) instead of timing it; needs ``verify_cost``.
        slope_prior: cost per extra token of a forward, in units of a 1-token
            forward: assumed before anything but 1-token forwards is timed, and
            at least that above a single timed multi-token bucket.
        model_prior: the draft model's per-token acceptance before any
            observation, in [0, 1].
        prior_weight: pseudo-tokens of prior behind each acceptance estimate (> 0).
        window: how many of a size's latest timings its cost is taken from
            (>= 1; ``UNIT_WINDOWS`` times as many for a plain step).
        retry_after, max_retry_after: the re-try period of a forward size,
            in steps, at first and at most (1 <= retry_after <= max_retry_after).
        clock: a callable returning seconds (default ``time.perf_counter``).

    Raises:
        ValueError: an argument out of range (named in the message).
    """

    SOURCES = ("sa", "draft")

    def __init__(self, k_max: int, *, verify_cost: Any = None, draft_cost: float | None = None,
                 slope_prior: float = 0.1, model_prior: float = 0.8, prior_weight: float = 8.0,
                 window: int = 5, retry_after: int = 8, max_retry_after: int = 256,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        k_max = check_count(k_max, "k_max")
        window = check_count(window, "window")
        retry_after = check_count(retry_after, "retry_after")
        max_retry_after = check_count(max_retry_after, "max_retry_after")
        if max_retry_after < retry_after:
            raise ValueError(f"max_retry_after ({max_retry_after}) must be >= retry_after ({retry_after})")
        for name, v, lo, hi in (("slope_prior", slope_prior, 0.0, math.inf), ("model_prior", model_prior, 0.0, 1.0),
                                ("prior_weight", prior_weight, 0.0, math.inf)):
            if not (lo <= float(v) <= hi) or (name == "prior_weight" and v == 0):
                low = "(0" if name == "prior_weight" else f"[{lo}"
                raise ValueError(f"{name} must be in {low}, {hi}], got {v}")
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning seconds, got {clock!r}")
        self.k_max = k_max
        self.slope_prior, self.model_prior = float(slope_prior), float(model_prior)
        self.window, self.retry_after, self.max_retry_after = window, retry_after, max_retry_after
        self.clock = clock
        self._fixed = verify_cost is not None
        if self._fixed:
            vc = np.asarray(verify_cost, dtype=np.float64)
            if vc.ndim != 1 or vc.shape[0] < self.k_max + 1 or not np.all(np.isfinite(vc)) or np.any(vc <= 0):
                raise ValueError(f"verify_cost must be 1-D, finite, > 0, with at least k_max + 1 = {self.k_max + 1} "
                                 f"entries, got shape {vc.shape}")
            self._verify = vc[: self.k_max + 1].copy()
        elif draft_cost is not None:
            raise ValueError("draft_cost is fixed only together with verify_cost")
        if draft_cost is not None and not (math.isfinite(draft_cost) and draft_cost >= 0):
            raise ValueError(f"draft_cost must be a finite number >= 0, got {draft_cost}")
        self._draft_cost = draft_cost
        n_buckets = _cost_bucket(self.k_max + 1) + 1
        # A plain step keeps UNIT_WINDOWS windows of timings: it is timed at every plain step, and verify costs
        # timed at other times are weighed against it, so a run of slow plain steps must not make them look cheap.
        self._forwards = [_Timings(UNIT_WINDOWS * window if b == 0 else window) for b in range(n_buckets)]
        self._draft = _Timings(window)
        self._catchup = _Timings(window)  # the draft model's seconds per token read in a catch-up
        self._timed_at = np.full(n_buckets, -(1 << 40))  # the step of each size's latest timing
        self._period = np.full(n_buckets, retry_after)
        self._step = 0
        self.prior_weight = float(prior_weight)
        self._match = np.arange(N_BUCKETS, dtype=np.float64)
        self._match[8:] = 2.0 ** (np.arange(8, N_BUCKETS) - 5)  # a bucket's smallest match: 8, 16, 32, ...
        self._sa_hits, self._sa_misses = np.zeros(N_BUCKETS), np.zeros(N_BUCKETS)  # observed, per match bucket
        self._nn_hits, self._nn_misses = prior_weight * model_prior, prior_weight * (1 - model_prior)
        self._offer: tuple[int, list[int], int] | None = None  # (match, draft, tokens matched so far)
        self._waited = 0  # warm-up steps spent waiting for an SA draft to probe with
        self._retrying: tuple[int, float] | None = None  # this step's re-try: (size bucket, seconds expected)
        self.stats: dict[str, int] = {"steps": 0, "warm-up": 0, "retries": 0, "sa": 0, "draft": 0, "none": 0,
                                       "guess": 0}

    # -- costs --

    def observe_forward(self, n_tokens: int, seconds: float) -> None:
        """A step that ran a target forward over ``n_tokens`` tokens (1 for a
        plain step, ``d + 1`` to verify ``d`` drafts) took ``seconds``: the
        forward and whatever else a step costs, not the draft model's
        drafting. Forwards larger than the biggest verify (``k_max + 1``
        tokens, e.g. a prefill) are ignored; with a fixed ``verify_cost`` only
        1-token steps are used (the unit ``draft_cost`` needs).

        Raises:
            ValueError: ``seconds`` is not finite and > 0, or ``n_tokens`` < 1.
        """
        seconds = check_seconds(seconds, "seconds")
        n = check_int(n_tokens, "n_tokens", 1)
        b = _cost_bucket(n)
        if n > self.k_max + 1 or (self._fixed and b != 0):
            return
        if self._retrying is not None and self._retrying[0] == b:  # a re-try: back off only if it confirmed
            ratio = seconds / self._retrying[1]
            if 1 / CONFIRMS <= ratio <= CONFIRMS:
                self._period[b] = min(2 * self._period[b], self.max_retry_after)
            elif ratio < 1:
                self._period[b] = self.retry_after
        self._retrying = None
        if b and self._stale(b):  # its old timings are from another time: start afresh
            self._forwards[b] = _Timings(self.window)
        self._forwards[b].add(seconds, self._step)
        self._timed_at[b] = self._step

    def observe_draft_forward(self, seconds: float, read: int = 1) -> None:
        """One draft-model forward, which made one draft token, took
        ``seconds``; it read ``read`` tokens it had not seen (see
        :meth:`observe_draft_call`, of which this is the one-token case).

        Raises:
            ValueError: ``seconds`` is not finite and > 0, or ``read`` < 1.
        """
        self.observe_draft_call(seconds, read, 1)

    def observe_draft_call(self, seconds: float, read: int = 1, drafted: int = 1) -> None:
        """One call of the draft model took ``seconds``: it read ``read`` tokens
        it had not seen (1, or 2, in step with the text; more for the prompt or
        a catch-up after steps it did not draft) and made ``drafted`` draft
        tokens, its first from the forward that read them. In step, each draft
        token costs ``seconds / drafted``; a catch-up costs ``seconds / read``
        per token read, its draft tokens included (they are few against the
        tokens read, so the cost errs high by their share).

        Raises:
            ValueError: ``seconds`` is not finite and > 0, or ``read`` or ``drafted`` < 1.
        """
        seconds = check_seconds(seconds, "seconds")
        read = check_int(read, "read", 1)
        drafted = check_int(drafted, "drafted", 1)
        if read <= 2:
            self._draft.add(seconds / drafted, self._step)
        else:
            self._catchup.add(seconds / read, self._step)

    @property
    def timed(self) -> bool:
        """Whether the unit of cost (a 1-token step, timed twice) is known."""
        return self._fixed or self._forwards[0].seen >= 2

    @property
    def probed(self) -> bool:
        """Whether the warm-up's probe is done: a multi-token forward timed (or the costs are fixed)."""
        return self._fixed or any(t.seen for t in self._forwards[1:])

    def _unit(self) -> float:
        """Seconds of a 1-token step (1.0 while untimed, and with fixed costs before it is timed)."""
        return self._forwards[0].estimate()[0] if self._forwards[0].seen else 1.0

    def _stale(self, b: int) -> bool:
        """Whether forward size ``b`` is due for a re-try: untimed for its period."""
        return bool(self._step - self._timed_at[b] >= self._period[b])

    def _span(self, b: int) -> tuple[int, int]:
        """The forward sizes of bucket ``b`` (tokens, both ends included, at most ``k_max + 1``)."""
        return (1, 1) if b == 0 else ((1 << (b - 1)) + 1, min(1 << b, self.k_max + 1))

    def _curve(self, optimistic: bool = False, doubt_smallest: bool = False) -> np.ndarray:
        """float64 [k_max + 1]: seconds of a forward over ``d + 1`` tokens for
        ``d = 0..k_max``.

        A timed size bucket costs its estimate over its whole span (padding
        to a power of two rows makes verify costs step-like on CPUs). The
        *fresh* buckets (the unit, and buckets timed at least twice within
        their re-try period) set the curve: interpolated between them,
        extrapolated above them along the last segment of the multi-token
        ones (a 1-token step may run other kernels). A stale bucket costs no
        less than the fresh ones say (verifying may have turned dear since it
        was timed); a bucket timed once, no more (one slow first timing is
        doubted). Where two buckets disagree about which is dearer, the one
        timed more recently wins. ``optimistic``, what a re-try may find:
        untimed sizes above the timed ones at half the last segment's slope (a
        cost curve that flattens is found by trying them), stale and
        once-timed buckets at their own timings, or at that half-slope line
        where they are slower than the fresh ones predict, and a plain step at
        its fastest recent timing (a burst of slow plain steps must not make
        a dear verify look cheaper for good).
        ``doubt_smallest``: the smallest verify, when stale, may cost no more
        than a plain step (its first timings, slow in a cold process or a
        burst of load, must not hold drafting off for good)."""
        unit = self._unit()
        if self._fixed:
            return self._verify * unit
        n = np.arange(1, self.k_max + 2, dtype=np.float64)
        fresh: dict[int, tuple[float, float]] = {}  # bucket -> (seconds, step timed)
        others: list[tuple[int, float, float, bool]] = []  # (bucket, seconds, step, timed once)
        for b, t in enumerate(self._forwards):
            if not t.seen:
                continue
            s, step = t.estimate()
            if b == 0 and optimistic:  # a plain step is re-tried too: a burst of load may have hidden its cost
                s = t.fastest()
            if b == 0 or (t.seen >= 2 and not self._stale(b)):
                fresh[b] = (s, step)
            else:
                others.append((b, s, step, t.seen < 2))
        if not fresh:
            return unit * (1.0 + self.slope_prior * (n - 1))
        points = dict(fresh)
        if len(fresh) >= 2:
            line = self._through(fresh, n, 1.0)
            hope = self._through(fresh, n, 0.5)
            for b, s, step, once in others:
                i = self._span(b)[1] - 1
                if optimistic:
                    points[b] = (s if s <= line[i] else hope[i], step)
                else:
                    points[b] = (min(s, line[i]) if once else max(s, line[i]), step)
        else:  # nothing fresh to doubt them by: take them as timed
            points.update({b: (s, step) for b, s, step, _ in others})
        if doubt_smallest and 1 in points and 0 in points and self._stale(1):
            points[1] = (min(points[1][0], points[0][0]), points[1][1])
        return self._through(points, n, 0.5 if optimistic else 1.0)

    def _through(self, points: dict[int, tuple[float, float]], n: np.ndarray, slope_factor: float) -> np.ndarray:
        """Seconds at ``n`` tokens along ``points`` (bucket -> (seconds, step
        timed)): made to rise with size above 1 token (where two buckets
        disagree, the one timed more recently stands), flat over each
        bucket's span, interpolated between buckets, and extrapolated above
        the last at ``slope_factor`` times the slope between the last two
        multi-token buckets (with one: its slope from the unit, at least
        ``slope_prior`` units per token)."""
        cost = {b: s for b, (s, _) in points.items()}
        fixed: list[int] = []
        for b in sorted(points, key=lambda b: -points[b][1]):  # the most recent evidence first
            if b >= 1:
                lo = max([cost[c] for c in fixed if c < b], default=0.0)
                hi = min([cost[c] for c in fixed if c > b], default=math.inf)
                cost[b] = min(max(cost[b], lo), hi)
                fixed.append(b)
        xs, ys = [], []
        for b in sorted(cost):
            lo, hi = self._span(b)
            xs += [lo, hi] if hi > lo else [lo]
            ys += [cost[b]] * (2 if hi > lo else 1)
        multi = [b for b in sorted(cost) if b >= 1]
        if len(multi) >= 2:
            (b1, b2) = multi[-2:]
            slope = (cost[b2] - cost[b1]) / (self._span(b2)[1] - self._span(b1)[1])
        else:  # one multi-token bucket: its slope from the unit, but at least the prior's
            slope = self.slope_prior * cost.get(0, ys[0])
            if multi and 0 in cost:
                slope = max(slope, (cost[multi[0]] - cost[0]) / (self._span(multi[0])[1] - 1))
        top = xs[-1]
        return np.interp(n, xs, ys) + slope_factor * max(float(slope), 0.0) * np.maximum(n - top, 0.0)

    def verify_cost(self) -> np.ndarray:
        """float64 [k_max + 1]: the cost of verifying ``d`` drafts (a forward
        over ``d + 1`` tokens), units of a 1-token step, as now estimated."""
        if self._fixed:
            return self._verify
        return self._curve() / self._unit()

    def _draft_seconds(self) -> float:
        if self._draft_cost is not None:
            return self._draft_cost * self._unit()
        if self._draft.seen == 0 or self._forwards[0].seen == 0:
            return 0.5 * self._unit()
        return self._draft.estimate()[0]

    def _catchup_seconds(self) -> float:
        """Seconds the draft model takes per token it catches up on (a guess, ``CATCHUP_PRIOR`` times
        cheaper than a draft token, until timed)."""
        if self._catchup.seen:
            return self._catchup.estimate()[0]
        return self._draft_seconds() / CATCHUP_PRIOR

    def draft_cost(self) -> float:
        """Cost of one draft-model token, units of a 1-token target step
        (0.5 until both are timed)."""
        return self._draft_seconds() / self._unit()

    # -- acceptance --

    def q(self, source: str, match: int = 0) -> float:
        """Estimated per-token acceptance of ``source``'s drafts ("sa" at a
        match of ``match`` tokens, or "draft")."""
        if source == "sa":
            b = match_bucket(max(int(match), 0))
            w = self.prior_weight
            odds = self._sa_odds() * self._match[b]
            return (self._sa_hits[b] + w * odds / (1.0 + odds)) / (self._sa_hits[b] + self._sa_misses[b] + w)
        if source == "draft":
            return self._nn_hits / (self._nn_hits + self._nn_misses)
        raise ValueError(f"unknown source {source!r}; choose from {', '.join(self.SOURCES)}")

    def _sa_odds(self) -> float:
        """This sequence's odds of accepting an SA draft token per matched
        token: the prior is odds ``m`` at a match of ``m`` (``m / (m + 1)``),
        scaled by how the sequence's SA drafts have fared against it so far at
        every match (a Mantel-Haenszel odds ratio over the match buckets, each
        against ``m + 1`` pseudo-tokens of prior, so that one miss at a long
        match counts about as much as one at a short one). A bucket seen
        little then already reflects the sequence: chat copies worse than the
        prior, code edits better."""
        m, hits, misses = self._match, self._sa_hits, self._sa_misses
        n = hits + misses + m + 1.0
        return (1.0 + (hits / n).sum()) / (1.0 + (misses * m / n).sum())

    def observe(self, source: str, match: int, drafted: int, accepted: int) -> None:
        """A step verified ``drafted`` tokens from ``source`` (made at a match
        of ``match`` tokens for the SA) and accepted the first ``accepted``.
        For the SA, :meth:`offer` and :meth:`observe_tokens` do this on every
        step, verified or not; use one or the other."""
        if source not in self.SOURCES:
            raise ValueError(f"unknown source {source!r}; choose from {', '.join(self.SOURCES)}")
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        miss = 1.0 if accepted < drafted else 0.0
        if source == "sa":
            b = match_bucket(max(int(match), 0))
            self._sa_hits[b] += accepted
            self._sa_misses[b] += miss
        else:
            self._nn_hits += accepted
            self._nn_misses += miss

    def offer(self, match: int, draft: Sequence[int], branched: bool = False) -> None:
        """The SA's draft on offer this step (before :meth:`choose` cuts it),
        made at a match of ``match`` tokens (``branched`` is ignored: the gate
        predates that evidence). It is scored against the tokens
        that follow (:meth:`observe_tokens`), whether it is verified or not;
        one offer is scored at a time, later ones wait for it."""
        if self._offer is None and len(draft) and match > 0:
            self._offer = (int(match), [int(t) for t in draft], 0)

    def withdraw_offer(self) -> None:
        """Drop the pending SA offer unscored (its sequence ended or changed)."""
        self._offer = None

    def observe_tokens(self, tokens: Sequence[int]) -> None:
        """The tokens a step emitted (accepted drafts and the target's own),
        in order: they score the pending SA offer."""
        if self._offer is None:
            return
        match, draft, i = self._offer
        for t in tokens:
            if int(t) != draft[i]:
                self.observe("sa", match, len(draft), i)
                self._offer = None
                return
            i += 1
            if i == len(draft):
                self.observe("sa", match, len(draft), i)
                self._offer = None
                return
        self._offer = (match, draft, i)

    # -- the choice --

    def _options(self, curve: np.ndarray, match: int, sa_len: int, model_k: int, model_behind: int,
                 q_draft: float) -> list[tuple[float, str, int]]:
        """(expected tokens per second, source, length) of every choice: no
        draft, the SA at 1..sa_len tokens, the draft model at 1..model_k (after
        reading the ``model_behind`` tokens it has not seen)."""
        out = [(1.0 / curve[0], "none", 0)]
        if sa_len > 0 and match > 0:
            k = min(sa_len, self.k_max)
            out += [(float(r), "sa", d) for d, r in enumerate(_rates(self.q("sa", match), k, curve, 0.0)) if d]
        if model_k > 0:
            k = min(model_k, self.k_max)
            # The catch-up, charged over the steps a started draft model drafts in a row (it reads one token per
            # step in any case).
            start = max(model_behind - 1, 0) * self._catchup_seconds() / CATCHUP_STEPS
            rates = _rates(q_draft, k, curve, self._draft_seconds(), start)
            out += [(float(r), "draft", d) for d, r in enumerate(rates) if d]
        return out

    def choose(self, match: int, sa_len: int, model_k: int = 0, model_behind: int = 1) -> tuple[str, int]:
        """``(source, length)`` for this step: "sa" with up to ``sa_len``
        tokens (what the automaton offers at a match of ``match``), "draft"
        with up to ``model_k`` draft-model tokens (0: no draft model; it would
        first read the ``model_behind`` tokens it has not seen: the whole text
        before its first draft, the SA's accepted tokens after SA steps), or
        ``("none", 0)`` where no draft is expected to beat a plain step, or
        ``("probe", 1)``: verify one token of whatever costs nothing (the SA's
        first draft token, else a guess), during the warm-up to time a small
        verify, and after it where verifying one token costs less than a plain
        step (on some CPUs a 2-row product is faster than a 1-row one) and no
        draft pays: a plain step, done faster."""
        self._step += 1
        self.stats["steps"] += 1
        if not self.timed or not self.probed:
            self.stats["warm-up"] += 1
            if sa_len > 0 and match > 0 and self.q("sa", match) >= WARM_COPY:
                return "sa", min(sa_len, self.k_max)  # a copy almost sure to be accepted pays on any machine
            self._waited += self.timed
            if self.timed and (sa_len > 0 and match > 0 or self._waited > PROBE_WAIT):
                return "probe", 1
            return "none", 0
        curve = self._curve()
        options = self._options(curve, match, sa_len, model_k, model_behind, self.q("draft"))
        best = max(options, key=lambda o: o[0])  # max keeps the first of equals: no draft, then shorter
        choice = self._retry(best[0], match, sa_len, model_k, model_behind)
        if choice is None:
            choice = best[1:]
            if choice[0] == "none" and curve[1] < curve[0]:
                choice = ("probe", 1)  # verifying one guessed token costs less than a plain step here
            self._period[_cost_bucket(choice[1] + 1)] = self.retry_after
        else:
            self.stats["retries"] += 1
        self.stats["guess" if choice[0] == "probe" else choice[0]] += 1
        return choice

    def _retry(self, rate: float, match: int, sa_len: int, model_k: int, model_behind: int) -> tuple[str, int] | None:
        """The re-try this step makes, or None (see the module doc): of the
        choices whose forward size is due and that would beat ``rate`` (the
        best estimate) at their fastest timings, the best of the smallest size."""
        due = self._step - self._timed_at >= self._period
        if not due.any():
            return None
        q_draft = max(self.q("draft"), self.model_prior)
        # Doubt the smallest verify at a step where a one-token SA draft is more likely accepted than not, so
        # that the re-try costs little even where verifying is as dear as it looked; after a second period
        # at any step.
        age = self._step - self._timed_at[1]
        doubt = (sa_len > 0 and match > 0 and self.q("sa", match) >= 0.5) or age >= 2 * self._period[1]
        options = self._options(self._curve(True, doubt), match, sa_len, model_k, model_behind, q_draft)
        options = [(_cost_bucket(o[2] + 1), -o[0], o[1], o[2]) for o in options]
        options = [o for o in options if due[o[0]] and -o[1] > rate]
        if not options:
            return None
        b, _, source, d = min(options)  # the smallest size that might pay, the cheapest to find out about
        self._retrying = (b, float(self._curve()[d]))  # what the size is expected to cost (see observe_forward)
        return source, d
