"""The drafting policy of a batch engine: :class:`DraftPolicy` (see :mod:`saspec.policy`), and its step in
one jitted call."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from .acceptance import N_BUCKETS, bucket_priors, estimate, keep_offer, match_bucket, score, score_kept
from .allocation import HIST_ROWS, N_BINS, STATS, allocate, running_rate, update_rate
from .core import NO_NRT
from .intrinsics import as_rows
from .policy_settings import Decision, PolicySettings, check_settings, engine_cost, env_log
from .step_cost import StepCost, cost_arrays, observe_cost
from .validate import check_count, check_int, check_timing

# DraftPolicy's state, in one int64 array made once per capacity (numba unpacks each array argument of a call
# on its own, so the per-step call takes the whole state as one). It begins with the layout, three entries per
# array in the order of _SLABS (its offset in int64 words, rows, columns); each array is a view of it, of the
# dtype _DTYPES gives (the float64 and int32 ones through ``ndarray.view``):
#   rowf   float64 [3, rows]: each row's odds factor, and the hits and misses behind it
#   bk     float64 [5, 3 * N_BUCKETS]: each match bucket's hits, trials, prior, estimate, and its odds (q / (1 - q));
#          the second third: a branched match's first token; the last: tokens beyond the match's length
#   probs  float64 [rows, k_max + 1]: the row's cumulative acceptance chances, and its expected tokens (scratch)
#   hist   float64 [HIST_ROWS, N_BINS]: the histogram (saspec.allocation's H_* rows; scratch)
#   par    float64 [5]: DraftPolicy.step's settings: row_memory, prior_weight, step_tolerance, the cost's quantile,
#          rate_memory
#   rate   float64 [5]: the running rate's sums and the last step's neural seconds (allocation.running_rate)
#   ri     int32 [3, rows]: each row's source, a trial source (scratch) and draft length (at first: its candidates)
#   prev   int32 [rows, k_max + 3]: for DraftPolicy.step, each row's last match, offer, branched and offered draft
#   unbr   int32 [rows]: zeros, ``branched`` where the caller gives none
#   st     int64 [len(STATS)]: the counters (DraftPolicy.stats)
#   last   int64 [2]: the rows and the tokens (rows plus draft tokens) of the last step
#   pari   int64 [1]: the cost's max_age (for DraftPolicy.step)
#: The arrays' order in DraftPolicy's state, by which _step finds them.
_SLABS = ("rowf", "bk", "probs", "hist", "par", "rate", "ri", "prev", "unbr", "st", "last", "pari")
_ROWF, _BK, _PROBS, _HIST, _PAR, _RATE, _RI, _PREV, _UNBR, _STC, _LAST, _PARI = range(len(_SLABS))
_DTYPES = {"rowf": np.float64, "bk": np.float64, "probs": np.float64, "hist": np.float64, "par": np.float64,
           "rate": np.float64, "ri": np.int32, "prev": np.int32, "unbr": np.int32, "st": np.int64, "last": np.int64,
           "pari": np.int64}
_ST = {name: i for i, name in enumerate(STATS)}
_I32 = np.dtype(np.int32)  # dtypes of the builtin types are singletons: ``is`` is the cheap test


def _make_state(shapes: dict[str, tuple[int, ...]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Allocate DraftPolicy's state: ``{name: shape}`` in the order of _SLABS (1-D or 2-D). Returns the zeroed
    int64 backing array (its layout first) and each array, a view of it of its _DTYPES dtype, by name."""
    header = 3 * len(_SLABS)
    layout, at = [], header
    for name in _SLABS:
        shape = shapes[name]
        rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (shape[0], 1)
        words = rows * cols if _DTYPES[name] is not np.int32 else (rows * cols + 1) // 2
        layout.append((at, rows, cols))
        at += words
    buf = np.zeros(at, np.int64)
    buf[:header] = np.asarray(layout, np.int64).reshape(-1)
    views = {}
    for name, (o, rows, cols) in zip(_SLABS, layout):
        n = rows * cols
        if _DTYPES[name] is np.int32:
            a = buf[o: o + (n + 1) // 2].view(np.int32)[:n]
        elif _DTYPES[name] is np.float64:
            a = buf[o: o + n].view(np.float64)
        else:
            a = buf[o: o + n]
        views[name] = a.reshape(shapes[name])
    return buf, views


# The views are inlined into _step, which compiles without reference counting (``core.NO_NRT``): a
# separately compiled function would hand it a reference it never gives back.
@njit(cache=True, inline="always")
def _f64(buf, i):
    """Array ``i`` of DraftPolicy's state, float64, 2-D (``buf``: the state)."""
    o, rows, cols = buf[3 * i], buf[3 * i + 1], buf[3 * i + 2]
    return as_rows(buf[o: o + rows * cols].view(np.float64), rows, cols)


@njit(cache=True, inline="always")
def _i32(buf, i):
    """Array ``i`` of DraftPolicy's state, int32, 2-D."""
    o, rows, cols = buf[3 * i], buf[3 * i + 1], buf[3 * i + 2]
    n = rows * cols
    return as_rows(buf[o: o + (n + 1) // 2].view(np.int32)[:n], rows, cols)


@njit(cache=True, inline="always")
def _i32_1(buf, i):
    """Array ``i`` of DraftPolicy's state, int32, 1-D."""
    o, n = buf[3 * i], buf[3 * i + 1] * buf[3 * i + 2]
    return buf[o: o + (n + 1) // 2].view(np.int32)[:n]


@njit(cache=True, inline="always")
def _i64(buf, i):
    """Array ``i`` of DraftPolicy's state, int64, 1-D."""
    o = buf[3 * i]
    return buf[o: o + buf[3 * i + 1] * buf[3 * i + 2]]


@njit(cache=True, **NO_NRT)
def _score_kept(prev, new, lens, rowf, bk, decay, w):
    """Score the offers kept in ``prev`` (one per row of ``new``), then re-estimate every bucket."""
    for r in range(new.shape[0]):
        score_kept(prev, r, new, r, lens[r], rowf, bk, decay)
    estimate(bk, w)


@njit(cache=True, **NO_NRT)
def _keep_offers(prev, match, offered, branched, drafts, width):
    """Keep each row's offer in ``prev`` for the next step."""
    for r in range(match.shape[0]):
        keep_offer(prev, r, match[r], offered[r], branched[r], drafts, r, width)


@njit(cache=True, **NO_NRT)
def _step(match, offered, branched, drafts, new, lens, seconds, step_tokens, same, state, cf, ci):
    """DraftPolicy.step in one call: the last step's timing (at ``step_tokens`` where > 0, else the rows
    and drafts it chose) and scores where ``same``, then this step's choice (automaton only). The policy's
    state and settings come as its one array (``branched`` None: its zeros), the cost's as its two buffers.
    It and the kernels it calls compile without reference counting (``core.NO_NRT``), which every view and
    every per-row call of the policy's functions would otherwise pay per array. Returns (the rows agree, rate,
    plain rate): where an array's rows differ from ``match``'s, nothing is read or changed."""
    b = match.shape[0]
    if not (offered.shape[0] == b and drafts.shape[0] == b and new.shape[0] == b and lens.shape[0] == b
            and (branched is None or branched.shape[0] == b)):
        return False, 0.0, 0.0
    rowf, bk, probs, hist = _f64(state, _ROWF), _f64(state, _BK), _f64(state, _PROBS), _f64(state, _HIST)
    ri, prev, st, last = _i32(state, _RI), _i32(state, _PREV), _i64(state, _STC), _i64(state, _LAST)
    par, rate = _f64(state, _PAR), _f64(state, _RATE)[:, 0]
    decay, w, tol, q, max_age = par[0, 0], par[1, 0], par[2, 0], par[3, 0], _i64(state, _PARI)[0]
    curve, index, knot, knot_i, ratios, steps, scale_buf, scratch, ctr = cost_arrays(cf, ci)
    if branched is None:
        br = _i32_1(state, _UNBR)[:b]
    else:
        br = branched
    no_nn = state[:0].view(np.bool_)
    rowf, probs, ri = rowf[:, :b], probs[:b], ri[:, :b]
    k = prev.shape[1] - 3
    if same and last[0] == b:
        timed = step_tokens if step_tokens > 0 else last[1]
        if observe_cost(timed, seconds, curve, index, knot, knot_i, ratios, steps, scale_buf, scratch, ctr,
                         max_age, q):
            st[9] += 1
        else:
            st[10] += 1
        _score_kept(prev, new, lens, rowf, bk, decay, w)
        update_rate(rate, lens, b, par[4, 0], last[1])
    best, plain, _, tokens, rate[4] = allocate(match, offered, br, no_nn, 0.0, 0, 0.0, 0.0, k, rowf, bk, probs,
                                                ri, hist, st, True, curve, index, knot, tol,
                                                running_rate(rate, curve, index, knot))
    _keep_offers(prev, match, offered, br, drafts, min(drafts.shape[1], k))
    last[0] = b
    last[1] = b + tokens
    return True, best, plain


@njit(cache=True, **NO_NRT)
def _score(match, offered, branched, drafts, new, lens, rowf, bk, decay, w):
    """:func:`saspec.acceptance.score`, compiled for DraftPolicy.observe."""
    score(match, offered, branched, drafts, new, lens, rowf, bk, decay, w)


@njit(cache=True, **NO_NRT)
def _running_rate(rate, curve, index, knot):
    """:func:`saspec.allocation.running_rate`, compiled for DraftPolicy.decide."""
    return running_rate(rate, curve, index, knot)


@njit(cache=True, **NO_NRT)
def _update_rate(rate, new_lens, rows, memory, tokens):
    """:func:`saspec.allocation.update_rate`, compiled for DraftPolicy.observe."""
    update_rate(rate, new_lens, rows, memory, tokens)


@njit(cache=True, **NO_NRT)
def _estimate(bk, w):
    """:func:`saspec.acceptance.estimate`, compiled."""
    estimate(bk, w)


class DraftPolicy:
    """Each step's draft length and source per row (see the module doc).

    Each step the caller:

    1. :meth:`decide` with each row's match length and the automaton's
       offered draft length (and the neural drafter's K, where there is one);
    2. verifies what it chose, then :meth:`observe_step` with the step's
       seconds (the neural drafter's apart, :meth:`observe_neural`) and
       :meth:`observe` with each row's offered draft and emitted tokens.

    An engine without a neural drafter does all three in one call per step,
    :meth:`step`, which keeps the offers to score itself.

    Args:
        k_max: the most automaton draft tokens per row (>= 1).
        cost: the engine's :class:`StepCost` (e.g. from :meth:`StepCost.profile`);
            default one on ``settings.cost_shape``.
        settings: :class:`PolicySettings`; default all defaults.
        neural_catchup_sunk: the engine runs the neural drafter's catch-up
            forward at every step anyway (vLLM's draft model): choosing it
            costs only its drafting forwards.
        log: called with each step's :class:`Decision`, or None.
        clock: the time source the integrations read (a test injects one).

    Raises:
        ValueError: a setting out of range (named in the message).

    Attributes:
        stats: counters (a new dict per read): ``steps``, ``rows``, ``automaton_rows``,
            ``neural_rows``, ``none_rows``, ``automaton_tokens``, ``neural_tokens``,
            ``neural_steps``, ``plain_steps`` (steps that drafted nothing), ``timed`` and
            ``ignored_timings`` (not finite or not > 0).
    """

    def __init__(self, k_max: int, *, cost: StepCost | None = None, settings: PolicySettings | None = None,
                 neural_catchup_sunk: bool = False, log: Callable[[Decision], Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.k_max = check_count(k_max, "k_max")
        s = settings if settings is not None else PolicySettings()
        self.settings = s
        self.neural_k = 0
        v = check_settings(s)
        self.prior_weight, self.neural_prior = v["prior_weight"], v["neural_prior"]
        self.neural_cost, self.step_tolerance = v["neural_cost"], v["step_tolerance"]
        self.rate_memory = v["rate_memory"]
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning seconds, got {clock!r}")
        if log is not None and not callable(log):
            raise ValueError(f"log must be a callable or None, got {log!r}")
        self.cost = cost if cost is not None else StepCost(s.cost_shape, window=s.window, max_age=s.max_age,
                                                            quantile=s.quantile)
        if not isinstance(self.cost, StepCost):
            raise ValueError(f"cost must be a saspec.policy.StepCost, got {type(self.cost).__name__}")
        self.catchup_sunk = bool(neural_catchup_sunk)
        self.log, self.clock = log, clock
        self._nn_hits = 0.0
        self._nn_trials = 0.0
        # The neural cost ratio: its latest timings, each against the target's cost of the same tokens.
        self._nn_calls = np.zeros((s.window, 5))  # its latest calls: seconds, read, drafted, rows, step
        self._nn_seen = 0
        self._rows: list[Any] | None = None
        self._saved: dict[Any, tuple[float, float]] = {}
        self._cap = 0
        self._step_tail: tuple | None = None
        self._grow(1)
        self._bk[2] = bucket_priors()
        _estimate(self._bk, self.prior_weight)

    @classmethod
    def for_engine(cls, k_max: int, *, device: str = "cpu", settings: PolicySettings | None = None,
                   max_tokens: int | None = None, neural_catchup_sunk: bool = False,
                   log: Callable[[Decision], Any] | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> DraftPolicy:
        """The policy an engine uses, with its cost model: the prior cost shape follows ``device``
        (``"cpu"``: :func:`cpu_like`, compute-bound; anything else: :func:`gpu_like`, memory-bound) unless
        ``settings.cost_shape`` is set; the :class:`StepCost` takes ``settings``' ``window``, ``max_age``
        and ``quantile``, and ``max_tokens`` (the most tokens a step verifies) where given.

        Args:
            k_max: the most automaton draft tokens per row (>= 1).
            device: the engine's device type (``"cpu"``, ``"cuda"``, ...).
            settings: :class:`PolicySettings`; default all defaults.
            max_tokens: the most tokens a step verifies (rows x (K + 1)); None: StepCost's default.
            neural_catchup_sunk, clock: as :class:`DraftPolicy`.
            log: called with each step's :class:`Decision`; None: :func:`env_log` (the logger where
                ``$SASPEC_POLICY_LOG`` is set).

        Raises:
            ValueError: a setting out of range (named in the message).
        """
        ps = settings if settings is not None else PolicySettings()
        return cls(k_max, cost=engine_cost(ps, device, max_tokens), settings=ps,
                   neural_catchup_sunk=neural_catchup_sunk, log=log if log is not None else env_log(), clock=clock)

    @property
    def stats(self) -> dict[str, int]:
        return dict(zip(STATS, self._st.tolist()))

    @property
    def running_rate(self) -> float:
        """The tokens a second the rows have emitted of late (no more than each step verified, over the steps
        priced at the cost model as it stands; decayed by ``settings.rate_memory`` a step); 0 before a step is
        scored or where ``rate_memory`` is 0. A step drafts no token deeper than its row's match whose chance
        does not pay its cost at this rate (see :mod:`saspec.policy`)."""
        return float(_running_rate(self._rate, *self.cost.arrays()[:3])) if self.rate_memory > 0.0 else 0.0

    @property
    def last_tokens(self) -> int:
        """The draft tokens the last :meth:`decide` or :meth:`step` chose."""
        return int(self._last[1] - self._last[0])

    def _grow(self, rows: int) -> None:
        if rows <= self._cap:
            return
        cap = max(rows, 2 * self._cap)
        shapes = {"rowf": (3, cap), "bk": (5, 3 * N_BUCKETS), "probs": (cap, self.k_max + 1),
                  "hist": (HIST_ROWS, N_BINS), "par": (5,), "rate": (5,), "ri": (3, cap), "prev": (cap, self.k_max + 3),
                  "unbr": (cap,), "st": (len(STATS),), "last": (2,), "pari": (1,)}
        self._state, v = _make_state(shapes)
        v["rowf"][0] = 1.0
        if self._cap:  # the evidence moves to the new buffers
            v["rowf"][:, : self._cap] = self._rowf
            for name in ("bk", "st", "last", "rate"):
                v[name][:] = getattr(self, "_" + name)
        self._rowf, self._bk, self._probs, self._hist = v["rowf"], v["bk"], v["probs"], v["hist"]
        self._ri, self._prev, self._st, self._last = v["ri"], v["prev"], v["st"], v["last"]
        self._par, self._pari, self._rate = v["par"], v["pari"], v["rate"]
        self.p_bucket = self._bk[3]
        self._nn_ok = np.zeros(cap, np.bool_)
        self._unbranched = v["unbr"]  # ``branched`` where the caller gives none
        self._last[0] = -1  # no last step to score: the rows moved
        self._cap = cap
        self._views: tuple | None = None

    # -- rows: each request's own acceptance evidence --

    def rows(self, request_ids: Sequence[Any]) -> None:
        """Name the rows of the next :meth:`decide` (any hashable ids); a row keeps its request's evidence
        when requests move between rows. Without it, rows are positions."""
        ids = list(request_ids)
        if ids == self._rows:
            return
        if self._rows is not None:
            for i, rid in enumerate(self._rows):
                self._saved[rid] = (self._rowf[1, i], self._rowf[2, i])
        self._grow(len(ids))
        for i, rid in enumerate(ids):
            num, den = self._saved.pop(rid, (0.0, 0.0))
            self._rowf[:, i] = ((1.0 + num) / (1.0 + den), num, den)
        self._rows = ids

    def forget(self, request_id: Any) -> None:
        """A finished request: drop its evidence."""
        self._saved.pop(request_id, None)
        if self._rows is not None and request_id in self._rows:
            self._rowf[:, self._rows.index(request_id)] = (1.0, 0.0, 0.0)

    # -- the choice --

    def q_neural(self) -> float:
        """The neural drafter's estimated per-token acceptance."""
        w = self.prior_weight
        return (self._nn_hits + w * self.neural_prior) / (self._nn_trials + w)

    def neural_ratio(self) -> float:
        """A neural forward's cost as a share of a target forward over the same tokens, as now learnt: the
        median of its timings of the last ``4 * max_age`` steps (each against the target's cost model
        as it stands now, so that timings taken before the target's steps were timed count right) once there
        are two, else the lower of ``neural_cost`` and the one timing (one slow call, a lazy start or a
        recompile, moves nothing)."""
        m = min(self._nn_seen, self._nn_calls.shape[0])
        calls = self._nn_calls[:m]
        calls = calls[self._st[0] - calls[:, 4] <= 4 * self.cost.max_age]
        if not len(calls):
            return self.neural_cost
        c = self.cost
        target = c.seconds(np.maximum(calls[:, 1], 1).astype(np.int64)) \
            + np.maximum(calls[:, 2] - 1, 0) * c.seconds(np.maximum(calls[:, 3], 1).astype(np.int64))
        ratios = np.sort(calls[:, 0] / target)
        if len(ratios) >= 2:  # the median: its calls mix catch-ups and drafting forwards of other shapes
            return float(ratios[(len(ratios) - 1) // 2])
        return float(min(self.neural_cost, ratios[0]))

    def _batch(self, b: int) -> tuple:
        """Views of the row state for a batch of ``b`` rows, reused while the batch keeps its size."""
        if b > self._cap:
            self._grow(b)
        v = self._views
        if v is None or v[0] != b:
            v = self._views = (b, self._rowf[:, :b], self._probs[:b], self._ri[:, :b], self._nn_ok[:b],
                               self._ri[2, :b], self._ri[0, :b], self._prev[:b])
        return v

    def decide(self, match_len: np.ndarray, offered: np.ndarray, neural_k: int = 0, neural_rows: Any = None,
               neural_behind: int = 0, catchup_share: float = 1.0, count: bool = True,
               branched: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each row's draft length and source for this step.

        Args:
            match_len: int [B]: each row's match length (tokens; <= 0: no automaton draft).
            offered: int [B]: the automaton draft tokens on offer per row (cut to ``k_max``).
            branched: int32 [B] or None: 1 where the row's match went on with several tokens
                earlier (``SpecEngine.extend``'s ``branch_out``); None: none did.
            neural_k: the most tokens the neural drafter makes per row this step (0: none).
            neural_rows: bool [B]: rows the neural drafter may draft for (default all, where
                ``neural_k > 0``).
            neural_behind: tokens the neural drafter must read before it drafts (its catch-up;
                ignored where the catch-up is sunk).
            catchup_share: the share of the catch-up this step is charged (a catch-up over a long
                stretch, like the prompt, serves the neural steps after it too), in (0, 1].
            count: False for a look-ahead that is not a step (not counted in :attr:`stats`).

        Returns:
            ``(lengths, sources)``: int32 [B] and int32 [B] (:data:`NONE`, :data:`AUTOMATON`,
            :data:`NEURAL`), views the next call overwrites. A row with length 0 has source NONE.

        Raises:
            ValueError: arrays of other shapes, or a negative ``neural_k``.
        """
        b = match_len.shape[0]
        if offered.shape != (b,):
            raise ValueError(f"offered must have shape ({b},), got {offered.shape}")
        branched = self._branched(branched, b)
        if neural_k < 0:
            raise ValueError(f"neural_k must be >= 0, got {neural_k}")
        if self._rows is not None and len(self._rows) != b:
            self._rows = None  # positions: the caller named no rows for this batch
        _, rowf, probs, ri, nn_ok, lengths, src, _ = self._batch(b)
        q_nn = ratio = catch = 0.0
        if neural_k > 0:
            nn_ok[:] = True if neural_rows is None else np.asarray(neural_rows, dtype=np.bool_)
            q_nn, ratio = self.q_neural(), self.neural_ratio()
            if not self.catchup_sunk:
                catch = self.cost.seconds(max(int(neural_behind), 1)) * min(max(float(catchup_share), 0.0), 1.0)
        c = self.cost
        rate, plain, nk, tokens, seconds = allocate(
            match_len, offered, branched, nn_ok, q_nn, int(neural_k), ratio, catch, self.k_max, rowf, self._bk, probs,
            ri, self._hist, self._st, bool(count), *c.arrays()[:3], self.step_tolerance, self.running_rate)
        if count:
            self._last[:] = (b, b + tokens)
            self._rate[4] = seconds
            self.neural_k = int(nk)
            if self.log is not None:
                self.log(Decision(int(self._st[0]), lengths.copy(), src.copy(), float(rate), float(plain), int(nk)))
        return lengths, src

    def step(self, match_len: np.ndarray, offered: np.ndarray, drafts: np.ndarray, new: np.ndarray,
             new_lens: np.ndarray, seconds: float, same_rows: bool, branched: np.ndarray | None = None,
             step_tokens: int = 0) -> np.ndarray:
        """One step of an engine without a neural drafter, in one jitted call: where ``same_rows``,
        first the last step's forward (``seconds``; it verified the rows and the draft tokens the last
        call chose) and what followed each row's last offer, then this step's choice.

        Args:
            match_len: int32 [B]: each row's match length (<= 0: no automaton draft).
            offered: int32 [B]: the automaton draft tokens on offer per row (cut to ``k_max``).
            drafts: int32 [B, >= 1]: the offered drafts (kept, up to ``k_max`` tokens, for the next call).
            new: int32 [B, >= max(new_lens)]: the tokens each row emitted since the last call.
            new_lens: int32 [B]: how many (0: none).
            seconds: the last step's forward; not finite or not > 0: ignored (counted).
            same_rows: the rows are the last call's requests, in the same order (else nothing is scored
                or timed: a row's evidence moves with :meth:`rows`).
            branched: int32 [B] or None: as in :meth:`decide`.
            step_tokens: the tokens the timed forward processed, where the engine knows them (vLLM's
                scheduled tokens: a step that also prefills other requests costs what it processed);
                0: the rows and draft tokens the last call chose.

        Returns:
            int32 [B]: each row's draft length (a view the next call overwrites).

        Raises:
            ValueError: arrays of other shapes.
        """
        b = match_len.shape[0]
        if offered.ndim != 1 or new_lens.ndim != 1:  # (the rows of every array: _step, at no cost)
            raise ValueError(f"offered and new_lens must be 1-D, got {offered.ndim}-D and {new_lens.ndim}-D")
        if type(seconds) is not float:  # a float passes as is (the ABC checks cost more than the call's arrays)
            seconds = check_timing(seconds, "seconds")  # TypeError unless a real number (None, a bool)
        if self._rows is not None and len(self._rows) != b:
            self._rows = None
        v = self._views
        if v is None or v[0] != b:
            v = self._batch(b)
        tail = self._step_tail
        if tail is None or tail[0] is not self._state or tail[1] is not self.cost:  # kept while they stay
            c = self.cost
            self._par[:] = (self.settings.row_memory, self.prior_weight, self.step_tolerance, c.quantile,
                            self.rate_memory)
            self._pari[0] = c.max_age
            tail = self._step_tail = (self._state, c, (self._state, *c.slabs()))
        if branched is not None and not (type(branched) is np.ndarray and branched.dtype is _I32
                                         and branched.ndim == 1):
            branched = self._branched(branched, b)
        rows_agree, rate, plain = _step(match_len, offered, branched, drafts, new, new_lens, seconds,
                                        int(step_tokens), same_rows, *tail[2])
        if not rows_agree:
            if branched is not None and branched.shape != (b,):
                raise ValueError(f"branched must have shape ({b},), got {branched.shape}")
            raise ValueError("match_len, offered, drafts, new and new_lens must have the same rows")
        lengths, src = v[5], v[6]
        self.neural_k = 0
        if self.log is not None:
            self.log(Decision(int(self._st[0]), lengths.copy(), src.copy(), float(rate), float(plain), 0))
        return lengths

    # -- what followed --

    def observe_step(self, tokens: int, seconds: float) -> None:
        """The step's target forward verified ``tokens`` tokens (rows plus draft tokens) in ``seconds``
        (the neural drafter's time apart). A timing that is not finite and > 0 is ignored.
        ``TypeError`` for ``tokens`` that is not an int (>= 0) or ``seconds`` that is not a real number."""
        check_int(tokens, "tokens", 0)
        self._st[_ST["timed" if self.cost.observe(int(tokens), seconds) else "ignored_timings"]] += 1
        if self.settings.neural_memory < 1.0:
            self._nn_hits *= self.settings.neural_memory
            self._nn_trials *= self.settings.neural_memory

    def observe_neural(self, seconds: float, read: int, drafted: int, rows: int = 1) -> None:
        """One neural drafter call: ``seconds``, after reading ``read`` tokens (its catch-up; its first
        forward), drafting ``drafted`` tokens per row for ``rows`` rows. Ignored when not finite and > 0;
        ``TypeError`` where ``seconds`` is not a real number (a bool, None)."""
        seconds = check_timing(seconds, "seconds")
        if not (math.isfinite(seconds) and seconds > 0):
            return
        self._nn_calls[self._nn_seen % self._nn_calls.shape[0]] = (seconds, read, drafted, rows, self._st[0])
        self._nn_seen += 1

    def observe_neural_outcome(self, drafted: int, accepted: int) -> None:
        """A neural draft of ``drafted`` tokens of which the first ``accepted`` were accepted."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        self._nn_hits += accepted
        self._nn_trials += accepted + (1 if accepted < drafted else 0)

    def observe(self, match_len: np.ndarray, offered: np.ndarray, drafts: np.ndarray, new: np.ndarray,
                new_lens: np.ndarray, branched: np.ndarray | None = None) -> None:
        """Score each row's automaton offer of the last :meth:`decide` against what followed.

        Args:
            match_len: int [B]: the match lengths given to :meth:`decide`.
            branched: int32 [B] or None: as given to :meth:`decide`.
            offered: int [B]: the automaton's offered draft lengths (verified or not).
            drafts: int [B, >= max(offered)]: the offered drafts.
            new: int [B, >= max(new_lens)]: the tokens each row emitted this step.
            new_lens: int [B]: how many (0: the row emitted nothing).
        """
        b = int(match_len.shape[0])
        if not (offered.shape == new_lens.shape == (b,) and drafts.shape[0] == b and new.shape[0] == b):
            raise ValueError("match_len, offered, drafts, new and new_lens must have the same rows")
        _score(match_len, offered, self._branched(branched, b), drafts, new, new_lens, self._batch(b)[1], self._bk,
               self.settings.row_memory, self.prior_weight)
        _update_rate(self._rate, new_lens, b, self.rate_memory, int(self._last[1]))

    def _branched(self, branched: Any, b: int) -> np.ndarray:
        """``branched`` as int32 [b] (zeros where None); raises ``ValueError`` naming a wrong shape."""
        if branched is None:
            self._grow(b)
            return self._unbranched[:b]
        out = np.asarray(branched)
        if out.shape != (b,):
            raise ValueError(f"branched must have shape ({b},), got {out.shape}")
        return out if out.dtype == np.int32 else out.astype(np.int32)

    def q_automaton(self, match: int, row: int = 0, branched: bool = False) -> float:
        """The estimated chance the automaton's next draft token at a match of ``match`` is accepted
        (for row ``row`` of the last batch; ``branched``: the match went on with several tokens earlier)."""
        q = self.p_bucket[match_bucket(max(int(match), 0)) + (N_BUCKETS if branched else 0)]
        odds = q / (1 - q) * self._rowf[0, row]
        return float(odds / (1 + odds))
