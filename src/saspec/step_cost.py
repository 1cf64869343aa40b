"""The step-cost model: seconds of an engine's step as a function of the tokens it verifies.

**The cost model** (:class:`StepCost`): ``C(n) = shape(n) * r(n)``. ``shape``
is the engine's cost curve, measured up front by :meth:`StepCost.profile` (a
short deterministic profile: each size timed ``repeats`` times, the minimum
taken) or one of the prior shapes (:func:`cpu_like`, :func:`gpu_like`). The
correction ``r`` is learnt from the timed steps: per knot (token counts 1, 2,
3, 4, 6, 8, 12, ...: half-octaves) the lower quartile of the knot's latest
``window`` timings, each as a ratio to ``shape``, once it has two; with one
or none, a *pseudo-timing*: what its neighbours say (the correction of the
nearest knots timed twice lately, interpolated between them and flat beyond:
a size next to dear ones is dear, no need to try it; but above them no dearer
than the line through the two largest; with none, the global scale, the lower
quartile of the latest ``4 * window`` ratios of all steps), times the knot's
deviation from its neighbours when it was last timed twice, that deviation
fading by half in log every ``2 * max_age`` steps. (Not a deviation from the
global scale: where the shape is wrong, that scale moves with the sizes timed
lately, as between a CPU's code edits that verify full drafts and its prose
that verifies a token a step.) Timings older than
``max_age`` steps no longer count; ``r`` is interpolated between knots and
made to rise with the tokens; below the smallest knot timed lately, sizes not
timed lately are assumed no dearer than their share of it (so a wrong prior
there is found out by trying). So

* a few slow timings move nothing: a knot's single timing is taken only
  where it is lower than its pseudo-timing (what the knot cost when last
  timed, or the global scale); two or more give their lower quartile, so one
  fast timing counts only until the next ones outvote it, but with fewer
  than ``DEAR_TIMINGS`` no dearer than the knot was believed where they make
  a token dearer than a fresh timing of a smaller knot allows (a size
  believed dear is not tried again);
* a curve that turns up past the sizes timed twice lately (a CPU verifying
  hundreds of tokens a step, where the line through them promises less) is
  found out while a ramp tries a new size each step: once two knots above
  them were timed once each, every size above is believed dearer by the
  lesser of how much dearer the two largest such timings were than the line
  (from ``TURN`` to ``PER_TOKEN_SLACK``; remembered once they age out,
  fading like a knot's deviation);
* a burst of load or a competing process (timings 2-5x on a third of the
  steps) is ignored by the lower quartiles, and a burst long enough to move a
  knot ages out after ``max_age`` steps, after which the knot follows the
  global scale (the profile's shape) again: neither a lock-out of drafting nor
  a lock-in;
* a cold start scales every knot alike (the global scale absorbs it) and the
  choice depends only on the curve's shape.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import int64, njit
from numba.extending import register_jitable

from .core import NO_NRT
from .portable import fmul
from .slab import slab, view1, view2
from .validate import check_count, check_timing

#: How many times ``window`` of the latest timings set the global scale.
SCALE_WINDOWS = 4
#: A step of n tokens costs at most n / m times a step of m (it could run as that many steps), within this slack.
PER_TOKEN_SLACK = 1.25
#: The fresh timings a knot needs to be believed dearer than it was where they say more than ``PER_TOKEN_SLACK``
#: allows against a fresh timing of a smaller knot (timing noise only adds time): under contention two slow timings
#: in a row at a size tried now and then are common, a size believed dear is not tried again, and every size above
#: it is at least as dear.
DEAR_TIMINGS = 4
#: How much dearer than the line through the sizes timed twice two larger sizes must be to show that the curve
#: turns up there (:func:`_over_chord`): the knots' binning and a prior shape's curvature put the line a few
#: percent off either way.
TURN = 1.1
#: The most tokens a step may verify in the model (``StepCost(max_tokens=...)``): its tables take
#: O(max_tokens) memory and time to build.
MAX_STEP_TOKENS = 1 << 20
#: The range a cost shape's values, and each timing's ratio to the shape, must lie in. Within it every ratio,
#: correction and cost stays a finite normal float: a denormal or overflowing one made costs NaN (the policy
#: then never drafts). Timings whose ratio falls outside are ignored like non-finite ones.
MIN_COST, MAX_COST = 1e-150, 1e150


# -- cost shapes ---------------------------------------------------------------------------------------------


def linear(overhead: float = 1.0, per_token: float = 1.0) -> Callable[[np.ndarray], np.ndarray]:
    """A cost shape ``overhead + per_token * n`` (seconds, or any unit: only the shape matters)."""
    return lambda n: overhead + per_token * np.asarray(n, dtype=np.float64)


def cpu_like(n: Any) -> np.ndarray:
    """Prior shape of a compute-bound engine (a CPU): a fixed part worth about four tokens, then every
    verified token costs about as much as a row's own token."""
    return 4.0 + np.asarray(n, dtype=np.float64)


def gpu_like(n: Any) -> np.ndarray:
    """Prior shape of a memory-bound engine (a GPU at small batch): a fixed part worth about 256 tokens, then
    every verified token its own compute. The fixed part is the step's weight reads, which take about as long
    as computing as many tokens as the GPU's FLOPs per byte of bandwidth (a few hundred on current data-center
    GPUs); past its knee a step keeps paying it. A knee-then-proportional shape (flat to some size, then
    linear through the origin) makes every token past the knee look as dear as a row's share of the fixed
    part and cuts the long drafts of batches that pass it."""
    return 256.0 + np.asarray(n, dtype=np.float64)


def knots_for(max_tokens: int) -> np.ndarray:
    """float64: the token counts the correction is learnt at: 1, 2, 3, 4, 6, 8, 12, ... (half-octaves),
    up to at least ``max_tokens``."""
    out = [1.0, 2.0]
    while out[-1] < max_tokens:
        p = 2.0 ** math.floor(math.log2(out[-1]))
        out.append(out[-1] + p / 2 if out[-1] == p else 2 * p)
    return np.asarray(out)


@njit(cache=True, **NO_NRT)
def _select(vals, n, r):
    """The ``r``-th smallest of ``vals[:n]`` (0-based), reordering them in place: Hoare's quickselect
    (middle pivot), with no allocation."""
    lo, hi = 0, n - 1
    while lo < hi:
        pivot = vals[(lo + hi) // 2]
        i, j = lo, hi
        while i <= j:
            while vals[i] < pivot:
                i += 1
            while vals[j] > pivot:
                j -= 1
            if i <= j:
                vals[i], vals[j] = vals[j], vals[i]
                i += 1
                j -= 1
        if r <= j:
            hi = j
        elif r >= i:
            lo = i
        else:
            break
    return vals[r]


@njit(cache=True, **NO_NRT)
def _low_quantile(vals, n, q):
    """The ``q`` quantile (nearest rank below) of ``vals[:n]``, reordering them in place."""
    return _select(vals, n, int(q * (n - 1)))


# StepCost's state lives in a few arrays (views of two buffers: saspec.slab) so that one jitted call reads and
# updates all of it:
#   curve   float64 [2, max_tokens + 1]: the shape, and each token count's weight between its two knots
#   index   int64 [2, max_tokens + 1]: each token count's lower knot, and its nearest knot
#   knot    float64 [4, knots]: token count, shape there, correction, deviation from its neighbours when
#           last timed twice
#   knot_i  int64 [2, knots]: timings written, step of the last remembered deviation (-1: never)
#   ratios, steps  [knots, window]: each knot's latest timings (as ratios to the shape) and their steps
#   scale_buf  float64 [SCALE_WINDOWS * window]: the latest ratios of all knots
#   ctr     float64 [6]: steps counted, ratios written to scale_buf, timings taken, the global scale, how much
#           dearer than the line the sizes above those timed twice were when last seen (_over_chord), and when
_STEP, _SEEN, _TIMED, _SCALE, _OVER, _OVER_STEP = 0, 1, 2, 3, 4, 5
#: The arrays' order in StepCost's slab, by which cost_arrays finds them.
_SLABS = ("curve", "index", "knot", "knot_i", "ratios", "steps", "scale_buf", "scratch", "ctr")
_CURVE, _INDEX, _KNOT, _KNOT_I, _RATIOS, _STEPS, _SCALE_BUF, _SCRATCH, _CTR = range(len(_SLABS))


@register_jitable
def cost_of(n, curve, index, knot):
    """Estimated cost of a step of ``n`` tokens (see StepCost.seconds). Compiled for the host and for CUDA
    (``saspec.device.policy_kernel``), with the same bits on both (``saspec.portable``)."""
    n = max(int64(n), int64(1))
    extra = 0.0
    top = curve.shape[1] - 1
    if n > top:
        extra = fmul(curve[0, top] - curve[0, top - 1], float(n - top))
        n = int64(top)
    lo = index[0, n]
    w = curve[1, n]
    return fmul(curve[0, n] + extra, fmul(1.0 - w, knot[2, lo]) + fmul(w, knot[2, lo + 1]))


@njit(cache=True, inline="always")
def cost_arrays(cf, ci):
    """StepCost.arrays() from StepCost.slabs(), inside a kernel."""
    return (view2(cf, ci, _CURVE), view2(ci, ci, _INDEX), view2(cf, ci, _KNOT), view2(ci, ci, _KNOT_I),
            view2(cf, ci, _RATIOS), view2(ci, ci, _STEPS), view1(cf, ci, _SCALE_BUF), view1(cf, ci, _SCRATCH),
            view1(cf, ci, _CTR))


@njit(cache=True, **NO_NRT)
def _neighbours(knot, k, lo, lo2, hi, n_knots, s):
    """What the knots timed twice lately other than ``k`` say of knot ``k``'s correction, from the nearest
    of them below (``lo``, and ``lo2`` below it) and above (``hi``; -1 or ``n_knots`` where there is none):
    interpolated between the nearest below and above, flat beyond them (a size near dear ones is dear) but
    above them no dearer than the line through the two largest; ``s`` (the global scale) where none is."""
    if lo >= 0 and hi < n_knots:
        return knot[2, lo] + (knot[2, hi] - knot[2, lo]) * (k - lo) / (hi - lo)
    if hi < n_knots:
        return knot[2, hi]
    if lo < 0:
        return s
    near = knot[2, lo]
    # Above every knot timed twice: no dearer than the line through the two largest of them. The flat
    # correction makes every token past them as dear as a token there with its share of the overhead (where
    # the prior shape's fixed part is too small, a knot at a time is all the policy would try); the last chord
    # of a cost curve with an overhead is no flatter than the curve beyond it.
    if lo2 >= 0:  # a chord that does not rise (a flat stretch, or noise) says nothing of the slope
        c_lo = knot[1, lo] * knot[2, lo]
        slope = (c_lo - knot[1, lo2] * knot[2, lo2]) / (knot[0, lo] - knot[0, lo2])
        if slope > 0.0:
            near = min(near, (c_lo + slope * (knot[0, k] - knot[0, lo])) / knot[1, k])
    return near


@njit(cache=True, **NO_NRT)
def _faded(deviation, since, step, max_age):
    """A deviation seen at step ``since``, faded by half in log every ``2 * max_age`` steps."""
    return deviation ** (0.5 ** ((step - since) / (2.0 * max_age)))


@njit(cache=True, **NO_NRT)
def _fresh_timing(ratios, steps, knot_i, k, step, max_age):
    """The latest of knot ``k``'s timings no older than ``max_age`` steps (NaN: none)."""
    out = math.nan
    for j in range(min(knot_i[0, k], ratios.shape[1])):
        if step - steps[k, j] <= max_age:
            out = ratios[k, j]
    return out


@njit(cache=True, **NO_NRT)
def _over_chord(knot, ratios, steps, knot_i, scratch, ctr, f, top, top2, n_knots, s, step, max_age):
    """How much dearer than the neighbours' line (:func:`_neighbours`) the sizes above every knot timed twice
    lately are: the lesser of what the two largest knots above them that were timed once say (their timing's
    ratio to the line), at most ``PER_TOKEN_SLACK``, and 1 where below ``TURN``; with fewer than two such
    knots, what two said when last seen, fading by half in log every ``2 * max_age`` steps; 1 where no knot
    is timed twice. ``scratch[f + k]``: knot k's fresh timings (as :func:`_refresh` counts them).

    A cost curve can turn up past the sizes timed twice (a CPU's step past its caches, or a runner's
    per-token work): a ramp that tries a new, larger size each step times no knot twice, so each dear timing
    alone would be taken as noise and the line believed all the way up. Two dear knots agreeing are not
    noise, and the lesser of them leaves a single slow timing out; a competing process can still slow two, so
    they raise the line no more than a token's cost may plausibly rise without more timings. The largest
    knots speak for the sizes a ramp would try next; the memory keeps a ramp that found the turn from trying
    it again at full size as soon as its timings age out."""
    if top < 0:
        return 1.0
    m = 0
    low = math.inf
    k = n_knots - 1
    while k > top and m < 2:
        if scratch[f + k] == 1:
            low = min(low, _fresh_timing(ratios, steps, knot_i, k, step, max_age)
                      / _neighbours(knot, k, top, top2, n_knots, n_knots, s))
            m += 1
        k -= 1
    if m < 2:
        if ctr[_OVER_STEP] < 0.0:
            return 1.0
        return _faded(ctr[_OVER], ctr[_OVER_STEP], step, max_age)
    ctr[_OVER] = min(low, PER_TOKEN_SLACK) if low >= TURN else 1.0
    ctr[_OVER_STEP] = step
    return ctr[_OVER]


@njit(cache=True, **NO_NRT)
def _refresh(curve, index, knot, knot_i, ratios, steps, scale_buf, scratch, ctr, max_age, q, ratio, k):
    """Record a timing (``ratio`` at knot ``k``; none where ``k < 0``) and recompute every knot's
    correction (see the module doc)."""
    step = ctr[_STEP]
    if k >= 0:
        j = knot_i[0, k] % ratios.shape[1]
        ratios[k, j] = ratio
        steps[k, j] = step
        knot_i[0, k] += 1
        scale_buf[int(ctr[_SEEN]) % scale_buf.shape[0]] = ratio
        ctr[_SEEN] += 1
    m = min(int(ctr[_SEEN]), scale_buf.shape[0])
    n_knots = knot.shape[1]
    if m == 0:
        knot[2, :] = 1.0
        ctr[_SCALE] = 1.0
        return
    for j in range(m):  # (a slice assignment would allocate: the two may overlap, as far as numba knows)
        scratch[j] = scale_buf[j]
    s = _low_quantile(scratch, m, q)
    ctr[_SCALE] = s
    f = scale_buf.shape[0]  # scratch[f + k]: knot k's fresh timings
    per_token = math.inf  # the least a token cost in a fresh timing of a smaller knot: timing noise only adds
    top, top2 = -1, -1  # the two largest knots timed twice lately
    for k in range(n_knots):
        cnt = 0
        last = -1
        fastest = math.inf
        for j in range(min(knot_i[0, k], ratios.shape[1])):  # the timings written (none: nothing to scan)
            if step - steps[k, j] <= max_age:
                scratch[cnt] = ratios[k, j]
                cnt += 1
                last = max(last, steps[k, j])
                fastest = min(fastest, ratios[k, j])
        if cnt >= 2:  # two fresh timings or more: their lower quantile
            own = _low_quantile(scratch, cnt, q)
            if cnt < DEAR_TIMINGS and own * knot[1, k] > PER_TOKEN_SLACK * per_token * knot[0, k]:
                own = min(own, knot[2, k])  # a token far dearer than at a smaller size: noise, until more say so
            knot[2, k] = own
            knot_i[1, k] = last
        per_token = min(per_token, fastest * knot[1, k] / knot[0, k])
        scratch[f + k] = cnt
        if cnt >= 2:
            top2, top = top, k
    over = _over_chord(knot, ratios, steps, knot_i, scratch, ctr, f, top, top2, n_knots, s, step, max_age)
    first = -1  # the smallest knot with fresh timings
    lo, lo2, hi = -1, -1, -1  # the knots timed twice lately nearest below k (two) and above it
    for k in range(n_knots):
        cnt = int(scratch[f + k])
        if cnt > 0 and first < 0:
            first = k
        if hi <= k:  # the next one above k: each knot is passed once over the whole loop
            hi = k + 1
            while hi < n_knots and scratch[f + hi] < 2:
                hi += 1
        near = _neighbours(knot, k, lo, lo2, hi, n_knots, s)
        if cnt >= 2:  # remembered as a deviation from what the neighbours say, not from the global scale:
            # where the prior shape is wrong, the global scale moves with which sizes were timed lately
            # (a CPU's code edits verify full drafts, its prose one token a step), the neighbours do not
            knot[3, k] = knot[2, k] / near
            lo2, lo = lo, k
            continue
        # One timing or none: with a pseudo-timing. That is what the neighbours say, times the knot's deviation
        # from them when it was last timed twice (fading, by half in log every 2 max_age steps).
        pseudo = near
        if knot_i[1, k] >= 0:
            pseudo = near * _faded(knot[3, k], knot_i[1, k], step, max_age)
        if k > top >= 0:
            pseudo = max(pseudo, near * over)
        scratch[0] = pseudo
        if cnt == 1:
            scratch[1] = _fresh_timing(ratios, steps, knot_i, k, step, max_age)
        knot[2, k] = _low_quantile(scratch, cnt + 1, q)
    # A step with more tokens never costs less.
    for k in range(1, n_knots):
        below = knot[1, k - 1] * knot[2, k - 1]
        if knot[1, k] * knot[2, k] < below:
            knot[2, k] = below / knot[1, k]
    # Below the smallest fresh knot, sizes not timed lately cost at least their share of that one's seconds
    # (a cost curve with an overhead is concave) and are assumed no dearer, so that a prior shape or a memory
    # that is wrong there (a burst that slowed only those steps) is found out by trying: no lock-in.
    if first > 0:
        c_first = knot[1, first] * knot[2, first]
        for k in range(first):
            bound = c_first * knot[0, k] / knot[0, first] / knot[1, k]
            if scratch[f + k] == 0 and bound < knot[2, k]:
                knot[2, k] = bound


@njit(cache=True, **NO_NRT)
def observe_cost(tokens, seconds, curve, index, knot, knot_i, ratios, steps, scale_buf, scratch, ctr, max_age, q):
    """One timed step (see StepCost.observe); returns whether the timing was taken."""
    ctr[_STEP] += 1
    if not (seconds > 0.0 and seconds < np.inf) or tokens < 1:  # also False for NaN
        return False
    top = curve.shape[1] - 1
    n = min(tokens, top)
    extra = (curve[0, top] - curve[0, top - 1]) * (tokens - top) if tokens > top else 0.0
    ratio = seconds / (curve[0, n] + extra)
    if not (ratio >= MIN_COST and ratio <= MAX_COST):
        return False
    _refresh(curve, index, knot, knot_i, ratios, steps, scale_buf, scratch, ctr, max_age, q, ratio, index[1, n])
    ctr[_TIMED] += 1
    return True


class StepCost:
    """Seconds of a step as a function of the tokens it verifies (see the module doc).

    Args:
        shape: the engine's cost curve: a callable from token counts (float64
            array) to costs (any unit, in [``MIN_COST``, ``MAX_COST``], not
            falling), or a float64 array ``[max_tokens + 1]`` (entry ``n``: ``n``
            tokens; entry 0 unused). Default :func:`cpu_like`.
        max_tokens: the most tokens a step verifies (rows x (K + 1)), at most
            ``MAX_STEP_TOKENS``; larger steps cost what the curve says at
            ``max_tokens``, extended along its last slope.
        window: the latest timings each knot keeps (>= 1).
        max_age: steps after which a timing no longer counts (>= 1).
        quantile: the low quantile of timings taken as the cost (0 to 0.5):
            timing noise only ever adds time.

    Raises:
        ValueError: a setting out of range, or a shape with a value that is not
            finite or outside [``MIN_COST``, ``MAX_COST``] (naming it).

    Attributes:
        shape: float64 [max_tokens + 1]: the curve (not falling).
        knots: float64: the token counts the correction is learnt at.
        knot_ratio: float64: the correction at each knot, as now learnt.
    """

    def __init__(self, shape: Any = None, *, max_tokens: int = 4096, window: int = 16, max_age: int = 64,
                 quantile: float = 0.25) -> None:
        self.max_tokens = check_count(max_tokens, "max_tokens")
        if self.max_tokens > MAX_STEP_TOKENS:
            raise ValueError(f"max_tokens must be at most {MAX_STEP_TOKENS} (step_cost.MAX_STEP_TOKENS: the model's "
                             f"tables grow with it), got {self.max_tokens}")
        self.window = check_count(window, "window")
        self.max_age = check_count(max_age, "max_age")
        if not (isinstance(quantile, (int, float)) and 0.0 <= quantile <= 0.5):
            raise ValueError(f"quantile must be a number in [0, 0.5], got {quantile!r}")
        self.quantile = float(quantile)
        n = np.arange(self.max_tokens + 1, dtype=np.float64)
        n[0] = 1.0
        if shape is None:
            shape = cpu_like
        table = np.asarray(shape(n) if callable(shape) else shape, dtype=np.float64)
        if table.shape != (self.max_tokens + 1,):
            raise ValueError(f"shape must give {self.max_tokens + 1} costs (0..max_tokens tokens), got {table.shape}")
        bad = ~((table[1:] >= MIN_COST) & (table[1:] <= MAX_COST))  # NaN too
        if bad.any():
            i = int(np.argmax(bad)) + 1
            raise ValueError(f"shape must be finite and in [{MIN_COST:g}, {MAX_COST:g}] at every token count, "
                             f"got {table[i]!r} at {i} tokens")
        table[0] = table[1]
        knots = knots_for(self.max_tokens)
        logk = np.log2(knots)
        pos = np.interp(np.log2(n), logk, np.arange(len(logk), dtype=np.float64))
        lo = np.minimum(pos.astype(np.int64), len(logk) - 2)
        n_knots, w = len(knots), self.window
        specs = {"curve": (np.float64, (2, self.max_tokens + 1)), "index": (np.int64, (2, self.max_tokens + 1)),
                 "knot": (np.float64, (4, n_knots)), "knot_i": (np.int64, (2, n_knots)),
                 "ratios": (np.float64, (n_knots, w)), "steps": (np.int64, (n_knots, w)),
                 "scale_buf": (np.float64, (SCALE_WINDOWS * w,)),
                 "scratch": (np.float64, (SCALE_WINDOWS * w + max(w + 1, n_knots),)), "ctr": (np.float64, (6,))}
        self._buffers, v = slab({name: specs[name] for name in _SLABS})
        self._curve, self._index, self._knot, self._knot_i = v["curve"], v["index"], v["knot"], v["knot_i"]
        self._ratios, self._steps, self._scale_buf, self._scratch, self._ctr = (
            v["ratios"], v["steps"], v["scale_buf"], v["scratch"], v["ctr"])
        self._curve[:] = (np.maximum.accumulate(table), pos - lo)  # a step with more tokens never costs less
        self._index[:] = (lo, np.rint(pos).astype(np.int64))
        self.shape = self._curve[0]
        self._knot[:] = (knots, np.interp(knots, np.arange(self.max_tokens + 1, dtype=np.float64), self.shape),
                         np.ones(n_knots), np.ones(n_knots))
        self.knots, self.knot_ratio = self._knot[0], self._knot[2]
        self._knot_i[1] = -1
        self._steps[:] = -1
        self._ctr[_SCALE] = self._ctr[_OVER] = 1.0
        self._ctr[_OVER_STEP] = -1.0
        self._state = (self._curve, self._index, self._knot, self._knot_i, self._ratios, self._steps,
                       self._scale_buf, self._scratch, self._ctr)

    @property
    def step(self) -> int:
        """Steps counted (timed or not): timings age by these."""
        return int(self._ctr[_STEP])

    @property
    def timed(self) -> int:
        """Timings taken."""
        return int(self._ctr[_TIMED])

    @property
    def scale(self) -> float:
        """The global scale: the lower quantile of the latest ratios of timings to the shape."""
        return float(self._ctr[_SCALE])

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The state a jitted caller passes on: ``(curve, index, knot, knot_i, ratios, steps, scale_buf,
        scratch, ctr)`` (see the comment above :func:`cost_of`)."""
        return self._state

    def slabs(self) -> tuple[np.ndarray, np.ndarray]:
        """The same state as two buffers, ``(float64, int64)``, for a call made every step
        (:func:`cost_arrays` unpacks them)."""
        return self._buffers[np.float64], self._buffers[np.int64]

    @classmethod
    def profile(cls, run_step: Callable[[int], Any], sizes: Sequence[int], *, repeats: int = 3,
                clock: Callable[[], float] = time.perf_counter, **kwargs: Any) -> StepCost:
        """Measure the shape up front: ``run_step(n)`` runs one step of ``n``
        tokens; each size of ``sizes`` is run ``repeats`` times, in a fixed
        order, and its minimum taken (the first runs of a cold process are
        slow; noise only adds time); sizes between are interpolated, sizes
        above extended along the last segment.

        Raises:
            ValueError: no sizes, a size below 1, or a step timed at 0 s or less.
        """
        sizes = sorted({check_count(s, "size") for s in sizes})
        if not sizes:
            raise ValueError("profile needs at least one size")
        repeats = check_count(repeats, "repeats")
        best = {s: math.inf for s in sizes}
        for _ in range(repeats):
            for s in sizes:
                t0 = clock()
                run_step(s)
                best[s] = min(best[s], clock() - t0)
        if not all(math.isfinite(v) and v > 0 for v in best.values()):
            raise ValueError(f"a profiled step took no time or an endless one: {best}")
        return cls.from_points(sizes, [best[s] for s in sizes], **kwargs)

    @classmethod
    def from_points(cls, sizes: Sequence[int], seconds: Sequence[float], **kwargs: Any) -> StepCost:
        """A cost on the curve through ``(sizes[i], seconds[i])`` (sizes increasing, seconds finite and
        > 0): interpolated between them, extended along the last segment above (flat below the first).

        Raises:
            ValueError: no points, sizes not increasing, or seconds not finite or outside
                [``MIN_COST``, ``MAX_COST``].
        """
        xs = np.asarray(sizes, dtype=np.float64)
        ys = np.asarray(seconds, dtype=np.float64)
        if xs.ndim != 1 or xs.shape != ys.shape or not len(xs) or np.any(np.diff(xs) <= 0):
            raise ValueError("sizes must be increasing and as many as seconds, at least one")
        if not np.all((ys >= MIN_COST) & (ys <= MAX_COST)):
            raise ValueError(f"seconds must be finite and in [{MIN_COST:g}, {MAX_COST:g}], got {ys.tolist()}")
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0

        def shape(n: np.ndarray) -> np.ndarray:
            return np.interp(n, xs, ys) + max(slope, 0.0) * np.maximum(n - xs[-1], 0.0)

        return cls(shape, **kwargs)

    def observe(self, tokens: int, seconds: float) -> bool:
        """One timed step of ``tokens`` tokens. Timings that are not finite
        and > 0 (a clock that did not move, or went back), or whose ratio to
        the shape is outside [``MIN_COST``, ``MAX_COST``], are ignored;
        returns whether the timing was taken.

        Raises:
            TypeError: ``seconds`` is not a real number (``None``, a bool, a string).
        """
        seconds = check_timing(seconds, "seconds")
        return bool(observe_cost(int(tokens), seconds, *self.arrays(), self.max_age, self.quantile))

    def refresh(self) -> None:
        """Recompute the correction (timings age by the steps :meth:`observe` counts)."""
        _refresh(*self.arrays(), self.max_age, self.quantile, 0.0, -1)

    def seconds(self, tokens: Any) -> Any:
        """Estimated seconds of a step of ``tokens`` tokens (int or int array), as now learnt."""
        t = np.asarray(tokens, dtype=np.int64)
        n = np.clip(t, 1, self.max_tokens)
        lo, w, kr = self._index[0][n], self._curve[1][n], self.knot_ratio
        r = (1 - w) * kr[lo] + w * kr[lo + 1]
        slope = self.shape[-1] - self.shape[-2]
        out = (self.shape[n] + slope * np.maximum(t - self.max_tokens, 0)) * r
        return float(out) if out.ndim == 0 else out
