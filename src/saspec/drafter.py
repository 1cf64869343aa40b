"""Drafter: the whole drafting step of one inference engine, behind three calls.

::

    with Drafter(k=32, device="cpu") as drafter:
        drafter.start("a", prompt_ids, options={"max_draft_tokens": 8})  # while the engine prefills "a"
        batch = drafter.step(["a", "b"], new_tokens, new_lens)          # after every forward
        # verify batch.tokens[b, :batch.lengths[b]] for each row b ...
        drafter.finish("a")                                              # finished or aborted

An engine instance holds one ``Drafter``. It keeps everything a drafting step
needs besides the engine's own tensors: each request's automaton
(:class:`~saspec.request_drafts.RequestDrafts`, built on a background thread
while the engine prefills), the cross-request pool of finished texts, the
drafting policy (:class:`~saspec.policy.DraftPolicy`: how many tokens each row
drafts, and from which source, for the most tokens per second of the step),
the last step's offers (scored against the tokens that followed), the step's
timing, a neural drafter's acceptance and each request's
:class:`~saspec.options.DraftOptions`. The caller hands over what the forward
produced and gets each row's draft; it keeps no policy state of its own.

A step's forward is timed by the drafter's clock from the return of one
:meth:`Drafter.step` to the next call (the engine's forward and bookkeeping in
between); an engine that times its forward itself passes ``seconds``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernel below)
from numba import njit

from .engine import SpecEngine
from .options import DEFAULT_OPTIONS, DraftOptions, parse_options
from .policy import AUTOMATON, NEURAL, NONE, CatchUpShare, Decision, DraftPolicy, PolicySettings, StepCost
from .pool import RequestPool
from .request_drafts import RequestDrafts
from .rules import DRAFT_LENGTH_RULES
from .step_cost import MAX_STEP_TOKENS
from .validate import as_tokens, check_count, check_int

logger = logging.getLogger(__name__)

#: ``length_rule`` value (the default) that sizes drafts with the drafting policy.
POLICY = "policy"
#: Under a fixed length rule, rows whose match is shorter than this draft nothing by default. The policy
#: weighs every match the automaton offers on its evidence (a minimum match of 1).
DEFAULT_MIN_MATCH = 2
#: The most rows of a step the cost model is sized for when the caller does not say.
DEFAULT_MAX_ROWS = 256


_I32 = np.dtype(np.int32)


@njit(nogil=True, cache=True)
def _finish_rows(draft, lengths, sources, derive, match, lens, caps, any_cap, k, tokens, rows):
    """A step's :class:`DraftBatch` arrays for its B rows: ``tokens[b]`` row b's ``draft`` up to its length where
    its source is AUTOMATON, -1 after and elsewhere; ``rows[:, b]``: its length; its source (with ``derive``:
    AUTOMATON where its length is > 0, else NONE; else ``sources[b]``); its ``match`` (0 where ``lens[b]`` is
    0); its cap (``max(caps[b], 0)`` with ``any_cap``, else ``k``). Returns (rows drafted for, draft tokens,
    the longest draft, rows of the neural drafter)."""
    width = draft.shape[1]
    drafted = total = longest = neural = 0
    for i in range(draft.shape[0]):
        n = lengths[i]
        s = (AUTOMATON if n > 0 else NONE) if derive else sources[i]
        cut = min(max(n, 0), width) if s == AUTOMATON else 0
        for j in range(cut):
            tokens[i, j] = draft[i, j]
        for j in range(cut, width):
            tokens[i, j] = -1
        rows[0, i] = n
        rows[1, i] = s
        rows[2, i] = match[i] if lens[i] > 0 else 0
        rows[3, i] = max(caps[i], 0) if any_cap else k
        if n != 0:
            drafted += 1
            total += n
            longest = max(longest, n)
        if s == NEURAL:
            neural += 1
    return drafted, total, longest, neural


@dataclass(frozen=True)
class DraftBatch:
    """One step's drafts, row ``b`` for the step's ``request_ids[b]``. Views into buffers the next
    :meth:`Drafter.step` overwrites (copy what must outlive it).

    Attributes:
        tokens: int32 [B, K]: row ``b``'s automaton draft in ``tokens[b, :lengths[b]]`` where
            ``sources[b] == AUTOMATON``; -1 elsewhere (a neural row's tokens are its drafter's).
        lengths: int32 [B]: draft tokens per row (0: none).
        sources: int32 [B]: ``saspec.policy.NONE`` (0), ``AUTOMATON`` (1) or ``NEURAL`` (2).
        match: int32 [B]: each row's match length in tokens (0 for rows that appended nothing).
        neural_k: the most tokens the neural drafter makes for a row this step (0: do not run it).
        max_lengths: int32 [B]: the most draft tokens row ``b`` may take this step from any source (its
            request's ``max_draft_tokens``, K without one; 0 where its drafting is off).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    sources: np.ndarray
    match: np.ndarray
    neural_k: int
    max_lengths: np.ndarray

    def row(self, b: int) -> list[int]:
        """Row ``b``'s automaton draft as a list (empty for other sources)."""
        return self.tokens[b, : self.lengths[b]].tolist() if self.sources[b] == AUTOMATON else []


class Drafter:
    """The drafting session of one engine instance (see the module doc).

    Args:
        k: the most draft tokens of a row (>= 1).
        device: the engine's device type: ``"cpu"`` (a step costs about its token count) or any
            other (a GPU: a step's cost is flat up to a knee); the policy's prior cost shape.
        length_rule: ``"policy"`` (default): each row's length and source from the drafting policy;
            or a fixed rule of ``saspec.rules`` (``"fixed"``: K, ``"per-match"``, ``"per-match-recent"``).
        length_scale: the fixed rules' tokens per matched token (> 0).
        min_match: rows whose match is shorter draft nothing (>= 1; None: 1 under the policy, which
            weighs every offer, else ``DEFAULT_MIN_MATCH``).
        occurrence: which earlier occurrence drafts copy from (``build.OCCURRENCES``; None: the default).
        pool_tokens: the cross-request pool's size in tokens (0: none): finished requests' texts join
            it and rows draft from it where their match there is longer.
        pool: a ``saspec.RequestPool`` to use instead (kept across drafters, e.g. across an engine's
            calls; the caller closes it). Not with ``pool_tokens``.
        automaton: False: no automaton drafts (a neural drafter alone, under the same policy);
            requests are still built where a pool may take their texts.
        automaton_k: the most automaton draft tokens of a row (in [1, K]; default K): an engine whose
            neural drafter drafts longer than its automaton should (the policy then offers it at most
            this many automaton tokens, and a fixed rule cuts at it).
        max_step_tokens: the most tokens a row may gain in one step (default K + 1: the accepted drafts
            and one more); more where another drafter of the engine may draft longer than K.
        ranks: tensor-parallel ranks drafting alike (see ``RequestDrafts``); with more than one the
            policy decides from its prior costs and acceptance alone (timings differ per rank).
        max_rows: the most rows of a step (sizes the policy's cost table).
        policy_settings: the policy's :class:`~saspec.policy.PolicySettings` (default all defaults).
        cost: a :class:`~saspec.policy.StepCost` to use (e.g. ``StepCost.profile`` of the engine).
        neural_catchup_sunk: the engine runs its neural drafter's catch-up at every step anyway.
        log: called with each step's :class:`~saspec.policy.Decision` (None: the ``saspec.policy``
            logger where ``$SASPEC_POLICY_LOG`` is set).
        clock: the time source of the step timings (seconds); a test or a simulation injects one.
        faults: a fault-injection test hook for the automata (``saspec.faults``; None: none).

    Raises:
        ValueError, TypeError: a setting out of range or of the wrong type (named).

    Attributes:
        policy: the :class:`~saspec.policy.DraftPolicy` (None with a fixed rule).
        drafts: the :class:`~saspec.request_drafts.RequestDrafts` holding the automata.
        pool: the cross-request pool (a ``RequestPool``) or None.
        automaton_k: the most automaton draft tokens of a row.
        max_step_tokens: the most tokens a row may gain in one step.
    """

    def __init__(self, k: int, *, device: str = "cpu", length_rule: str = POLICY, length_scale: float = 2.0,
                 min_match: int | None = None, occurrence: str | None = None, pool_tokens: int = 0,
                 ranks: int = 1, max_rows: int = DEFAULT_MAX_ROWS, policy_settings: PolicySettings | None = None,
                 cost: StepCost | None = None, neural_catchup_sunk: bool = False,
                 log: Callable[[Decision], Any] | None = None, clock: Callable[[], float] = time.perf_counter,
                 faults: Any = None, pool: RequestPool | None = None, automaton: bool = True,
                 automaton_k: int | None = None, max_step_tokens: int | None = None) -> None:
        self.k = check_count(k, "k")
        self.automaton_k = self.k if automaton_k is None else check_int(automaton_k, "automaton_k", 1, self.k)
        if min_match is None:
            min_match = 1 if length_rule == POLICY else DEFAULT_MIN_MATCH
        check_int(min_match, "min_match", 1)
        check_int(pool_tokens, "pool_tokens", 0)
        self.ranks = check_int(ranks, "ranks", 1)
        max_rows = check_int(max_rows, "max_rows", 1)
        if not isinstance(device, str):
            raise TypeError(f"device must be a device type string such as 'cpu' or 'cuda', got {device!r}")
        if length_rule != POLICY and length_rule not in DRAFT_LENGTH_RULES:
            raise ValueError(f"unknown length_rule {length_rule!r}; choose from "
                             f"{', '.join((POLICY, *DRAFT_LENGTH_RULES))}")
        if not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
        self.length_rule = length_rule
        self.policy: DraftPolicy | None = None
        if length_rule == POLICY:
            self.policy = DraftPolicy.for_engine(self.k, device=device, settings=policy_settings,
                                                 max_tokens=min(max_rows * (self.k + 1), MAX_STEP_TOKENS),
                                                 neural_catchup_sunk=neural_catchup_sunk, log=log, clock=clock)
            if cost is not None:
                if not isinstance(cost, StepCost):
                    raise TypeError(f"cost must be a saspec.policy.StepCost, got {type(cost).__name__}")
                self.policy.cost = cost
        # The policy cuts what the automaton offers ("fixed"); a fixed rule cuts by the match.
        if pool is not None:
            if pool_tokens:
                raise ValueError("give pool_tokens or pool, not both")
            if not isinstance(pool, RequestPool):
                raise TypeError(f"pool must be a saspec.RequestPool, got {type(pool).__name__}")
        engine = SpecEngine(pool=pool, faults=faults, **({} if occurrence is None else {"occurrence": occurrence})) \
            if pool is not None else None
        # The automata draft max_step_tokens - 1 tokens (the width a step may append); rows take at most K.
        width = self.k if max_step_tokens is None else check_int(max_step_tokens, "max_step_tokens", self.k + 1) - 1
        self._wide = width > self.automaton_k  # the automata draft more than a row takes from them: cut
        self.max_step_tokens = width + 1
        self.drafts = RequestDrafts(width, min_match=min_match, length_rule="fixed" if self.policy else length_rule,
                                    length_scale=length_scale, occurrence=occurrence, pool_tokens=pool_tokens,
                                    ranks=self.ranks, faults=faults, engine=engine)
        self.pool = self.drafts.pool
        self.automaton = bool(automaton)
        self._neural_seen: set[Hashable] = set()  # requests the neural drafter has drafted for
        self._unstepped: set[Hashable] = set()  # started before_prefill, their first step not taken yet
        self._prefilling = False  # the last step drafted before a row's prefill: its forward prefilled
        self._verified = 0  # the tokens the last step's live rows verify: each row's new token and its draft
        self.clock = clock
        self._timed = self.ranks == 1
        self._options: dict[Hashable, DraftOptions] = {}
        self._lengths: dict[Hashable, int] = {}  # each request's text length, where the caller gives none
        self._t_return: float | None = None  # when the last step returned: the engine's forward runs after it
        self._last: list[Hashable] | None = None  # the rows of the last step
        self._caps: np.ndarray = np.zeros(0, np.int32)  # the rows' draft caps (-1: never drafted for)
        self._any_cap = False
        self._never = False  # a row of the batch is never drafted for (see _batch_options)
        self._disabled = 0  # rows of the batch with drafting off
        self._out: tuple | None = None  # (rows, neural_k, the DraftBatch over this drafter's buffers, its [4, B] one)
        self._prev: _Offers | None = None  # the last step's offers, for a step with a neural drafter
        self._share = CatchUpShare()
        self._closed = False
        self._counts = {"steps": 0, "rows": 0, "drafted_rows": 0, "draft_tokens": 0, "neural_rows": 0,
                        "disabled_rows": 0, "longest_draft": 0, "mixed_steps": 0}

    # -- lifecycle -----------------------------------------------------------------

    def start(self, request_id: Hashable, prompt: Any, options: Any = None,
              max_new_tokens: int | None = None, *, before_prefill: bool = False) -> None:
        """A new request: build its automaton on a background thread (without the GIL), so it overlaps
        the engine's prefill. Call it when the engine admits the request, before its first step.

        A request's first step normally follows its prefill and hands over the prefill's token. Where
        the engine verifies a draft in the prefill's forward itself (transformers' assisted decoding, a
        loop that feeds the prompt and the draft at once), start it ``before_prefill``: its first step
        then comes before that forward, hands over no tokens (``new_lens`` 0) and drafts from the
        whole prompt. The request's text stays its prompt and output, as the pool receives it.

        Args:
            request_id: any hashable id, unique among the requests started and not finished.
            prompt: 1-D token ids (list, numpy array or CPU tensor) in [0, 2**31); None: not known
                yet (its automaton is built at its first step from ``texts``, which that step needs).
            options: the request's :class:`~saspec.options.DraftOptions`, or a mapping with its keys
                (``enabled``, ``max_draft_tokens``, ``hints``), or None (defaults).
            max_new_tokens: the most tokens the request may generate, if known (room is reserved).
            before_prefill: the request's first step comes before its prefill (see above); it needs
                the ``prompt``.

        Raises:
            KeyError: ``request_id`` was started and not finished.
            TypeError, ValueError: a bad prompt, ``max_new_tokens``, option or ``before_prefill``
                (named); nothing changes.
            RuntimeError: the drafter is closed.
        """
        self._check_open()
        if request_id in self._options:
            raise KeyError(f"request {request_id!r} is already started")
        tokens = None if prompt is None else as_tokens(prompt, "prompt")
        opts = parse_options(options, f"request {request_id!r} options")
        if max_new_tokens is not None:
            max_new_tokens = check_int(max_new_tokens, "max_new_tokens", 0)
        if not isinstance(before_prefill, bool):
            raise TypeError(f"before_prefill must be a bool, got {type(before_prefill).__name__}")
        if before_prefill and tokens is None:
            raise ValueError(f"request {request_id!r}: before_prefill needs its prompt (its first step drafts from it)")
        self._options[request_id] = opts
        if before_prefill:
            self._unstepped.add(request_id)
        if tokens is None:
            self.drafts.expect(request_id, max_new_tokens, opts.hints)
            return
        self._lengths[request_id] = int(tokens.shape[0])
        if (opts.drafts and self.automaton) or self.pool is not None:  # else no automaton is needed
            self.drafts.start(request_id, tokens, max_new_tokens, opts.hints)

    def finish(self, request_id: Hashable) -> None:
        """The request finished (or was aborted): its text joins the pool (if any), its state is freed.
        Always completes, whatever happened to its builds. Unknown ids are ignored (an engine may
        report a request finished twice)."""
        self._options.pop(request_id, None)
        self._lengths.pop(request_id, None)
        self._neural_seen.discard(request_id)
        self._unstepped.discard(request_id)
        self.drafts.finish(request_id)
        if self.policy is not None:
            self.policy.forget(request_id)
        if self._last is not None and request_id in self._last:
            self._last = None

    def close(self) -> None:
        """Stop the background builder and close the pool (idempotent). Call it when the engine stops
        (or use the drafter as a context manager)."""
        if not self._closed:
            self._closed = True
            self.drafts.close()

    def __enter__(self) -> Drafter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._options

    def __len__(self) -> int:
        return len(self._options)

    def options(self, request_id: Hashable) -> DraftOptions:
        """The options ``request_id`` was started with. Raises ``KeyError`` for an unknown id."""
        return self._options[request_id]

    # -- each step -------------------------------------------------------------------

    def step(self, request_ids: Sequence[Hashable], new_tokens: Any, new_lens: Any, *, text_len: Any = None,
             texts: Any = None, width: int | None = None, seconds: float | None = None, step_tokens: int = 0,
             neural_k: int = 0, neural_rows: Any = None, neural_behind: int = 0, neural_first: int | None = None,
             remaining: int | None = None, max_draft: Any = None) -> DraftBatch:
        """Append each row's newly accepted tokens to its automaton and draft for every row.
        Call it once per engine step, after the forward (and before the next one).

        Args:
            request_ids: B request ids in row order (each started; rows that append nothing may repeat
                none of the others).
            new_tokens: int [B, >= max(new_lens)]: each row's tokens emitted since its last step
                (accepted drafts and the target's own), first in the row.
            new_lens: int [B] in [0, K + 1]: how many of ``new_tokens[b]`` are real; 0: the row is
                still in prefill (it appends and drafts nothing), except at the first step of a request
                started ``before_prefill``, where it drafts from its whole prompt.
            text_len: int32 [B]: each row's text length (prompt and output) before this step's tokens,
                where the engine keeps it (vLLM); None: the drafter counts it from the prompt.
            texts: int32 [>= B, >= text_len[b]]: each row's text, read only to rebuild a request whose
                automaton does not hold its text (a step the drafter did not see); None: none.
            width: no draft runs past this many tokens of text (the engine's context length).
            seconds: the last forward's seconds, where the engine times it; None: the drafter's clock
                from the last step's return to this call. A forward that prefilled a row started
                ``before_prefill`` is timed only with its ``step_tokens``.
            step_tokens: the tokens that forward processed (prefill chunks of other requests
                included), where known; 0: the rows and draft tokens the last step chose. A forward
                that processed more than those (it also prefilled) is not timed: prefill tokens cost
                less than the verified ones (no logits), so they would make drafts look cheap.
            neural_k: the most tokens the engine's neural drafter can draft for a row this step
                (0: there is none). The policy then gives each row the better source.
            neural_rows: bool [B]: rows the neural drafter may draft for (default: all live rows).
            neural_behind: tokens the neural drafter must read before it drafts (its catch-up; where
                the engine runs it every step anyway, ``neural_catchup_sunk``, it costs nothing).
            neural_first: of those, the tokens of requests it has never read (their prompts): a
                catch-up is charged over the neural steps it serves (``saspec.policy.CatchUpShare``);
                None: all of them where the neural drafter has drafted for none of the rows' requests
                yet, else none.
            remaining: tokens a row may still emit (None: unknown), for that share.
            max_draft: None, an int >= 0 or int [B] >= 0: the most draft tokens each row may take
                this step from either source, within its request's ``max_draft_tokens`` (e.g. the
                tokens left before the engine's own limit); the policy decides within it, and
                ``batch.max_lengths`` holds it.

        Returns:
            The step's :class:`DraftBatch` (views the next call overwrites).

        Raises:
            TypeError, ValueError: arrays of the wrong type, dtype or shape, a length out of range, an
                id twice, or an unknown id (named); nothing changes.
            RuntimeError: the drafter is closed.
        """
        self._check_open()
        now = self.clock()
        rids = request_ids if isinstance(request_ids, list) else list(request_ids)
        b = len(rids)
        new, lens = _rows_array(new_tokens, "new_tokens", 2, b), _rows_array(new_lens, "new_lens", 1, b)
        verifying = int(np.count_nonzero(lens))  # rows in the engine's forward, drafted for or not
        step_cap = None if max_draft is None else _step_cap(max_draft, b)
        same = rids == self._last
        first = None  # rows at their first step before their prefill (only in a batch that changed)
        if not same:
            self._last = None  # until this step succeeds: the options below are this batch's
            self._batch_options(rids)
            if self._unstepped:
                first = self._first_rows(rids, lens)
        caps, any_cap = self._caps, self._any_cap
        if step_cap is not None:
            caps = np.where(caps < 0, caps, np.minimum(caps, step_cap)).astype(np.int32)
            any_cap = bool((caps < self.k).any())
        live = lens
        if self._never:  # never drafted for (no automaton without a pool)
            lens = live = np.where(self._caps < 0, 0, lens).astype(np.int32)
            if first is not None:
                first = first & (self._caps >= 0)
        first_auto = first  # the first rows whose automata draft
        if not self.automaton:  # rows stay live for the neural drafter; automata only where a pool wants them
            lens = lens if self.pool is not None else np.zeros_like(lens)
            first_auto = first if self.pool is not None else None
        if text_len is None:
            missing = [r for r in rids if r not in self._lengths]
            if missing:
                raise ValueError(f"request {missing[0]!r} was started without a prompt: its steps need text_len")
            before = np.fromiter((self._lengths[r] for r in rids), np.int32, b)
        else:
            before = _rows_array(text_len, "text_len", 1, b)
        if texts is not None and not (type(texts) is np.ndarray and texts.dtype is _I32 and texts.ndim == 2
                                      and texts.flags.c_contiguous):
            texts = _rows_array(texts, "texts", 2, texts.shape[0] if hasattr(texts, "shape") else len(texts))
        w = int(width) if width is not None else (1 << 31) - 1
        match, draft, offered = self.drafts.step(rids, before, new, lens, texts, w, first_auto)
        if self._wide:
            ak = self.automaton_k
            draft, offered = draft[:, :ak], np.minimum(offered, ak).astype(np.int32)
        if not self.automaton:
            offered = np.zeros_like(offered)
            lens = live
        if text_len is None:
            for r, n in zip(rids, lens.tolist()):
                self._lengths[r] += n
        if any_cap:
            offered = np.minimum(offered, np.maximum(caps, 0)).astype(np.int32)
        if seconds is None:
            seconds = now - self._t_return if self._t_return is not None and self._timed else math.nan
        elif not self._timed:
            seconds = math.nan
        if self._prefilling and not step_tokens:  # that forward prefilled: its size is not the drafts'
            seconds = math.nan
        elif step_tokens > self._verified > 0:  # it also prefilled other requests' chunks
            seconds = math.nan
            self._counts["mixed_steps"] += 1
        if self.policy is None:
            lengths, sources, nk = offered, None, 0
        elif neural_k == 0 and self._prev is None:
            if not same:
                self.policy.rows(rids)
            lengths = self.policy.step(match, offered, draft, new, lens, seconds, same, self.drafts.branched,
                                       int(step_tokens))
            sources, nk = None, 0
        else:
            lengths, sources, nk = self._neural_step(rids, same, match, draft, offered, new, lens, seconds,
                                                     int(step_tokens), check_int(neural_k, "neural_k", 0),
                                                     neural_rows, check_int(neural_behind, "neural_behind", 0),
                                                     self._first(rids, neural_behind, neural_first), remaining,
                                                     caps, any_cap, first)
        if not same:
            self._last = list(rids)  # a copy: the caller may change its list before the next step
        if first is not None:
            lens = np.where(first, 1, lens).astype(np.int32)  # live rows: their match is reported
        if self._unstepped and not same:
            self._unstepped.difference_update(rids)
        self._prefilling = first is not None
        out = self._finish_step(draft, lengths, sources, match, lens, nk, caps, any_cap, verifying)
        self._t_return = self.clock()
        return out

    def _first_rows(self, rids: list, lens: np.ndarray) -> np.ndarray | None:
        """bool [B]: the rows at the first step of a request started ``before_prefill`` that hand over no
        tokens (they draft from their prompt); None where there is none."""
        first = np.fromiter((r in self._unstepped for r in rids), np.bool_, len(rids)) & (lens == 0)
        return first if first.any() else None

    def _neural_step(self, rids: list, same: bool, match: np.ndarray, draft: np.ndarray, offered: np.ndarray,
                     new: np.ndarray, lens: np.ndarray, seconds: float, step_tokens: int, neural_k: int,
                     neural_rows: Any, behind: int, first: int, remaining: int | None, caps: np.ndarray,
                     any_cap: bool, first_rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, int]:
        """A step where a neural drafter may draft: score the last step's offers of both sources, then
        each row's source and length (a drafter that lags charged a share of its catch-up). ``caps`` /
        ``any_cap``: the rows' draft caps this step; ``first_rows``: rows live without new tokens."""
        p = self.policy
        prev = self._prev
        b = len(rids)
        if same and prev is not None:
            p.observe_step(step_tokens or prev.tokens, seconds)
            p.observe(prev.match, prev.offered, prev.drafts, new, lens, prev.branched)
            accepted = np.minimum(np.maximum(lens - 1, 0), prev.neural)
            for i in np.flatnonzero((prev.neural > 0) & (lens > 0)).tolist():
                p.observe_neural_outcome(int(prev.neural[i]), int(accepted[i]))
        elif not same:
            p.rows(rids)
        live = lens > 0 if first_rows is None else (lens > 0) | first_rows
        m = np.where(live, match, 0).astype(np.int64)
        off = offered.astype(np.int64)
        rows = live if neural_rows is None else live & _rows_array(neural_rows, "neural_rows", 1, b, np.bool_)
        if any_cap:
            rows = rows & (caps != 0)
        branched = self.drafts.branched
        if p.catchup_sunk:  # the engine runs the drafter's catch-up anyway: a neural row costs its drafting only
            lengths, src = p.decide(m, off, neural_k=neural_k, neural_rows=rows, neural_behind=max(behind, 1),
                                    branched=branched)
        else:
            in_step = int(lens[live].sum()) + b  # a forward in step reads each row's new tokens and its extra slot
            lengths, src = self._share.decide(p, m, off, neural_k, rows, max(behind, 1), in_step, remaining,
                                              first=first, branched=branched)
        emitting = int(np.count_nonzero(lens))
        if emitting:
            self._share.observe_tokens(float(lens.sum()) / emitting)
        lengths = lengths.astype(np.int32)
        if any_cap:  # a neural row's cap too
            lengths = np.minimum(lengths, np.maximum(caps, 0)).astype(np.int32)
        src = np.where(lengths > 0, src, NONE).astype(np.int32)
        self._prev = _Offers(m, off, draft.copy(), branched.copy(), np.where(src == NEURAL, lengths, 0),
                             int(np.count_nonzero(live)) + int(lengths.sum()))
        if (src == NEURAL).any():
            self._neural_seen.update(r for r, s in zip(rids, src.tolist()) if s == NEURAL)
        return lengths, src, p.neural_k

    def _finish_step(self, draft: np.ndarray, lengths: np.ndarray, sources: np.ndarray, match: np.ndarray,
                     lens: np.ndarray, neural_k: int, caps: np.ndarray, any_cap: bool, verifying: int) -> DraftBatch:
        """The step's batch: automaton rows keep their draft up to their length, other rows -1; ``sources``
        None: a row's source is AUTOMATON where it drafts, else NONE. One jitted pass writes the batch's
        arrays, buffers of this drafter kept (with the batch over them) while the rows' count and
        ``neural_k`` stay. ``verifying``: the rows in the engine's next forward (with the drafts, what it
        verifies)."""
        b = draft.shape[0]
        out = self._out
        if out is None or out[0] != b or out[1] != neural_k:
            k = self.k
            rows = np.zeros((4, b), np.int32)  # lengths, sources, match, max_lengths
            out = self._out = (b, neural_k, DraftBatch(np.full((b, k), -1, np.int32), rows[0], rows[1], rows[2],
                                                        neural_k, rows[3]), rows)
        batch = out[2]
        derive = sources is None
        drafted, tokens, longest, neural = _finish_rows(draft, lengths, lengths if derive else sources, derive, match,
                                                        lens, caps, any_cap, self.k, batch.tokens, out[3])
        self._verified = verifying + tokens
        c = self._counts
        c["steps"] += 1
        c["rows"] += b
        if tokens:
            c["drafted_rows"] += drafted
            c["draft_tokens"] += tokens
            if longest > c["longest_draft"]:
                c["longest_draft"] = longest
        if neural:
            c["neural_rows"] += neural
        if self._disabled:
            c["disabled_rows"] += self._disabled
        return batch

    def _batch_options(self, rids: list) -> None:
        """Each row's draft cap for a new batch: -1 never drafted for, else the cap (K without one)."""
        caps = np.full(len(rids), self.k, np.int32)
        disabled = 0
        for i, r in enumerate(rids):
            try:
                o = self._options[r]
            except KeyError:
                raise KeyError(f"request {r!r} was not started (Drafter.start) or is finished") from None
            if o is DEFAULT_OPTIONS:
                continue
            if not o.drafts:
                caps[i] = -1 if self.pool is None else 0
                disabled += 1
            elif o.max_draft_tokens is not None:
                caps[i] = min(o.max_draft_tokens, self.k)
        self._caps = caps
        self._any_cap = bool((caps < self.k).any())
        self._never = self._any_cap and bool((caps < 0).any())
        self._disabled = disabled  # counted at each step of this batch

    def idle(self) -> None:
        """The engine ran a step with no row to draft for: the next step is neither timed nor scored
        against the last one."""
        self._last = None
        self._t_return = None
        self._prev = None
        self._prefilling = False
        self._verified = 0

    def mark_forward(self) -> None:
        """The engine's target forward starts now (after its own drafting, say a neural drafter's call):
        the next step's timing runs from here instead of from this step's return."""
        self._t_return = self.clock()

    def neural_drafted(self, lengths: Any) -> None:
        """The neural draft tokens each row of this step's batch really proposed (int [B]), where that is
        not the batch's length (the drafter made fewer, or the engine cut them): the next step scores
        the neural drafter against these."""
        if self._prev is not None:
            n = _rows_array(lengths, "lengths", 1, self._prev.neural.shape[0])
            self._prev = dataclasses.replace(self._prev, neural=n.astype(np.int64))

    def time_neural(self, seconds: float, read: int, drafted: int, rows: int = 1) -> None:
        """One neural drafter call of this step: ``seconds`` to read ``read`` tokens and draft
        ``drafted`` tokens for each of ``rows`` rows (its cost, learnt against the target's)."""
        if self.policy is not None and self._timed:
            self.policy.observe_neural(seconds, read, drafted, rows)

    def _first(self, rids: list, behind: int, first: int | None) -> int:
        """The first-read tokens of a neural catch-up (see :meth:`step`'s ``neural_first``)."""
        if first is not None:
            return check_int(first, "neural_first", 0)
        return 0 if any(r in self._neural_seen for r in rids) else int(behind)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the drafter is closed")

    # -- inspection ------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters: ``steps``, ``rows``, ``drafted_rows``, ``draft_tokens``, ``neural_rows``,
        ``disabled_rows`` (row-steps of requests started with drafting off), ``longest_draft``
        (tokens, the longest draft of any row so far), ``mixed_steps`` (forwards not timed because they
        also prefilled, from ``step_tokens``), the automata's
        (``built``, ``built_ahead``, ``rebuilt``, ``waited``, ``finished``, ``pool_rows``,
        ``build_failures``), the engine's ``growth_failures`` and the policy's, prefixed ``policy_``."""
        engine = self.drafts.engine.stats()
        out = {**self._counts, **self.drafts.stats, "growth_failures": engine.get("growth_failures", 0)}
        if self.policy is not None:
            out.update({f"policy_{k}": v for k, v in self.policy.stats.items()})
        return out


@dataclass(frozen=True)
class _Offers:
    """A step's offers, scored at the next step (with a neural drafter)."""

    match: np.ndarray
    offered: np.ndarray
    drafts: np.ndarray
    branched: np.ndarray
    neural: np.ndarray  # each row's neural draft length (0: not a neural row)
    tokens: int  # the tokens the step's forward verifies


def _rows_array(x: Any, name: str, ndim: int, rows: int, dtype: Any = np.int32) -> np.ndarray:
    """``x`` (numpy array, CPU tensor or nested list of integers) as a C-contiguous ``dtype`` array of
    ``ndim`` dimensions and ``rows`` rows; ``TypeError`` / ``ValueError`` naming ``name`` otherwise."""
    if (type(x) is np.ndarray and x.dtype is _I32 and dtype is np.int32 and x.ndim == ndim and x.shape[0] == rows
            and x.flags.c_contiguous):
        return x  # already what the step needs (the usual case): no conversion, no copy
    if not isinstance(x, np.ndarray) and hasattr(x, "numpy"):
        x = x.detach().numpy() if hasattr(x, "detach") else x.numpy()
    a = np.asarray(x)
    if dtype is np.bool_:
        if a.dtype != np.bool_:
            raise TypeError(f"{name} must hold bools, got dtype {a.dtype}")
    elif not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim != ndim or a.shape[0] != rows:
        raise ValueError(f"{name} must have {ndim} dimension(s) and {rows} rows, got shape {a.shape}")
    if a.dtype != dtype or not a.flags.c_contiguous:
        if dtype is np.int32 and a.size and (a.min() < -(1 << 31) or a.max() >= 1 << 31):
            raise ValueError(f"{name} holds values outside int32")
        a = np.ascontiguousarray(a, dtype=dtype)
    return a


def _step_cap(max_draft: Any, rows: int) -> np.ndarray:
    """``Drafter.step``'s ``max_draft`` as int32 [rows] (>= 0); ``TypeError`` / ``ValueError`` naming it."""
    if isinstance(max_draft, (bool, numbers.Integral)):  # a bool: check_int's TypeError
        return np.full(rows, min(check_int(max_draft, "max_draft", 0), (1 << 31) - 1), np.int32)
    cap = _rows_array(max_draft, "max_draft", 1, rows)
    if cap.size and int(cap.min()) < 0:
        raise ValueError(f"max_draft must be >= 0, got {int(cap.min())}")
    return cap


def warm_up(drafter: Drafter, neural_k: int = 0) -> None:
    """Drive a throwaway ``drafter`` through every kernel its steps use: the automaton's build and step,
    the policy's step (and, with ``neural_k``, its choice between sources and the scoring of neural
    drafts), the pool's build and lookup. numba compiles each kernel at its first call and caches it on
    disk, keyed on saspec's sources; on a cold cache (a new install or version) those calls take seconds,
    which an engine would otherwise pay inside its first requests' steps (the pool's lookup only once a
    request has finished). Close the drafter after (its counters and evidence are the warm-up's).

    Raises:
        whatever a step raises; an engine catches and logs it (its kernels then compile at first use).
    """
    text = np.tile(np.arange(1, 33, dtype=np.int32), 8)  # a repeated block: every row drafts
    for rid in ("warm-up-0", "warm-up-1"):  # the second one drafts with the first one pooled
        n = text.shape[0] - 8
        drafter.start(rid, text[:n], max_new_tokens=8)
        for _ in range(4):  # each step emits the text's next token
            drafter.step([rid], text[n: n + 1].reshape(1, 1), np.ones(1, np.int32), neural_k=neural_k)
            n += 1
        drafter.finish(rid)
        pool = drafter.pool
        if pool is not None:
            if pool.manual:
                pool.publish()
            pool.flush(timeout=60.0)
            if pool.manual:
                pool.publish()
