"""DraftCatchUp: what a neural draft model that skips steps has read of each request, and what it reads next.

An engine's draft model keeps a KV cache that must hold every token of a row's
text before it drafts. Run every step, it costs a forward per step even where
every row takes the automaton's draft. An engine that skips it at such steps
keeps, per request, ``seen``: the first position whose draft KV is not known to
be right. When a row next takes a neural draft, the draft model's first forward
reads each row's unread span ``[seen, end)`` (its tokens from the engine's
token table and this step's accepted tokens) and samples at the row's next
token, at ``end`` (the extra slot); the drafting forwards after it run as
usual. :class:`DraftCatchUp` keeps ``seen`` and plans that forward
(:class:`CatchUpPlan`); the engine's adapter turns a plan into its own inputs
(vLLM's: ``saspec.integrations.vllm.catch_up``) and the Drafter charges the
catch-up (``Drafter.step``'s ``neural_behind`` and ``neural_first``, from
:meth:`DraftCatchUp.behind` and :meth:`DraftCatchUp.first_reads`).

Why positions below ``seen`` stay right: a forward writes its query's KV before
attending, its query starts at ``seen`` and its extra slot holds the text's
true token; only the drafting forwards write guesses, and they write past the
extra slot, where ``seen`` then stands. A request starts at ``seen = 0`` (a
prefix-cache hit may have shared blocks whose draft KV a skipped step left
unwritten; reading them again writes the same values).

One forward reads at most ``capacity`` tokens (the engine's buffers). Where
the unread spans need more, every row reads at least one token, the rows
taking a neural draft are served first, and a row left short reads part of its
span (its extra slot at the text's true next token) and takes no neural draft
this step.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernel below)
from numba import njit


@dataclass(frozen=True)
class CatchUpPlan:
    """One draft forward's inputs, on the host.

    Attributes:
        req_ids: the B rows' request ids.
        starts, stops: int32 [B]: row ``b`` reads positions ``[starts[b], stops[b])`` and its extra
            slot at ``stops[b]``.
        tokens: int32 [N]: the rows' tokens at those positions, row after row (N = sum of the spans).
        positions: int64 [N]: their positions.
        query_start: int32 [B + 1]: where each row's tokens start in ``tokens``.
        next_tokens: int32 [B]: each row's token at ``stops[b]`` (the extra slot).
        full: bool [B]: the row reads its whole span (its neural draft follows the text; else it is dropped).
    """

    req_ids: tuple
    starts: np.ndarray
    stops: np.ndarray
    tokens: np.ndarray
    positions: np.ndarray
    query_start: np.ndarray
    next_tokens: np.ndarray
    full: np.ndarray

    @property
    def read(self) -> int:
        """Tokens the forward reads (the spans and the extra slots)."""
        return int(self.tokens.shape[0]) + len(self.req_ids)


@njit(cache=True)
def _gather(token_ids, text_len, new, starts, stops, query_start, tokens, positions, next_tokens):
    """Each row's tokens at ``[starts[b], stops[b]]``: the token table below ``text_len[b]``, this step's
    new tokens from there on."""
    for b in range(starts.shape[0]):
        q = query_start[b]
        for p in range(starts[b], stops[b] + 1):
            t = token_ids[b, p] if p < text_len[b] else new[b, p - text_len[b]]
            if p < stops[b]:
                tokens[q] = t
                positions[q] = p
                q += 1
            else:
                next_tokens[b] = t


class DraftCatchUp:
    """What a draft model has read of each request, and the inputs of the forward that catches it up.

    Args:
        capacity: the most tokens one draft forward reads (e.g. vLLM's proposer's ``max_num_tokens``).

    Raises:
        ValueError: ``capacity`` is not an int >= 2.
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 2:
            raise ValueError(f"capacity must be an int >= 2 (tokens per draft forward), got {capacity!r}")
        self.capacity = int(capacity)
        self._seen: dict[Hashable, int] = {}

    def start(self, rid: Hashable) -> None:
        """A request (new, or resumed after preemption with fresh KV blocks): its draft KV holds nothing."""
        self._seen[rid] = 0

    def forget(self, rid: Hashable) -> None:
        """A finished request (unknown ids are ignored)."""
        self._seen.pop(rid, None)

    def starts(self, req_ids: Sequence[Hashable], ends: np.ndarray) -> np.ndarray:
        """int32 [B]: where each row's unread span starts (an unknown request: 0), at most ``ends - 1``
        so that every row reads at least its last known token."""
        seen = np.fromiter((self._seen.get(r, 0) for r in req_ids), np.int64, len(req_ids))
        return np.clip(seen, 0, np.maximum(ends.astype(np.int64) - 1, 0)).astype(np.int32)

    def behind(self, req_ids: Sequence[Hashable], ends: np.ndarray) -> int:
        """The tokens a draft forward at this step would read (each row's span and extra slot), at most
        ``capacity``."""
        need = ends.astype(np.int64) - self.starts(req_ids, ends)
        return int(min(int(need.sum()) + len(req_ids), self.capacity))

    def first_reads(self, req_ids: Sequence[Hashable], ends: np.ndarray) -> int:
        """Of :meth:`behind`, the tokens of rows the draft model has never read (their prompts)."""
        new = np.fromiter((self._seen.get(r, 0) == 0 for r in req_ids), bool, len(req_ids))
        return int(min(int(ends.astype(np.int64)[new].sum()), self.capacity))

    def plan(self, req_ids: Sequence[Hashable], ends: np.ndarray, want: np.ndarray, text_len: np.ndarray,
             token_ids: np.ndarray, new: np.ndarray, new_lens: np.ndarray) -> CatchUpPlan:
        """The draft forward of this step.

        Args:
            req_ids: the B rows' request ids.
            ends: int [B]: each row's next token's position (its extra slot; >= 1 where the row has text).
            want: bool [B]: rows that take a neural draft (served first where the capacity is short).
            text_len: int [B]: each row's tokens in ``token_ids`` (before this step's).
            token_ids: int [>= B, width]: each row's text in ``[:text_len[b]]``.
            new: int [B, W]: this step's tokens of each row, after its text.
            new_lens: int [B]: how many of them (0 for a prefill chunk, whose end is in its text).

        Raises:
            ValueError: arrays of other rows, an end outside ``[1, text_len + new_lens)``, a text longer
                than the token table, or a capacity below two tokens per row.
        """
        b = len(req_ids)
        ends = np.asarray(ends, np.int64)
        text_len = np.asarray(text_len, np.int64)
        new_lens = np.asarray(new_lens, np.int64)
        if ends.shape != (b,) or text_len.shape != (b,) or new_lens.shape != (b,) or new.shape[0] < b:
            raise ValueError(f"ends, text_len, new and new_lens need {b} rows")
        if b and (ends.min() < 1 or np.any(ends >= text_len + new_lens) or np.any(new_lens > new.shape[1])
                  or np.any(text_len > token_ids.shape[1]) or token_ids.shape[0] < b):
            raise ValueError("each row's end must be in [1, text_len + new_lens), its text inside the token table "
                             "and its new tokens inside new")
        if 2 * b > self.capacity:
            raise ValueError(f"{b} rows need at least {2 * b} tokens per draft forward; capacity is {self.capacity}")
        starts = self.starts(req_ids, ends)
        need = (ends - starts).astype(np.int64)
        span = need
        if int(need.sum()) + b > self.capacity:
            span = np.ones(b, np.int64)
            left = self.capacity - 2 * b
            order = np.concatenate([np.flatnonzero(want), np.flatnonzero(~np.asarray(want, bool))])
            for i in order.tolist():
                add = min(int(need[i]) - 1, left)
                span[i] += add
                left -= add
        stops = (starts + span).astype(np.int32)
        query_start = np.zeros(b + 1, np.int32)
        np.cumsum(span, out=query_start[1:])
        n = int(query_start[-1])
        tokens = np.empty(n, np.int32)
        positions = np.empty(n, np.int64)
        next_tokens = np.empty(b, np.int32)
        _gather(token_ids, text_len.astype(np.int32), np.ascontiguousarray(new[:b], np.int32), starts, stops,
                query_start, tokens, positions, next_tokens)
        return CatchUpPlan(tuple(req_ids), starts, stops, tokens, positions, query_start, next_tokens, span == need)

    def commit(self, plan: CatchUpPlan) -> None:
        """The plan's forward ran: each row's draft KV is right below its extra slot."""
        for rid, stop in zip(plan.req_ids, plan.stops.tolist()):
            self._seen[rid] = stop
