"""RequestDrafts: suffix-automaton drafts for vLLM's batch rows, keyed by request id.

Both ways of running saspec in vLLM share this class: the ``custom_class``
drafter (``proposer.SAProposer``) and the hybrid's SA side (``hybrid``). Each
step vLLM hands over its batch in row order; row ``b`` is the request
``rids[b]``, whose text so far is ``texts[b, :text_len[b]]`` and which gained
``new[b, :new_lens[b]]`` this step. :meth:`RequestDrafts.step` appends the new
tokens to each row's automaton and drafts for every row in one
``SpecEngine.extend`` call.

Where vLLM says when a request arrives (the plugin sees the scheduler's new
requests before the forward that prefills them), :meth:`RequestDrafts.start`
builds its automaton on a background thread, without the GIL, while vLLM
prefills; the first step that drafts for it waits only for what is not built
yet. A request the first step does not know (it arrived unannounced, or its
text is not what its automaton holds, e.g. after a skipped step) is built
there from ``texts``: exact, only slower.

The hot path, a batch of the same requests in the same rows as at the last
step each continuing where it stopped, is checked with one list comparison and
one jitted pass that also gathers the new tokens; no Python loop runs over the rows.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ... import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from ...engine import SpecEngine
from ...rules import check_length_rule, draft_length
from ...pool import RequestPool

#: With a pool, every this many steps the texts of requests finished since the last
#: publish become the rows' pool (built meanwhile in the background; see ``RequestPool.publish``).
POOL_PUBLISH_STEPS = 8


@njit(nogil=True, cache=True)
def _live_rows(text_len, new, new_lens, k1, row_end, n_last, rows, before, lens, acc):
    """Gather the rows with new tokens (``new_lens[b] > 0``) into ``rows``,
    ``before`` (text lengths), ``lens`` and ``acc`` (their tokens). Returns
    ``(n, same)``: how many, and whether their text lengths equal
    ``row_end[:n_last]`` (each continues where the last step left it); ``n = -1``
    when a length is outside ``[0, k1]``."""
    n = 0
    for b in range(new_lens.shape[0]):
        s = new_lens[b]
        if s < 0 or s > k1 or s > new.shape[1]:
            return -1, False
        if s == 0:
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
def _draft_counts(match, draft, min_match, rule, scale, lens, before, width, drafted, count, ends):
    """count[i]: how many of ``draft[i]`` row ``i`` proposes: 0 below ``min_match``,
    else the draft-length rule's length (``lengths.draft_length``; the row's
    accepted drafts at its last step are ``lens[i] - 1`` where ``drafted[i] > 0``),
    at most the real draft tokens (>= 0) and the room left below ``width``.
    Then ``ends[i] = before[i] + lens[i]`` and ``drafted[i] = count[i]``: the state the next step checks."""
    k = draft.shape[1]
    for i in range(match.shape[0]):
        n = 0
        if match[i] >= min_match:
            last = lens[i] - 1 if drafted[i] > 0 else -1
            n = min(draft_length(match[i], k, rule, scale, last), width - before[i] - lens[i])
            real = 0
            while real < n and draft[i, real] >= 0:
                real += 1
            n = real
        count[i] = n
        ends[i] = before[i] + lens[i]
        drafted[i] = n


class RequestDrafts:
    """Suffix-automaton drafts for a batch whose rows name their requests.

    Args:
        k: the most draft tokens a row may propose (>= 1).
        min_match: rows whose match is shorter than this many tokens draft nothing (>= 1).
        length_rule, length_scale: the draft-length rule (``saspec.rules``);
            ``per-match-recent`` reads each row's accepted drafts at its
            previous step from its new tokens.
        policy: the automaton's occurrence policy (``SpecEngine``), or None for its default.
        pool_tokens: a cross-request pool of this many tokens (0: none): each
            finished request's text joins it, and rows draft from it where their
            match there is longer than in their own text.
        ranks: tensor-parallel ranks drafting alike (>= 1). With more than one,
            the pool changes only every ``POOL_PUBLISH_STEPS`` steps, at a step
            count, which every rank sees alike (``RequestPool(manual=True)``; a
            publish waits if the build it shows is not done yet); with one, it
            changes as soon as a build is done and never waits.

    Raises:
        ValueError: ``k`` or ``min_match`` below 1, or an unknown rule or bad scale.
    """

    def __init__(self, k: int, *, min_match: int, length_rule: str, length_scale: float,
                 policy: str | None = None, pool_tokens: int = 0, ranks: int = 1) -> None:
        if int(k) < 1 or int(min_match) < 1:
            raise ValueError(f"k and min_match must be >= 1, got k={k}, min_match={min_match}")
        self.k, self.min_match = int(k), int(min_match)
        self.length_rule, self.length_scale = length_rule, float(length_scale)
        self._rule = check_length_rule(length_rule, length_scale)
        self.pool = RequestPool(pool_tokens, manual=ranks > 1) if pool_tokens else None
        self.engine = SpecEngine(pool=self.pool) if policy is None else SpecEngine(policy=policy, pool=self.pool)
        self._steps = 0
        self._len: dict[Hashable, int] = {}  # tokens in each built request's automaton
        self._pending: dict[Hashable, Future] = {}  # builds started by start(), not yet waited for
        self._dropped: set[Hashable] = set()  # finished while their build ran: freed when it ends
        self._built: set[Hashable] = set()  # built ahead, not yet taken by a step
        self._expected: dict[Hashable, int] = {}  # tokens a started request may reach (prompt + max_tokens)
        self._lock = threading.Lock()
        self._builder: ThreadPoolExecutor | None = None
        self._rows: list[Hashable] = []  # the batch of the last step, in row order
        self._grow(0)  # _ends / _drafted: each of those rows' text length after that step, and its draft tokens
        self.stats = {"built": 0, "built_ahead": 0, "rebuilt": 0, "waited": 0, "finished": 0, "pool_rows": 0}
        self.branched = np.zeros(0, np.int32)  # the last step's branch flags (see step)

    # -- lifecycle --------------------------------------------------------------

    def start(self, rid: Hashable, prompt: Any, expected_new_tokens: int | None = None) -> None:
        """Build ``rid``'s automaton from ``prompt`` (1-D token ids) on a background
        thread, so it overlaps the prefill; returns at once. A known id is left as it is."""
        if rid in self._len or rid in self._pending:
            return
        tokens = np.array(prompt, dtype=np.int32)  # a copy: the caller's buffer may change while we build
        if self._builder is None:
            self._builder = ThreadPoolExecutor(1, thread_name_prefix="saspec-build")
        if expected_new_tokens is not None:
            self._expected[rid] = tokens.shape[0] + int(expected_new_tokens)
        self._pending[rid] = self._builder.submit(self._build, rid, tokens, expected_new_tokens)

    def _build(self, rid: Hashable, tokens: np.ndarray, expected_new_tokens: int | None) -> int:
        added = self.engine.add_request(rid, tokens, expected_new_tokens)
        with self._lock:  # finish() decides under this lock too, so a build is freed exactly once
            if rid in self._dropped:  # finished while we built
                self._dropped.discard(rid)
                if added:
                    self.engine.remove_request(rid)
            elif added:
                self._built.add(rid)
        return tokens.shape[0]

    def finish(self, rid: Hashable) -> None:
        """Free ``rid``'s automaton (the request finished, or was aborted); unknown ids are ignored."""
        with self._lock:
            fut = self._pending.pop(rid, None)
            if rid in self._built:  # built, not yet taken by a step
                self._built.discard(rid)
                self.engine.remove_request(rid)
            elif fut is not None and not fut.cancel():
                self._dropped.add(rid)  # being built: _build frees it
        if rid in self._rows:
            self._flush()
            self._rows = []  # the next step prepares its batch again
        self._expected.pop(rid, None)
        if self._len.pop(rid, None) is not None:
            self.engine.remove_request(rid)
            self.stats["finished"] += 1
        elif fut is not None:
            self.stats["finished"] += 1

    def __contains__(self, rid: object) -> bool:
        return rid in self._len or rid in self._pending or rid in self._rows

    def __len__(self) -> int:
        """Requests with an automaton, built or being built."""
        return len(self._len) + len(self._pending)

    # -- each step ----------------------------------------------------------------

    def step(self, rids: Sequence[Hashable], text_len: np.ndarray, new: np.ndarray, new_lens: np.ndarray,
             texts: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Append each row's new tokens and draft for every row.

        Args:
            rids: B request ids, in row order, all different among the rows with new tokens.
            text_len: int32 [B]: each row's text length before this step's tokens.
            new: int32 [B, >= max(new_lens)]: each row's new tokens first.
            new_lens: int32 [B], 0..k+1: how many of ``new[b]`` are real; a
                row with 0 (still in prefill) is left alone and drafts nothing.
            texts: int32 [>= B, >= text_len[b]]: row ``b``'s text in
                ``texts[b, :text_len[b]]``, read only to build a request this
                class does not have at that length.
            width: no draft runs past this many tokens of text (vLLM's ``max_model_len``).

        Raises:
            ValueError: lengths of the wrong size or above ``k + 1``, or an id
                twice among the live rows; nothing changes.

        Returns:
            ``(match, draft, count)``: int32 [B] match lengths, int32 [B, k]
            drafts and int32 [B] how many of ``draft[b]`` the row proposes (0
            for skipped rows and matches below ``min_match``). Views into
            buffers the next call overwrites, as is ``self.branched`` (int32 [B]:
            ``SpecEngine.extend``'s ``branch_out``, 0 for skipped rows).
        """
        b_all = len(rids)
        self._grow(b_all)
        if new_lens.shape[0] != b_all or text_len.shape[0] != b_all:
            raise ValueError(f"{b_all} rows need text_len and new_lens of {b_all} entries")
        n, same = _live_rows(text_len, new, new_lens, self.k + 1, self._ends, len(self._rows), self._live,
                             self._before, self._lens, self._acc)
        if n < 0:
            raise ValueError(f"new_lens must be in [0, k + 1 = {self.k + 1}] and fit new's {new.shape[1]} columns")
        rows = self._live[:n]
        act_rids = rids if n == b_all else [rids[i] for i in rows.tolist()]
        before, lens = self._before[:n], self._lens[:n]
        match, draft, count, drafted = self._match[:n], self._draft[:n], self._count[:n], self._drafted[:n]
        if not (same and act_rids == self._rows):  # else the hot path: the same requests, each where it stopped
            drafted[:] = self._catch_up(act_rids, before, rows, texts)
        if self.pool is not None and self.pool.manual:
            if self._steps % POOL_PUBLISH_STEPS == 0:
                self.pool.publish()
            self._steps += 1
        if n:
            src = self._src[:n] if self.pool is not None else None
            self.engine.extend(self._acc[:n], lens, match, draft, src, self._branch[:n])
            if src is not None:
                self.stats["pool_rows"] += int(np.count_nonzero(src))
        _draft_counts(match, draft, self.min_match, self._rule, self.length_scale, lens, before, width, drafted,
                      count, self._ends)
        if n == b_all:
            self.branched = self._branch[:n]
            return match, draft, count
        m_out, d_out, c_out = self._out_match[:b_all], self._out_draft[:b_all], self._out_count[:b_all]
        m_out[:], c_out[:], d_out[:] = 0, 0, -1
        m_out[rows], d_out[rows], c_out[rows] = match, draft, count
        self.branched = self._out_branch[:b_all]
        self.branched[:] = 0
        self.branched[rows] = self._branch[:n]
        return m_out, d_out, c_out

    def _flush(self) -> None:
        """Record the last batch's lengths in ``_len`` (the hot path keeps them only in ``_ends``)."""
        self._len.update(zip(self._rows, self._ends[: len(self._rows)].tolist()))

    def _catch_up(self, rids: list[Hashable], before: np.ndarray, rows: np.ndarray, texts: np.ndarray) -> np.ndarray:
        """Make every live row's automaton (rows ``rows`` of ``texts``) hold exactly
        its text before this step and prepare the batch. Returns int32 [rows]:
        the draft tokens each proposed at the last step, 0 where it was not in
        that batch or its automaton was (re)built now."""
        if len(set(rids)) != len(rids):
            dup = next(r for i, r in enumerate(rids) if r in rids[:i])
            raise ValueError(f"request {dup!r} appears twice in the batch")
        self._flush()
        if self._pending:  # builds started ahead: wait for those still running (usually none)
            for rid in [r for r in rids if r in self._pending]:
                fut = self._pending.pop(rid)
                if not fut.done():
                    self.stats["waited"] += 1
                self._len[rid] = fut.result()
                with self._lock:
                    self._built.discard(rid)
                self.stats["built_ahead"] += 1
        have = np.fromiter((self._len.get(r, -1) for r in rids), np.int64, len(rids))
        for i in np.flatnonzero(have != before).tolist():  # unknown, or a gap (a step vLLM did not show us)
            rid, want = rids[i], int(before[i])
            if have[i] >= 0:  # still live: its partial text must not join the pool
                self.engine.remove_request(rid, to_pool=False)
                self.stats["rebuilt"] += 1
            more = self._expected.get(rid, 0) - want
            self.engine.add_request(rid, texts[int(rows[i]), :want], more if more > 0 else None)
            self._len[rid] = want
            self.stats["built"] += 1
        prev = dict(zip(self._rows, self._drafted[: len(self._rows)].tolist()))
        drafted_before = np.fromiter((prev.get(r, 0) for r in rids), np.int32, len(rids))
        drafted_before[have != before] = 0
        self.engine.prepare(rids)
        self._rows = list(rids)
        return drafted_before

    def _grow(self, rows: int) -> None:
        """Buffers for at least ``rows`` rows (kept across steps: ``_ends`` and
        ``_drafted`` hold the last step's state in their first ``len(_rows)`` entries)."""
        have = self._acc.shape[0] if hasattr(self, "_acc") else 0
        if rows <= have and have:
            return
        cap = max(rows, 2 * have, 8)
        k = self.k
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
        self._branch = np.zeros(cap, np.int32)
        self._out_branch = np.zeros(cap, np.int32)
        self._out_match = np.zeros(cap, np.int32)
        self._out_draft = np.zeros((cap, k), np.int32)
        self._out_count = np.zeros(cap, np.int32)
