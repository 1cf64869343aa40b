"""Select: the hybrid draft choice, per row, between a neural drafter and the SA.

Row ``b`` uses the suffix-automaton draft when its match is at least
``threshold`` tokens long (and not 0: a row without a match has no SA draft),
else the neural draft::

    drafts, use_sa = select_drafts(neural, sa_drafts, match_len, threshold=4)

``select_drafts`` is a torch op: element-wise, no host sync and no
data-dependent Python branching, so it runs on CPU or CUDA tensors and can be
captured in ``torch.cuda.graph``. ``select_drafts_np`` is the same in numpy
(for the simulator). ``threshold=float('inf')`` never uses the SA.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from numba import njit


def _check(neural: Any, sa: Any, match_len: Any) -> None:
    if neural.ndim != 2:
        raise ValueError(f"neural must be 2-D [B, K], got shape {tuple(neural.shape)}")
    if tuple(sa.shape) != tuple(neural.shape):
        raise ValueError(f"sa must have the shape of neural {tuple(neural.shape)}, got {tuple(sa.shape)}")
    if tuple(match_len.shape) != (neural.shape[0],):
        raise ValueError(f"match_len must have shape ({neural.shape[0]},), got {tuple(match_len.shape)}")


def _count(value: Any, name: str) -> int:
    """``value`` (an int, or a float with a whole value; not a bool) as an int
    >= 1; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _check_int_tensor(t: Any, name: str) -> None:
    """``ValueError`` unless torch tensor ``t`` holds integers (not bool)."""
    import torch

    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers, got dtype {t.dtype}")


def _scalar_floor(threshold: Any) -> int | None:
    """The smallest match length a scalar threshold accepts (at least 1), as a
    Python int, or ``None`` when it accepts none (``+inf``).

    Integers are used exactly (no float rounding, no fixed-width wrap); floats
    are rounded up. Raises ``ValueError`` for NaN and ``TypeError`` for
    anything that is not a real number (bool counts as an int).
    """
    if isinstance(threshold, np.ndarray) and threshold.ndim == 0:
        threshold = threshold.item()
    if isinstance(threshold, numbers.Integral):
        return max(1, int(threshold))
    if not isinstance(threshold, numbers.Real):
        raise TypeError(f"threshold must be a real number or an array/tensor, got {type(threshold).__name__}")
    value = float(threshold)
    if math.isnan(value):
        raise ValueError("threshold must not be NaN")
    if math.isinf(value):
        return None if value > 0 else 1
    return max(1, math.ceil(value))


def _never(lo: int | None, top: float) -> bool:
    """True when no match length up to ``top`` reaches the floor ``lo``."""
    return lo is None or lo > top


def select_drafts(neural: Any, sa: Any, match_len: Any, threshold: Any) -> tuple[Any, Any]:
    """Choose each row's draft: SA where ``match_len >= threshold`` and
    ``match_len > 0``, neural elsewhere.

    Args:
        neural: integer tensor [B, K], the neural drafter's tokens.
        sa: integer tensor [B, K], the engine's ``draft_out``.
        match_len: integer tensor [B], the engine's ``match_len_out`` (tokens).
        threshold: minimum match length in tokens: a real number (Python or
            numpy int/float, compared exactly at any magnitude; NaN is
            rejected), or a 0-d or [B] tensor on the device of ``match_len``
            (then a CUDA graph replay picks up its current value).
            ``float('inf')`` disables the SA.

    Returns:
        ``(drafts, use_sa)``: drafts [B, K], the dtype torch promotes
        ``neural`` and ``sa`` to, on their device; use_sa bool [B].
    """
    import torch

    _check(neural, sa, match_len)
    _check_int_tensor(match_len, "match_len")
    if isinstance(threshold, torch.Tensor):
        if threshold.device != match_len.device:
            raise ValueError(f"threshold must be on match_len's device ({match_len.device}), got {threshold.device}")
        if threshold.dim() > 1 or (threshold.dim() == 1 and tuple(threshold.shape) != (neural.shape[0],)):
            raise ValueError(f"threshold must be 0-d or [{neural.shape[0]}], got shape {tuple(threshold.shape)}")
        use_sa = (match_len >= threshold) & (match_len > 0)
    else:
        # Compare with the floor only where it fits match_len's dtype: torch
        # would wrap a larger Python int to the dtype's width.
        lo = _scalar_floor(threshold)
        dt = match_len.dtype
        top = torch.iinfo(dt).max if not (dt.is_floating_point or dt.is_complex or dt == torch.bool) else math.inf
        if _never(lo, top):
            use_sa = torch.zeros(match_len.shape, dtype=torch.bool, device=match_len.device)
        else:
            use_sa = match_len >= lo
    return torch.where(use_sa.unsqueeze(1), sa, neural), use_sa


def select_drafts_np(
    neural: np.ndarray, sa: np.ndarray, match_len: np.ndarray, threshold: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``select_drafts`` for numpy arrays: the same shapes, dtypes (numpy
    promotion) and rule; ``threshold`` a number or a [B] array."""
    neural, sa, match_len = np.asarray(neural), np.asarray(sa), np.asarray(match_len)
    _check(neural, sa, match_len)
    if np.ndim(threshold) == 0:
        lo = _scalar_floor(threshold)
        top = np.iinfo(match_len.dtype).max if match_len.dtype.kind in "iu" else math.inf
        use_sa = np.zeros(match_len.shape, bool) if _never(lo, top) else match_len >= lo
    else:
        threshold = np.asarray(threshold)
        if threshold.shape != match_len.shape:
            raise ValueError(f"threshold must be a number or have shape {match_len.shape}, got {threshold.shape}")
        use_sa = (match_len >= threshold) & (match_len > 0)
    return np.where(use_sa[:, None], sa, neural), use_sa


# -- the adaptive rule -------------------------------------------------------------
#
# Pick the source with the higher expected accepted length. For the SA it is the
# mean acceptance seen so far at this match-length bucket (all requests), scaled
# by how this request's SA drafts fared against that mean recently; for the
# neural drafter, this request's recent acceptance. After each verification the
# accepted tokens are known, so both sources' drafts are scored against them
# (an acceptance equal to the known length is a lower bound, used as is).
# The simulator (``simulate.walk``) and ``AdaptiveSelector`` share these helpers.

N_BUCKETS = 16


@njit(cache=True)
def match_bucket(m):
    """Bucket of a match length: 0..7 exactly, then one per doubling up to 15."""
    if m < 8:
        return m
    b = 8
    v = 16
    while m >= v and b < N_BUCKETS - 1:
        b += 1
        v *= 2
    return b


@njit(cache=True)
def adaptive_init(g_sum, g_cnt, k):
    """Prior for the per-bucket SA statistics (one pseudo-observation each): a
    match of length m predicts about min(m, k) / 2 accepted tokens, m the
    bucket's smallest match (see ``match_bucket``)."""
    for i in range(N_BUCKETS):
        m = i if i < 8 else 2 ** (i - 5)
        g_sum[i] = min(k, max(1, m)) * 0.5
        g_cnt[i] = 1.0


@njit(cache=True)
def adaptive_prefers_sa(g_sum, g_cnt, sa_ratio, nn_recent, m):
    """True when the SA's expected acceptance at match length m beats the neural one."""
    if m <= 0:
        return False
    b = match_bucket(m)
    return sa_ratio * g_sum[b] / g_cnt[b] > nn_recent


@njit(cache=True)
def adaptive_observe(g_sum, g_cnt, sa_ratio, nn_recent, m, sa_accepted, nn_accepted):
    """Update the statistics with one step's scored drafts; return the
    request's new (sa_ratio, nn_recent)."""
    if m > 0:
        b = match_bucket(m)
        expect = g_sum[b] / g_cnt[b]
        g_sum[b] += sa_accepted
        g_cnt[b] += 1.0
        sa_ratio = 0.7 * sa_ratio + 0.3 * (sa_accepted + 0.5) / (expect + 0.5)
    return sa_ratio, 0.8 * nn_recent + 0.2 * nn_accepted


def _same_rows(request_ids: Any, **per_row: Any) -> None:
    """``ValueError`` unless every ``per_row`` argument has ``len(request_ids)`` rows."""
    b = len(request_ids)
    for name, x in per_row.items():
        if len(x) != b:
            raise ValueError(f"{name} has {len(x)} rows, expected {b} (one per request id)")


def _prefix_len(draft: np.ndarray, verified: np.ndarray) -> int:
    n = min(draft.shape[0], verified.shape[0])
    miss = np.flatnonzero(draft[:n] != verified[:n])
    return int(miss[0]) if miss.size else n


class AdaptiveSelector:
    """Host-side adaptive choice between SA and neural drafts, per request.

    In the simulator it matches the best fixed threshold on every workload
    within 1% without tuning (see BENCHMARKS.md).

    Args:
        k: draft tokens per step.
        neural_prior: expected accepted tokens of the neural drafter before
            any observation (e.g. its measured mean).
    """

    def __init__(self, k: int, neural_prior: float = 2.0) -> None:
        self.k = _count(k, "k")
        self.neural_prior = float(neural_prior)
        self._g_sum = np.zeros(N_BUCKETS)
        self._g_cnt = np.zeros(N_BUCKETS)
        adaptive_init(self._g_sum, self._g_cnt, self.k)
        self._req: dict[Any, tuple[float, float]] = {}

    def _state(self, rid: Any) -> tuple[float, float]:
        return self._req.get(rid, (1.0, self.neural_prior))

    def choose(self, request_ids: Any, match_len: np.ndarray) -> np.ndarray:
        """bool [B]: row b should use the SA draft."""
        _same_rows(request_ids, match_len=match_len)
        return np.array(
            [adaptive_prefers_sa(self._g_sum, self._g_cnt, *self._state(r), int(m)) for r, m in zip(request_ids, match_len)],
            dtype=bool,
        )

    def observe(self, request_ids: Any, match_len: np.ndarray, sa_drafts: np.ndarray, neural_drafts: np.ndarray,
                verified: list[np.ndarray]) -> None:
        """Score both drafts of each row against ``verified[b]``, the tokens the
        target produced this step (accepted drafts plus its own token).
        All five arguments have B rows (``ValueError`` otherwise, nothing updated)."""
        _same_rows(request_ids, match_len=match_len, sa_drafts=sa_drafts, neural_drafts=neural_drafts,
                   verified=verified)
        for b, r in enumerate(request_ids):
            o_sa = _prefix_len(np.asarray(sa_drafts[b]), verified[b])
            o_nn = _prefix_len(np.asarray(neural_drafts[b]), verified[b])
            self._req[r] = adaptive_observe(self._g_sum, self._g_cnt, *self._state(r), int(match_len[b]), o_sa, o_nn)

    def remove(self, request_id: Any) -> None:
        """Forget a finished request's statistics."""
        self._req.pop(request_id, None)


# -- draft length that follows confidence -------------------------------------------
#
# The SA's match length is its confidence: a long match usually continues far, a
# match of one or two tokens rarely does, and every drafted token is verified by
# the target (which costs compute once the batch is large). These rules give each
# row a draft length from its match length (and, optionally, from how much it
# accepted at its previous step). ``simulate`` evaluates them under the cost model
# (``saspec simulate``'s "draft length rules" table); the scalar ``draft_length``
# is what its walks call, ``draft_lengths`` the per-row op for an engine.

DRAFT_LENGTH_RULES = ("fixed", "per-match", "per-match-recent")
#: The rule and scale ``draft_lengths`` uses by default (see BENCHMARKS.md, "draft length").
DEFAULT_LENGTH_RULE = "per-match"
DEFAULT_LENGTH_SCALE = 2.0


@njit(cache=True)
def draft_length(m, k_max, rule, scale, last):
    """Draft tokens to propose for one row (int, 0..k_max).

    ``m``: the row's match length (tokens); ``k_max``: the most draft tokens;
    ``rule``: index into :data:`DRAFT_LENGTH_RULES`; ``scale``: tokens per
    matched token; ``last``: the draft tokens the row accepted at its previous
    step, or -1 when unknown. 0 where ``m <= 0`` (no draft); otherwise

    * fixed: ``k_max``;
    * per-match: ``min(k_max, ceil(scale * m))``, at least 1;
    * per-match-recent: per-match, also at most ``2 * last + 2`` when
      ``last >= 0`` (a row that just missed drafts 2; a copy that keeps being
      accepted doubles its length every step).
    """
    if m <= 0 or k_max <= 0:
        return 0
    if rule == 0:
        return k_max
    x = scale * m
    n = k_max if x >= k_max else int(math.ceil(x))  # compared as a float: a huge product must not overflow an int
    if rule == 2 and last >= 0:
        n = min(n, 2 * last + 2)
    return max(n, 1)


def check_length_rule(rule: str, scale: float) -> int:
    """Validate a draft-length rule and its scale; return the rule's index
    into :data:`DRAFT_LENGTH_RULES` (what :func:`draft_length` takes).

    Raises ``ValueError`` naming the problem: an unknown rule, or a scale
    that is not a finite number > 0 (``fixed`` ignores its scale).
    """
    try:
        r = DRAFT_LENGTH_RULES.index(rule)
    except ValueError:
        raise ValueError(f"unknown draft-length rule {rule!r}; choose from {', '.join(DRAFT_LENGTH_RULES)}") from None
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}") from None
    if r != 0 and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale}")
    return r


def draft_lengths(match_len: Any, k_max: int, rule: str = DEFAULT_LENGTH_RULE, scale: float = DEFAULT_LENGTH_SCALE,
                  last_accepted: Any = None) -> Any:
    """Per-row draft lengths from match lengths (see :func:`draft_length`).

    Args:
        match_len: integer array [B] (numpy, or a torch tensor on any device):
            the engine's ``match_len_out``, in tokens.
        k_max: the most draft tokens per row (the engine's K), >= 1.
        rule: one of :data:`DRAFT_LENGTH_RULES`.
        scale: draft tokens per matched token (> 0; unused by ``fixed``).
        last_accepted: for ``per-match-recent``: integer array [B] like
            ``match_len``, each row's accepted draft tokens at its previous
            step, -1 where unknown (a new row). Ignored by the other rules.

    Returns:
        int32 [B] in ``[0, k_max]``, 0 exactly where ``match_len <= 0``; a torch
        tensor on ``match_len``'s device for torch input (element-wise ops only:
        no host sync, capturable in a CUDA graph), numpy otherwise. Row ``b``
        should verify only ``draft_out[b, :lengths[b]]``
        (:func:`truncate_drafts` blanks the rest with -1).
    """
    r = check_length_rule(rule, scale)
    k_max = _count(k_max, "k_max")
    scale = float(scale)
    if not type(match_len).__module__.startswith("torch"):
        match_len = np.asarray(match_len)
        if last_accepted is not None:
            last_accepted = np.asarray(last_accepted)
    if len(tuple(match_len.shape)) != 1:
        raise ValueError(f"match_len must be 1-D [B], got shape {tuple(match_len.shape)}")
    if r == 2 and last_accepted is None:
        raise ValueError("rule 'per-match-recent' needs last_accepted ([B], -1 where unknown)")
    if r == 2 and tuple(last_accepted.shape) != tuple(match_len.shape):
        raise ValueError(f"last_accepted must have shape {tuple(match_len.shape)}, got {tuple(last_accepted.shape)}")
    if type(match_len).__module__.startswith("torch"):
        import torch

        _check_int_tensor(match_len, "match_len")
        m = match_len.to(torch.int64)
        if r == 0:
            n = torch.full_like(m, k_max)
        else:
            n = torch.ceil(m.to(torch.float64) * scale).clamp(1, k_max).to(torch.int64)
            if r == 2:
                last = last_accepted.to(device=m.device, dtype=torch.int64)
                n = torch.where(last >= 0, torch.minimum(n, 2 * last + 2), n).clamp(min=1)
        return torch.where(m > 0, n, torch.zeros_like(n)).to(torch.int32)
    m = np.asarray(match_len)
    if not np.issubdtype(m.dtype, np.integer):
        raise ValueError(f"match_len must hold integers, got dtype {m.dtype}")
    m = m.astype(np.int64)
    if r == 0:
        n = np.full_like(m, k_max)
    else:
        n = np.clip(np.ceil(m.astype(np.float64) * scale), 1, k_max).astype(np.int64)
        if r == 2:
            last = np.asarray(last_accepted).astype(np.int64)
            n = np.maximum(np.where(last >= 0, np.minimum(n, 2 * last + 2), n), 1)
    return np.where(m > 0, n, 0).astype(np.int32)


def truncate_drafts(drafts: Any, lengths: Any, fill: int = -1) -> Any:
    """``drafts`` [B, K] with entries at column >= ``lengths[b]`` set to ``fill``
    (a new array/tensor; torch: element-wise, no host sync)."""
    if drafts.ndim != 2 or tuple(lengths.shape) != (drafts.shape[0],):
        raise ValueError(f"drafts must be [B, K] and lengths [B], got {tuple(drafts.shape)} and {tuple(lengths.shape)}")
    if type(drafts).__module__.startswith("torch"):
        import torch

        cols = torch.arange(drafts.shape[1], device=drafts.device)
        keep = cols.unsqueeze(0) < lengths.to(drafts.device).unsqueeze(1)
        return torch.where(keep, drafts, torch.full_like(drafts, fill))
    drafts = np.asarray(drafts)
    keep = np.arange(drafts.shape[1])[None, :] < np.asarray(lengths)[:, None]
    return np.where(keep, drafts, np.asarray(fill, drafts.dtype))


# -- drafting only where it pays -----------------------------------------------------
#
# A step that verifies d draft tokens costs a forward over d + 1 tokens,
# ``verify_cost[d]`` in units of a plain 1-token forward, plus ``d * draft_cost``
# to make the drafts (0 for the SA). If each draft token is accepted with
# probability q given the ones before it, the step emits on average
# 1 + q + q^2 + ... + q^d tokens (the target's own token always counts), while
# plain decoding emits 1 per unit. So draft the d with the most tokens per unit
# of time, and nothing where no d beats 1. On a GPU at small batch verify_cost
# is nearly flat and every draft pays; on a CPU it can grow by a whole forward
# per token (bf16 without native bf16 matmuls) and no draft pays.


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


def _cost_bucket(n: int) -> int:
    """Bucket of a forward over ``n`` tokens: 0 for 1, then 2, 3-4, 5-8, ... (powers of two)."""
    return (n - 1).bit_length()


class CostGate:
    """Chooses, for one sequence and each step, the draft source and length
    that make the most tokens per second, or no draft (see
    :func:`best_draft_length`).

    It learns both sides while the sequence runs:

    * costs: the caller reports each target forward (``observe_forward``)
      and each draft-model forward (``observe_draft_forward``), in seconds.
      Forwards are bucketed by size (1, 2, 3-4, 5-8, ... tokens), and a
      bucket's cost is the fastest of its last ``window`` forwards: timing
      noise only ever adds time (a busy machine, a first call of a shape),
      and one slow forward must not steer a whole output. Sizes timed at
      least twice set the *cost line* ``1 + slope * (n - 1)``, ``slope`` the
      steepest of them per extra token (``slope_prior`` before any). A size
      timed once costs no more than the line (a slow first timing is tried
      again, and the second settles it); a size not timed yet costs the
      line, capped by the next larger size timed; a larger size never costs
      less than a smaller. ``verify_cost`` fixes the table instead (float
      [>= k_max + 1], units of a 1-token forward; nothing is timed).
    * acceptance: per-token acceptance of SA drafts per match-length bucket
      (:func:`match_bucket`), and of the draft model, each a running count
      with ``prior_weight`` pseudo-tokens of prior: ``m / (m + 1)`` for an SA
      match of ``m`` tokens (0.5 at 1, 0.9 at 9: about what chat shows; code
      edits run much higher), ``model_prior`` for the draft model.

    Until a 1-token forward has been timed, ``choose`` asks for one plain
    step (nothing else gives the unit of cost). Then, until two multi-token
    forwards have been timed, it asks for a *probe*: ``("probe", 1)``, a
    one-token draft of whatever costs nothing (the SA's first draft token,
    else any guess), so that the verify cost is known before a dear draft
    (the draft model's first call feeds it the whole prompt) is started.
    A probe costs about a plain step; two of them keep one slow first
    timing from setting the cost line.

    Args:
        k_max: the most draft tokens of any source (>= 1).
        draft_cost: fixed cost of one draft-model token (units of a 1-token
            target forward) instead of timing it; needs ``verify_cost``.
        window: how many of a bucket's latest forwards its cost is the
            fastest of (>= 1).
    """

    SOURCES = ("sa", "draft")

    def __init__(self, k_max: int, *, verify_cost: Any = None, draft_cost: float | None = None,
                 slope_prior: float = 0.1, model_prior: float = 0.8, prior_weight: float = 8.0,
                 window: int = 4) -> None:
        k_max = _count(k_max, "k_max")
        window = _count(window, "window")
        for name, v, lo, hi in (("slope_prior", slope_prior, 0.0, math.inf), ("model_prior", model_prior, 0.0, 1.0),
                                ("prior_weight", prior_weight, 0.0, math.inf)):
            if not (lo <= float(v) <= hi) or (name == "prior_weight" and v == 0):
                low = "(0" if name == "prior_weight" else f"[{lo}"
                raise ValueError(f"{name} must be in {low}, {hi}], got {v}")
        self.k_max = k_max
        self.slope_prior, self.window = float(slope_prior), window
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
        # per bucket, the latest `window` forwards as (seconds, tokens), inf = none yet
        self._recent = np.full((n_buckets, window, 2), np.inf)
        self._seen = np.zeros(n_buckets, np.int64)  # forwards timed per bucket
        self._recent_draft = np.full(window, np.inf)
        self._draft_seen = 0
        m = np.arange(N_BUCKETS, dtype=np.float64)
        m[8:] = 2.0 ** (np.arange(8, N_BUCKETS) - 5)  # a bucket's smallest match: 8, 16, 32, ...
        q0 = m / (m + 1.0)
        self._sa_hits, self._sa_misses = prior_weight * q0, prior_weight * (1 - q0)
        self._nn_hits, self._nn_misses = prior_weight * model_prior, prior_weight * (1 - model_prior)

    # -- costs --

    def observe_forward(self, n_tokens: int, seconds: float) -> None:
        """A target forward over ``n_tokens`` tokens took ``seconds``
        (forwards larger than the biggest verify, ``k_max + 1`` tokens, like a
        prefill, are ignored; with a fixed ``verify_cost`` only 1-token
        forwards are timed, the unit ``draft_cost`` needs)."""
        b = _cost_bucket(n_tokens) if 1 <= n_tokens <= self.k_max + 1 else -1
        if not 0 <= b < self._seen.shape[0] or not seconds > 0 or (self._fixed and b != 0):
            return
        self._recent[b, self._seen[b] % self.window] = (seconds, n_tokens)
        self._seen[b] += 1

    def observe_draft_forward(self, seconds: float) -> None:
        """One draft-model forward (one draft token) took ``seconds``."""
        if seconds > 0:
            self._recent_draft[self._draft_seen % self.window] = seconds
            self._draft_seen += 1

    def _fastest(self, b: int) -> tuple[float, float]:
        """(seconds, tokens) of bucket ``b``'s fastest recent forward."""
        i = int(np.argmin(self._recent[b, :, 0]))
        return float(self._recent[b, i, 0]), float(self._recent[b, i, 1])

    @property
    def timed(self) -> bool:
        """Whether the unit of cost (a 1-token forward) is known."""
        return self._fixed or self._seen[0] > 0

    @property
    def probed(self) -> bool:
        """Whether two multi-token forwards have been timed (or the costs are fixed)."""
        return self._fixed or int(self._seen[1:].sum()) >= 2

    def verify_cost(self) -> np.ndarray:
        """float64 [k_max + 1]: the cost of verifying d drafts (a forward over
        d + 1 tokens), units of a 1-token forward, as currently estimated."""
        if self._fixed:
            return self._verify
        out = np.ones(self.k_max + 1)
        if self._seen[0] == 0:
            return out + self.slope_prior * np.arange(self.k_max + 1)
        t1 = self._fastest(0)[0]
        ratio, slopes = {}, []
        for b in range(1, self._seen.shape[0]):
            if self._seen[b]:
                t, n = self._fastest(b)
                ratio[b] = t / t1
                if self._seen[b] >= 2:
                    slopes.append((ratio[b] - 1.0) / max(n - 1.0, 1.0))
        slope = max(max(slopes, default=self.slope_prior), 0.0)
        above = math.inf  # an unseen size costs no more than the next larger size seen
        for d in range(self.k_max, 0, -1):
            b = _cost_bucket(d + 1)
            line = 1.0 + slope * d
            if b not in ratio:
                out[d] = min(line, above)
            else:
                out[d] = ratio[b] if self._seen[b] >= 2 else min(ratio[b], line)
                above = out[d]
        return np.maximum.accumulate(out)

    def draft_cost(self) -> float:
        """Cost of one draft-model token, units of a 1-token target forward
        (0.5 until both are timed)."""
        if self._draft_cost is not None:
            return self._draft_cost
        if self._draft_seen == 0 or self._seen[0] == 0:
            return 0.5
        return float(self._recent_draft.min()) / self._fastest(0)[0]

    # -- acceptance --

    def q(self, source: str, match: int = 0) -> float:
        """Estimated per-token acceptance of ``source``'s drafts ("sa" at a
        match of ``match`` tokens, or "draft")."""
        if source == "sa":
            b = match_bucket(max(int(match), 0))
            return self._sa_hits[b] / (self._sa_hits[b] + self._sa_misses[b])
        if source == "draft":
            return self._nn_hits / (self._nn_hits + self._nn_misses)
        raise ValueError(f"unknown source {source!r}; choose from {', '.join(self.SOURCES)}")

    def observe(self, source: str, match: int, drafted: int, accepted: int) -> None:
        """A step verified ``drafted`` tokens from ``source`` (made at a match
        of ``match`` tokens for the SA) and accepted the first ``accepted``."""
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

    # -- the choice --

    def choose(self, match: int, sa_len: int, model_k: int = 0) -> tuple[str, int]:
        """``(source, length)`` for this step: "sa" with up to ``sa_len``
        tokens (what the automaton offers at a match of ``match``), "draft"
        with up to ``model_k`` draft-model tokens (0: no draft model), or
        ``("none", 0)`` where no draft is expected to beat a plain step, or
        ``("probe", 1)`` (see the class doc)."""
        if not self.timed:
            return "none", 0
        if not self.probed:
            return "probe", 1
        vc = self.verify_cost()
        best = ("none", 0, 1.0)
        if sa_len > 0 and match > 0:
            d, g = best_draft_length(self.q("sa", match), min(sa_len, self.k_max), vc, 0.0)
            if g > best[2]:
                best = ("sa", d, g)
        if model_k > 0:
            d, g = best_draft_length(self.q("draft"), min(model_k, self.k_max), vc, self.draft_cost())
            if g > best[2]:
                best = ("draft", d, g)
        return best[0], best[1]
