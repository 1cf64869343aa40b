"""A workload as flat arrays, and what each drafter would get right at every output position.

Both simulators (``simulate.walk``, the acceptance walk; ``realsim.walk_real``,
the costed one) replay greedy speculative decoding over per-position arrays
built here:

* :class:`Flat`: every trace's output in one int32 array;
* :func:`sa_positions`: the SA's match length and accepted draft tokens at
  every output position, from one batched pass through ``SpecEngine.extend``
  (the SA's match and draft at a position depend only on the text before it,
  so one pass serves every selection policy and threshold);
* :func:`neural_positions`: the modeled neural drafter's accepted tokens,
  drawn per (seed, trace, position) so every policy sees the same draws;
* the selection modes the walks take (``NEURAL``, ``SA``, ``HYBRID``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from saspec import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from saspec import SpecEngine
from saspec.build import DEFAULT_RECENT_DEPTH

# selection modes of simulate.walk and realsim.walk_real
NEURAL, SA, HYBRID, ADAPTIVE, TREE, NONE = 0, 1, 2, 3, 4, 5


@dataclass
class Flat:
    """A workload's outputs as one flat int32 array: trace i is
    ``tokens[offsets[i]:offsets[i+1]]``. ``draft_runs``: int32, aligned with
    ``tokens``, a real draft model's accepted runs (``draft_runs.DraftRuns``)
    when every trace carries them for one model (``draft_model``), else None."""

    prompts: list[np.ndarray]
    tokens: np.ndarray
    offsets: np.ndarray
    draft_runs: np.ndarray | None = None
    draft_model: str | None = None

    @classmethod
    def of(cls, traces) -> Flat:
        outs = [np.asarray(t.output, dtype=np.int32) for t in traces]
        offsets = np.zeros(len(outs) + 1, dtype=np.int64)
        np.cumsum([len(o) for o in outs], out=offsets[1:])
        runs = [getattr(t, "draft_runs", None) for t in traces]
        models = {r.model for r in runs if r is not None}
        dr = dm = None
        if runs and all(r is not None for r in runs) and len(models) == 1:
            dr, dm = np.concatenate([r.runs.astype(np.int32) for r in runs]), models.pop()
        return cls([np.asarray(t.prompt, dtype=np.int32) for t in traces], np.concatenate(outs), offsets, dr, dm)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def extend_buffers(batch: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Zeroed int32 arrays for ``SpecEngine.extend`` over ``batch`` rows with ``k`` draft tokens:
    (accepted [batch, k + 1], accepted_lens [batch], match_len_out [batch], draft_out [batch, k])."""
    return (np.zeros((batch, k + 1), np.int32), np.zeros(batch, np.int32), np.zeros(batch, np.int32),
            np.zeros((batch, k), np.int32))


# -- per-position drafter quality ------------------------------------------------


@njit(cache=True)
def _record(drafts, mout, tokens, offs, t, match, accepted):
    """For every row still producing position t: store its match length and
    how many leading draft tokens equal the output from t on."""
    k = drafts.shape[1]
    for b in range(drafts.shape[0]):
        p, end = offs[b, 0] + t, offs[b, 1]
        if p >= end:
            continue
        a = 0
        while a < k and p + a < end and drafts[b, a] == tokens[p + a]:
            a += 1
        accepted[p] = a
        match[p] = mout[b]


@njit(cache=True)
def _record_width(drafts, offs, t, ndraft):
    """For every row still producing position t: how many leading draft tokens are valid (before the first -1)."""
    k = drafts.shape[1]
    for b in range(drafts.shape[0]):
        p = offs[b, 0] + t
        if p < offs[b, 1]:
            n = 0
            while n < k and drafts[b, n] >= 0:
                n += 1
            ndraft[p] = n


@njit(cache=True)
def _next_tokens(tokens, offs, t, acc, lens):
    """Load output token t of every row into acc[:, 0] (lens 1), or lens 0 past its end."""
    for b in range(lens.shape[0]):
        p = offs[b, 0] + t
        if p < offs[b, 1]:
            acc[b, 0] = tokens[p]
            lens[b] = 1
        else:
            lens[b] = 0


def sa_positions(
    flat: Flat, k: int, occurrence: str, recent_depth: int = DEFAULT_RECENT_DEPTH, ndraft: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Match length and accepted draft tokens at every output position.

    Feeds all traces' outputs one token per ``SpecEngine.extend`` call, the
    batch being every trace still producing output (longest first, re-prepared
    as the batch halves). Returns (match, accepted), int32 arrays aligned with
    ``flat.tokens``. ``ndraft``, if given (int32, aligned the same way), gets
    each position's number of valid draft tokens (before the first -1).
    """
    # Serial: the steps are short and the simulator should not fight other work for cores.
    eng = SpecEngine(occurrence=occurrence, recent_depth=recent_depth, parallel_threshold=2**31)
    order = np.argsort(-flat.lengths, kind="stable")
    for i in order:
        eng.add_request(int(i), flat.prompts[i])
    lengths = flat.lengths[order]
    starts = flat.offsets[:-1][order]
    ends = flat.offsets[1:][order]
    match = np.zeros(flat.tokens.shape[0], np.int32)
    accepted = np.zeros(flat.tokens.shape[0], np.int32)
    b = 0
    for t in range(int(lengths.max(initial=0))):
        live = int(np.searchsorted(-lengths, -t, side="left"))  # rows with length > t
        if b == 0 or live <= b // 2:
            b = live
            eng.prepare(order[:b].tolist())
            acc, lens, mout, dout = extend_buffers(b, k)
            offs = np.stack([starts[:b], ends[:b]], axis=1)
            if t > 0:  # the new batch continues from the previous token
                _next_tokens(flat.tokens, offs, t - 1, acc, lens)
        eng.extend(acc, lens, mout, dout)  # drafts for position t
        _record(dout, mout, flat.tokens, offs, t, match, accepted)
        if ndraft is not None:
            _record_width(dout, offs, t, ndraft)
        _next_tokens(flat.tokens, offs, t, acc, lens)
    return match, accepted


def neural_positions(flat: Flat, p: tuple[float, ...], seed: int) -> np.ndarray:
    """Accepted tokens of the modeled neural drafter at every output position:
    the number of leading draft positions i with u[i] < p[i], u ~ U(0,1) drawn
    per (seed, trace, position). int32, aligned with ``flat.tokens``."""
    out = np.empty(flat.tokens.shape[0], np.int32)
    probs = np.asarray(p, dtype=np.float64)
    for i in range(len(flat.prompts)):
        s, e = flat.offsets[i], flat.offsets[i + 1]
        u = np.random.default_rng([seed, i]).random((e - s, probs.size))
        ok = u < probs
        out[s:e] = np.where(ok.all(axis=1), probs.size, ok.argmin(axis=1))
    return out
