"""RequestDrafts: suffix-automaton drafts for an engine's batch rows, keyed by request id.

The request lifecycle under :class:`saspec.drafter.Drafter` (and the vLLM
hybrid's automaton side). Each step the engine hands over its batch in row
order; row ``b`` is the request ``rids[b]``, whose text so far is
``texts[b, :text_len[b]]`` and which gained ``new[b, :new_lens[b]]`` this
step. :meth:`RequestDrafts.step` appends the new tokens to each row's
automaton and drafts for every row in one ``SpecEngine.extend`` call.

Where the engine says when a request arrives (before the forward that
prefills it), :meth:`RequestDrafts.start` builds its automaton on a background
thread, without the GIL, while the engine prefills; the first step that drafts
for it waits only for what is not built yet. A request the first step does not
know (it arrived unannounced, or its text is not what its automaton holds,
e.g. after a skipped step) is built there from ``texts``: exact, only slower.

A build that fails (a ``MemoryError``, say), ahead or in a step, never reaches
the step's caller: it is logged and counted (``stats["build_failures"]``), that
request drafts nothing, and a later step where it is live builds it again
(after 1, 2, 4, ... of its steps, so a build that keeps failing costs little).
Every other row drafts as usual, and :meth:`RequestDrafts.finish` always
forgets the request.

Hints: a request started with ``hints`` (token ids its drafts may copy from)
has an automaton over ``hints, HINT_SEPARATOR, text``; the separator occurs
nowhere else, so no match spans it, and a draft stops where it would cross it.

The hot path, a batch of the same requests in the same rows as at the last
step each continuing where it stopped, is checked with one list comparison and
one jitted pass that also gathers the new tokens; no Python loop runs over the rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from .engine import SpecEngine
from .pool import RequestPool
from .options import HINT_SEPARATOR
from .rules import check_length_rule, draft_length

logger = logging.getLogger(__name__)

_NO_FIRST = np.zeros(0, np.bool_)  # step's ``first`` where no row is at its first step

#: With a pool, every this many steps the texts of requests finished since the last
#: publish become the rows' pool (built meanwhile in the background; see ``RequestPool.publish``).
POOL_PUBLISH_STEPS = 8


@njit(nogil=True, cache=True)
def _live_rows(text_len, new, new_lens, k1, row_end, n_last, rows, before, lens, acc, first):
    """Gather the rows with new tokens (``new_lens[b] > 0``), and those with ``first[b]`` (where
    ``first`` has rows), into ``rows``, ``before`` (text lengths), ``lens`` and ``acc`` (their tokens).
    Returns ``(n, same)``: how many, and whether their text lengths equal
    ``row_end[:n_last]`` (each continues where the last step left it); ``n = -1``
    when a length is outside ``[0, k1]``."""
    n = 0
    for b in range(new_lens.shape[0]):
        s = new_lens[b]
        if s < 0 or s > k1 or s > new.shape[1]:
            return -1, False
        if s == 0 and (b >= first.shape[0] or not first[b]):
            continue
        rows[n] = b
        before[n] = text_len[b]
        lens[n] = s
        for j in range(s):
            acc[n, j] = new[b, j]
        n += 1
    same = n == n_last
    for i in range(n if same else 0):
        if before[i] != row_end[i]:
            same = False
            break
    return n, same


@njit(nogil=True, cache=True)
def _draft_counts(match, draft, min_match, rule, scale, lens, before, width, drafted, count, ends, src):
    """count[i]: how many of ``draft[i]`` row ``i`` proposes: 0 below ``min_match``,
    else the draft-length rule's length (``lengths.draft_length``; the row's
    accepted drafts at its last step are ``lens[i] - 1`` where ``drafted[i] > 0``),
    at most the real draft tokens (in [0, HINT_SEPARATOR)) and the room left below ``width``.
    Then ``ends[i] = before[i] + lens[i]`` and ``drafted[i] = count[i]``: the state the next step checks.
    Returns how many rows' drafts are the pool's (``src[i] != 0``)."""
    k = draft.shape[1]
    pooled = 0
    for i in range(match.shape[0]):
        if src[i] != 0:
            pooled += 1
        n = 0
        if match[i] >= min_match:
            last = lens[i] - 1 if drafted[i] > 0 else -1
            n = min(draft_length(match[i], k, rule, scale, last), width - before[i] - lens[i])
            real = 0
            while real < n and 0 <= draft[i, real] < HINT_SEPARATOR:
                real += 1
            n = real
        count[i] = n
        ends[i] = before[i] + lens[i]
        drafted[i] = n
    return pooled


class _Build:
    """One background build: ``done`` is set under ``RequestDrafts._lock`` when it has ended."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


class RequestDrafts:
    """Suffix-automaton drafts for a batch whose rows name their requests.

    Args:
        k: the most draft tokens a row may propose (>= 1).
        min_match: rows whose match is shorter than this many tokens draft nothing (>= 1).
        length_rule, length_scale: the draft-length rule (``saspec.rules``);
            ``per-match-recent`` reads each row's accepted drafts at its
            previous step from its new tokens.
        occurrence: which earlier occurrence drafts copy from (``SpecEngine``'s
            ``occurrence``), or None for its default.
        pool_tokens: a cross-request pool of this many tokens (0: none): each
            finished request's text joins it, and rows draft from it where their
            match there is longer than in their own text.
        ranks: tensor-parallel ranks drafting alike (>= 1). With more than one,
            the pool changes only every ``POOL_PUBLISH_STEPS`` steps, at a step
            count, which every rank sees alike (``RequestPool(manual=True)``; a
            publish waits if the build it shows is not done yet); with one, it
            changes as soon as a build is done and never waits.
        engine: a ``SpecEngine`` to hold the automata instead of a new CPU one
            (with ``pool_tokens`` 0; the engine's own pool, if any, is used).
        faults: the new engine's fault-injection test hook (``SpecEngine``'s ``faults``).

    Raises:
        ValueError: ``k`` or ``min_match`` below 1, or an unknown rule or bad scale.

    Attributes:
        stats: ``built`` (automata built in a step), ``built_ahead`` (by :meth:`start`, taken by a step),
            ``rebuilt`` (built again after a gap), ``waited`` (steps that waited for a build),
            ``finished``, ``pool_rows`` (rows whose draft came from the pool) and ``build_failures``.
    """

    def __init__(self, k: int, *, min_match: int, length_rule: str, length_scale: float,
                 occurrence: str | None = None, pool_tokens: int = 0, ranks: int = 1,
                 engine: SpecEngine | None = None, faults: Any = None) -> None:
        if int(k) < 1 or int(min_match) < 1:
            raise ValueError(f"k and min_match must be >= 1, got k={k}, min_match={min_match}")
        self.k, self.min_match = int(k), int(min_match)
        self.length_rule, self.length_scale = length_rule, float(length_scale)
        self._rule = check_length_rule(length_rule, length_scale)
        if engine is not None:
            if pool_tokens:
                raise ValueError("give pool_tokens or engine, not both (the engine's pool is used)")
            self.engine, self.pool = engine, engine.request_pool
        else:
            self.pool = RequestPool(pool_tokens, manual=ranks > 1) if pool_tokens else None
            kw = {} if occurrence is None else {"occurrence": occurrence}
            self.engine = SpecEngine(pool=self.pool, faults=faults, **kw)
        self._owns_pool = engine is None and self.pool is not None
        self._steps = 0
        self._len: dict[Hashable, int] = {}  # tokens of each built request's text in its automaton
        self._pending: dict[Hashable, tuple[Future, _Build]] = {}  # builds started by start(), not yet waited for
        self._dropped: set[_Build] = set()  # builds of requests finished while they ran: freed when they end
        self._built: set[Hashable] = set()  # built ahead, not yet taken by a step
        self._expected: dict[Hashable, int] = {}  # tokens a started request may reach (prompt + max_tokens)
        self._prefix: dict[Hashable, np.ndarray] = {}  # hints + HINT_SEPARATOR, for requests started with hints
        self._failed: dict[Hashable, list[int]] = {}  # build failed: [its failures, its live steps until a retry]
        self._lock = threading.Lock()
        self._builder: ThreadPoolExecutor | None = None
        self._rows: list[Hashable] = []  # the batch of the last step, in row order
        self._grow(0)  # _ends / _drafted: each of those rows' text length after that step, and its draft tokens
        self.stats = {"built": 0, "built_ahead": 0, "rebuilt": 0, "waited": 0, "finished": 0, "pool_rows": 0,
                      "build_failures": 0}
        self.branched = np.zeros(0, np.int32)  # the last step's branch flags (see step)
        self.source = np.zeros(0, np.int32)  # the last step's pool flags (see step)

    # -- lifecycle --------------------------------------------------------------

    def start(self, rid: Hashable, prompt: Any, expected_new_tokens: int | None = None,
              hints: np.ndarray | None = None) -> None:
        """Build ``rid``'s automaton from ``prompt`` (1-D token ids; with ``hints``, int32 [H], after them)
        on a background thread, so it overlaps the prefill; returns at once. A known id is left as it is."""
        if rid in self._len or rid in self._pending:
            return
        tokens = np.array(prompt, dtype=np.int32)  # a copy: the caller's buffer may change while we build
        if hints is not None:
            self._prefix[rid] = np.append(np.asarray(hints, np.int32), np.int32(HINT_SEPARATOR))
            tokens = np.concatenate((self._prefix[rid], tokens))
        if self._builder is None:
            self._builder = ThreadPoolExecutor(1, thread_name_prefix="saspec-build")
        if expected_new_tokens is not None:
            self._expected[rid] = tokens.shape[0] + int(expected_new_tokens)
        build = _Build()
        self._pending[rid] = (self._builder.submit(self._build, rid, build, tokens, expected_new_tokens), build)

    def expect(self, rid: Hashable, expected_new_tokens: int | None = None, hints: np.ndarray | None = None) -> None:
        """A request whose prompt is not known yet: its first step builds it from ``texts`` (with its
        ``hints`` before its text, and room for ``expected_new_tokens`` more)."""
        if hints is not None:
            self._prefix[rid] = np.append(np.asarray(hints, np.int32), np.int32(HINT_SEPARATOR))

    def _build(self, rid: Hashable, build: _Build, tokens: np.ndarray, expected_new_tokens: int | None) -> int:
        """The background build: the text's length, or -1 where the build failed (logged and counted)."""
        try:
            added = self.engine.add_request(rid, tokens, expected_new_tokens)
        except Exception:  # noqa: BLE001  (a failed build must never reach the engine's step)
            self._count_failure(rid, "building ahead")
            added = None
        with self._lock:  # finish() decides under this lock too, so a build is freed exactly once
            build.done = True
            if build in self._dropped:  # finished while we built
                self._dropped.discard(build)
                if added:
                    self.engine.remove_request(rid)
            elif added:
                self._built.add(rid)
        return -1 if added is None else tokens.shape[0] - self._offset(rid)

    def _count_failure(self, rid: Hashable, when: str) -> None:
        self.stats["build_failures"] += 1
        logger.warning("saspec: building the automaton of request %r failed (%s); it drafts nothing until a "
                       "later step builds it", rid, when, exc_info=True)

    def _offset(self, rid: Hashable) -> int:
        """Tokens before ``rid``'s text in its automaton (its hints and the separator)."""
        prefix = self._prefix.get(rid)
        return 0 if prefix is None else prefix.shape[0]

    def finish(self, rid: Hashable) -> None:
        """Free ``rid``'s automaton (the request finished, or was aborted); its text joins the pool, if
        any. Unknown ids are ignored. Always completes, whatever happened to the request's builds."""
        with self._lock:
            fut, build = self._pending.pop(rid, (None, None))
            if rid in self._built:  # built, not yet taken by a step
                self._built.discard(rid)
                self.engine.remove_request(rid)
            elif fut is not None and not fut.cancel() and not build.done:
                self._dropped.add(build)  # being built: _build frees it
        if rid in self._rows:
            self._flush()
            self._rows = []  # the next step prepares its batch again
        for table in (self._expected, self._prefix, self._failed):
            table.pop(rid, None)
        if self._len.pop(rid, None) is not None:
            self.engine.remove_request(rid)
            self.stats["finished"] += 1
        elif fut is not None:
            self.stats["finished"] += 1

    def close(self) -> None:
        """Stop the builder thread and close the pool this object made (idempotent)."""
        if self._builder is not None:
            self._builder.shutdown(wait=True)
            self._builder = None
        if self._owns_pool:
            self.pool.close()
        self.engine.close()

    def __contains__(self, rid: object) -> bool:
        return rid in self._len or rid in self._pending or rid in self._rows or rid in self._failed

    def __len__(self) -> int:
        """Requests with an automaton, built or being built."""
        return len(self._len) + len(self._pending)

    # -- each step ----------------------------------------------------------------

    def step(self, rids: Sequence[Hashable], text_len: np.ndarray, new: np.ndarray, new_lens: np.ndarray,
             texts: np.ndarray | None, width: int, first: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Append each row's new tokens and draft for every row.

        Args:
            rids: B request ids, in row order, all different among the rows with new tokens.
            text_len: int32 [B]: each row's text length before this step's tokens.
            new: int32 [B, >= max(new_lens)]: each row's new tokens first.
            new_lens: int32 [B], 0..k+1: how many of ``new[b]`` are real; a
                row with 0 (still in prefill) is left alone and drafts nothing.
            texts: int32 [>= B, >= text_len[b]]: row ``b``'s text in
                ``texts[b, :text_len[b]]``, read only to build a request this
                class does not have at that length; None: such a row drafts
                nothing (the caller keeps no texts and never skips a step).
            width: no draft runs past this many tokens of text (vLLM's ``max_model_len``).
            first: bool [B] or None: rows that draft from their text as it stands, with no new
                tokens (``new_lens[b]`` 0): a request's first step where the engine's prefill
                verifies it (see ``Drafter.start``'s ``before_prefill``).

        Raises:
            ValueError: lengths of the wrong size or above ``k + 1``, or an id
                twice among the live rows; nothing changes.

        Returns:
            ``(match, draft, count)``: int32 [B] match lengths, int32 [B, k]
            drafts and int32 [B] how many of ``draft[b]`` the row proposes (0
            for skipped rows, rows whose build failed and matches below
            ``min_match``). Views into buffers the next call overwrites, as are
            ``self.branched`` (int32 [B]: ``SpecEngine.extend``'s ``branch_out``)
            and ``self.source`` (int32 [B]: 1 where the draft is the pool's), 0 for skipped rows.
        """
        b_all = len(rids)
        if b_all > self._acc.shape[0]:
            self._grow(b_all)
        if new_lens.shape[0] != b_all or text_len.shape[0] != b_all:
            raise ValueError(f"{b_all} rows need text_len and new_lens of {b_all} entries")
        n, same = _live_rows(text_len, new, new_lens, self.k + 1, self._ends, len(self._rows), self._live,
                             self._before, self._lens, self._acc, _NO_FIRST if first is None else first)
        if n < 0:
            raise ValueError(f"new_lens must be in [0, k + 1 = {self.k + 1}] and fit new's {new.shape[1]} columns")
        act_rids = rids if n == b_all else [rids[i] for i in self._live[:n].tolist()]
        if not (same and act_rids == self._rows):  # else the hot path: the same requests, each where it stopped
            act_rids, n = self._catch_up(act_rids, n, texts)
        v = self._views
        if v[0] != n:  # the live rows' views into the buffers, kept while their count stays
            v = self._views = (n, self._live[:n], self._before[:n], self._lens[:n], self._match[:n], self._draft[:n],
                               self._count[:n], self._drafted[:n], self._src[:n], self._acc[:n], self._branch[:n])
        _, rows, before, lens, match, draft, count, drafted, src, acc, branch = v
        pool = self.pool
        if pool is not None and pool.manual:
            if self._steps % POOL_PUBLISH_STEPS == 0:
                pool.publish()
            self._steps += 1
        if n:  # with a pool the step writes every row's src; without one src stays 0
            self.engine.extend(acc, lens, match, draft, src if pool is not None else None, branch)
        pooled = _draft_counts(match, draft, self.min_match, self._rule, self.length_scale, lens, before, width,
                               drafted, count, self._ends, src)
        if pooled:
            self.stats["pool_rows"] += pooled
        if n == b_all:
            self.branched, self.source = branch, src
            return match, draft, count
        m_out, d_out, c_out = self._out_match[:b_all], self._out_draft[:b_all], self._out_count[:b_all]
        m_out[:], c_out[:], d_out[:] = 0, 0, -1
        m_out[rows], d_out[rows], c_out[rows] = match, draft, count
        self.branched, self.source = self._out_branch[:b_all], self._out_src[:b_all]
        self.branched[:], self.source[:] = 0, 0
        self.branched[rows], self.source[rows] = self._branch[:n], src
        return m_out, d_out, c_out

    def _flush(self) -> None:
        """Record the last batch's lengths in ``_len`` (the hot path keeps them only in ``_ends``)."""
        self._len.update(zip(self._rows, self._ends[: len(self._rows)].tolist()))

    def _catch_up(self, rids: list[Hashable], n: int, texts: np.ndarray | None) -> tuple[list[Hashable], int]:
        """Make every live row's automaton hold exactly its text before this step and prepare the batch;
        rows whose automaton cannot be had (its build failed, or it is unknown without ``texts``) leave the
        live rows (``_live`` etc. compacted). Sets ``_drafted`` (the draft tokens each row proposed at the
        last step, 0 where it was not in that batch or its automaton was built now). Returns the live rows'
        ids and count."""
        if len(set(rids)) != len(rids):
            dup = next(r for i, r in enumerate(rids) if r in rids[:i])
            raise ValueError(f"request {dup!r} appears twice in the batch")
        self._flush()
        if self._pending:  # builds started ahead: wait for those still running (usually none)
            for rid in [r for r in rids if r in self._pending]:
                fut, _ = self._pending.pop(rid)
                if not fut.done():
                    self.stats["waited"] += 1
                length = fut.result()
                with self._lock:
                    self._built.discard(rid)
                if length < 0:
                    self._failed.setdefault(rid, [0, 0])[0] += 1
                    continue
                self._len[rid] = length
                self.stats["built_ahead"] += 1
        before = self._before[:n]
        have = np.fromiter((self._len.get(r, -1) for r in rids), np.int64, n)
        keep = np.ones(n, np.bool_)
        for i in np.flatnonzero(have != before).tolist():  # unknown, or a gap (a step the caller did not show us)
            keep[i] = self._rebuild(rids[i], int(before[i]), int(self._live[i]), have[i] >= 0, texts)
        prev = dict(zip(self._rows, self._drafted[: len(self._rows)].tolist()))
        drafted_before = np.fromiter((prev.get(r, 0) for r in rids), np.int32, n)
        drafted_before[have != before] = 0
        if not keep.all():  # compact the live rows to those with an automaton
            idx = np.flatnonzero(keep)
            rids = [rids[i] for i in idx.tolist()]
            m = idx.shape[0]
            for buf in (self._live, self._before, self._lens, self._acc):
                buf[:m] = buf[idx]
            drafted_before = drafted_before[idx]
            n = m
        self.engine.prepare(rids)
        self._rows = list(rids)
        self._drafted[:n] = drafted_before
        return rids, n

    def _rebuild(self, rid: Hashable, want: int, row: int, live: bool, texts: np.ndarray | None) -> bool:
        """Build ``rid``'s automaton over its first ``want`` text tokens (row ``row`` of ``texts``);
        False where it cannot be had this step (a failed build waits 1, 2, 4, ... live steps to retry)."""
        if live:  # its partial text must not join the pool
            self.engine.remove_request(rid, to_pool=False)
            del self._len[rid]
            self.stats["rebuilt"] += 1
        failed = self._failed.get(rid)
        if failed is not None:
            if failed[1] > 0:
                failed[1] -= 1
                return False
        if texts is None or texts.shape[0] <= row or texts.shape[1] < want:
            return False
        prefix = self._prefix.get(rid)
        tokens = texts[row, :want] if prefix is None else np.concatenate((prefix, texts[row, :want]))
        more = self._expected.get(rid, 0) - tokens.shape[0]
        try:
            self.engine.add_request(rid, tokens, more if more > 0 else None)
        except Exception:  # noqa: BLE001  (a failed build must never reach the engine's step)
            self._count_failure(rid, "in a step")
            failed = self._failed.setdefault(rid, [0, 0])
            failed[0] += 1
            failed[1] = (1 << min(failed[0], 16)) - 1
            return False
        self._failed.pop(rid, None)
        self._len[rid] = want
        self.stats["built"] += 1
        return True

    def _grow(self, rows: int) -> None:
        """Buffers for at least ``rows`` rows (kept across steps: ``_ends`` and
        ``_drafted`` hold the last step's state in their first ``len(_rows)`` entries)."""
        have = self._acc.shape[0] if hasattr(self, "_acc") else 0
        if rows <= have and have:
            return
        cap = max(rows, 2 * have, 8)
        k = self.k
        self._views: tuple = (-1,)  # step's views of the buffers below, for a count of live rows
        old_ends, old_drafted = getattr(self, "_ends", np.zeros(0, np.int32)), getattr(self, "_drafted", np.zeros(0, np.int32))
        self._ends = np.zeros(cap, np.int32)
        self._ends[: old_ends.shape[0]] = old_ends
        self._drafted = np.zeros(cap, np.int32)
        self._drafted[: old_drafted.shape[0]] = old_drafted
        self._acc = np.zeros((cap, k + 1), np.int32)
        self._live = np.zeros(cap, np.int64)
        self._before = np.zeros(cap, np.int32)
        self._lens = np.zeros(cap, np.int32)
        self._match = np.zeros(cap, np.int32)
        self._draft = np.zeros((cap, k), np.int32)
        self._count = np.zeros(cap, np.int32)
        self._src = np.zeros(cap, np.int32)
        self._out_src = np.zeros(cap, np.int32)
        self._branch = np.zeros(cap, np.int32)
        self._out_branch = np.zeros(cap, np.int32)
        self._out_match = np.zeros(cap, np.int32)
        self._out_draft = np.zeros((cap, k), np.int32)
        self._out_count = np.zeros(cap, np.int32)
