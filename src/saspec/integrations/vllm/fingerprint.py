"""FingerprintRows: which request each batch row holds, from the arrays alone.

vLLM's ``custom_class`` interface passes no request ids and no "finished"
signal, and vLLM moves rows: a finished or preempted request's row is filled
by moving the last row into it, rows may be swapped, and a preempted request
comes back later, in any row, after a new prefill. Where saspec's plugin runs
(``plugin``), vLLM's own request ids name the rows and this module is not
used; it is the fallback for a ``custom_class`` drafter without the plugin.

Each tracked request keeps a fingerprint: its length ``L``, a 64-bit FNV-1a
hash of its first ``min(HEAD, L)`` tokens and of ``SPREAD`` tokens at evenly
spread positions (``L * i // (SPREAD + 1)``), a copy of its last
``min(TAIL, L)`` tokens, and a running FNV-1a hash of its whole text, updated
with each appended token. At each step, for a row with ``s > 0`` tokens added
and ``n`` tokens of text:

* **continuing**: the request tracked at the row has ``L == n - s`` and the
  row's ``[:n - s]`` has its hash and tail; decided for all rows at once by
  one jitted pass that also gathers the new tokens;
* **moved or resumed**: otherwise the row's ``(n - s, hash)`` is looked up
  among the requests no row continued (those whose row now holds something
  else, kept in a bounded detached set) and confirmed by the tail and the whole-text
  hash; the request takes the row;
* **new**: anything unexplained is a new request (its automaton is built from
  the row's text);
* **prefill**: a row with no tokens added is a prefill chunk, and vLLM has
  already written the whole prompt into it: a row that holds no tracked
  request of that text gets one, whose automaton is built on a background
  thread while the prefill runs. Its first decode step finds it continuing.

Two texts with one length, head, tail and spread positions (a long shared
system prompt, the same closing tokens, differences only between the sampled
positions) pass the continuing check for each other, e.g. when a finished
request's row is refilled by such a sibling. So the rows' whole texts are
audited in turn against their requests' running hashes, one row at a time,
at ``AUDIT_TOKENS`` tokens of hashing per step on average: a mix-up lasts at
most about ``B * ceil(L / AUDIT_TOKENS)`` steps for B rows of L tokens (B steps
for texts up to 4,096 tokens), costs only drafts (vLLM verifies every one),
and is then resolved exactly, since a reclaim always checks the whole text.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

from ... import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

#: Tokens at the start of a request hashed into its fingerprint.
HEAD = 32
#: Tokens at evenly spread positions of a request's text hashed into its fingerprint.
SPREAD = 16
#: Tokens at the end of a request's text compared exactly before appending.
TAIL = 16
#: Tokens of whole-text audit hashing earned per step: a row of L tokens is audited once ``ceil(L / AUDIT_TOKENS)``
#: steps have passed since the last audit, so the audit costs O(AUDIT_TOKENS) per step on average.
AUDIT_TOKENS = 4096

# Row states written by ``_classify``.
SKIP = 0  # no sampled tokens (prefill, or a row vLLM discarded this step), or a negative id: no draft
CONTINUE = 1  # the request tracked at this row, extended by the sampled tokens
UNMATCHED = 2  # needs a fingerprint lookup (moved, resumed or new)
PREFILL = 3  # no sampled tokens yet: a prefill chunk of the request (being) built from the row's text
NEW_PREFILL = 4  # a prefill row that holds no tracked request: start building one

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(nogil=True, cache=True)
def _fnv(h, row, lo, hi):
    """FNV-1a over ``row[lo:hi]`` (int32 tokens), continuing from ``h``."""
    for j in range(lo, hi):
        h = (h ^ np.uint64(np.uint32(row[j]))) * _FNV_PRIME
    return h


@njit(nogil=True, cache=True)
def _fingerprint_hash(row, n):
    """FNV-1a over the first ``min(HEAD, n)`` tokens of ``row[:n]`` and the
    ``SPREAD`` tokens at positions ``n * i // (SPREAD + 1)``, ``i = 1..SPREAD``."""
    h = _fnv(_FNV_OFFSET, row, 0, min(HEAD, n))
    for i in range(1, SPREAD + 1):
        h = (h ^ np.uint64(np.uint32(row[(n * i) // (SPREAD + 1)]))) * _FNV_PRIME
    return h


@njit(nogil=True, cache=True)
def _whole_hash(row, n):
    return _fnv(_FNV_OFFSET, row, 0, n)


@njit(nogil=True, cache=True)
def _commit(token_ids, num_tokens, lens, status, hash_new, row_len, row_hash, row_tail, row_whole):
    """Record the fingerprints of the rows ``b < lens.shape[0]`` that hold a request after
    this step (status CONTINUE, UNMATCHED or NEW_PREFILL): lengths ``num_tokens[b]``,
    hashes ``hash_new[b]``, tails, and the whole-text hashes advanced over the
    row's ``lens[b]`` new tokens."""
    for b in range(lens.shape[0]):
        if status[b] == SKIP or status[b] == PREFILL:
            continue
        n = num_tokens[b]
        row = token_ids[b]
        row_len[b] = n
        row_hash[b] = hash_new[b]
        row_whole[b] = _fnv(row_whole[b], row, n - lens[b], n)
        w = min(TAIL, n)
        for j in range(w):
            row_tail[b, j] = row[n - w + j]


@njit(nogil=True, cache=True)
def _classify(token_ids, num_tokens, lens, row_rid, row_len, row_hash, row_tail, row_whole, audit, status,
              hash_old, hash_new):
    """Classify rows ``b < B = lens.shape[0]`` (rows without tokens: PREFILL when
    the row's request is already tracked at the row's text, else NEW_PREFILL).

    token_ids: int32 [R, width] (vLLM's ``token_ids_cpu``, read in place);
    num_tokens: int32 [>= B]; lens: int32 [B] tokens added per row; row_*: the
    tracked requests' fingerprints by row (row_rid int64 with -1 for none,
    row_len int32, row_hash uint64, row_tail int32 [R', TAIL], row_whole
    uint64); audit: the row whose whole text is checked this step. Writes
    status int8 [>= B] and hash_old / hash_new uint64 [>= B] (fingerprint
    hashes of the text before / after this step's tokens), and 0 to
    ``lens[b]`` where a row is skipped. Returns ``(slow, named, continued)``:
    rows needing Python this step (unmatched or new prefill rows, and tracked
    requests no row continued), rows that get an id back, and rows continued.
    Where no row needs Python, the rows' fingerprints are committed too
    (:func:`_commit`): the common step is one call.
    """
    for b in range(lens.shape[0]):
        s = lens[b]
        n = num_tokens[b]
        n_old = n - s
        status[b] = SKIP
        if s < 0 or n_old < 1 or n > token_ids.shape[1]:
            continue
        row = token_ids[b]
        if s == 0:  # a prefill chunk: the row already holds the whole prompt
            for j in range(n):
                if row[j] < 0:
                    break
            else:
                h = _fingerprint_hash(row, n)
                hash_old[b] = h
                hash_new[b] = h
                status[b] = NEW_PREFILL
                if b < row_rid.shape[0] and row_rid[b] >= 0 and row_len[b] == n and row_hash[b] == h:
                    status[b] = PREFILL
            continue
        bad = False
        for j in range(n_old, n):
            if row[j] < 0:  # not a token (a placeholder): no draft for this row this step
                bad = True
        if bad:
            continue
        h_old = _fingerprint_hash(row, n_old)
        hash_old[b] = h_old
        hash_new[b] = _fingerprint_hash(row, n)
        status[b] = UNMATCHED
        if b >= row_rid.shape[0] or row_rid[b] < 0 or row_len[b] != n_old or row_hash[b] != h_old:
            continue
        w = min(TAIL, n_old)
        same = True
        for j in range(w):
            if row_tail[b, j] != row[n_old - w + j]:
                same = False
                break
        if same and b == audit and _whole_hash(row, n_old) != row_whole[b]:
            same = False
        if same:
            status[b] = CONTINUE
    slow = named = continued = 0
    for b in range(row_rid.shape[0]):
        st = status[b] if b < lens.shape[0] else SKIP
        if st == SKIP and b < lens.shape[0]:
            lens[b] = 0
        if st == UNMATCHED or st == NEW_PREFILL:
            slow += 1
        elif row_rid[b] >= 0 and st != CONTINUE and st != PREFILL:
            slow += 1
        if st == CONTINUE or st == UNMATCHED:
            named += 1
        continued += st == CONTINUE
    if slow == 0:
        _commit(token_ids, num_tokens, lens, status, hash_new, row_len, row_hash, row_tail, row_whole)
    return slow, named, continued


class _Detached:
    """A tracked request that no row holds now, with its fingerprint."""

    __slots__ = ("rid", "length", "hash", "tail", "whole")

    def __init__(self, rid: int, length: int, hash_: int, tail: np.ndarray, whole: int) -> None:
        self.rid, self.length, self.hash, self.tail, self.whole = rid, length, hash_, tail, whole


class FingerprintRows:
    """Rows to requests by fingerprint (see the module docstring).

    Args:
        max_detached: requests that left their rows (finished, preempted or
            moved) kept for a possible resume; beyond it the oldest is dropped
            and ``on_drop(rid)`` frees it.
        on_drop: called with each dropped request id.

    Attributes:
        stats: ``continued``, ``reclaimed`` (moved or resumed rows found by
            fingerprint), ``new`` and ``freed`` (dropped) counts.
    """

    def __init__(self, max_detached: int, on_drop: Callable[[Hashable], None]) -> None:
        self.max_detached = int(max_detached)
        self._on_drop = on_drop
        self._next_rid = 0
        self._row_rid = np.full(0, -1, np.int64)
        self._row_len = np.zeros(0, np.int32)
        self._row_hash = np.zeros(0, np.uint64)
        self._row_tail = np.zeros((0, TAIL), np.int32)
        self._row_whole = np.zeros(0, np.uint64)
        self._audit = 0  # the row whose whole text the next audit checks
        self._audit_credit = 0  # audit tokens earned since the last audit
        self.started: list[tuple[int, int, int]] = []  # prefill rows of the last assign: (rid, row, tokens)
        self._detached: OrderedDict[int, _Detached] = OrderedDict()  # rid -> fingerprint, oldest first
        self._by_key: dict[tuple[int, int], list[int]] = {}  # (length, fingerprint hash) -> rids in the detached set
        self.stats = {"continued": 0, "reclaimed": 0, "new": 0, "freed": 0}

    @property
    def pooled(self) -> int:
        """Requests that left their rows and are kept for a possible resume."""
        return len(self._detached)

    def assign(self, token_ids: np.ndarray, num_tokens: np.ndarray, lens: np.ndarray) -> list[int | None]:
        """The request id of each of the ``B = lens.shape[0]`` rows with tokens,
        None for a row to skip (prefill, or placeholders; ``lens[b]`` is set to
        0 for those). A new request gets a fresh int id: its automaton is the
        caller's to build. A prefill row (no tokens: vLLM has written the whole
        prompt) that holds no tracked request gets one too, listed in
        ``self.started`` as ``(rid, row, tokens)``: the caller starts building
        it from ``token_ids[row, :tokens]``, so it is ready at its first decode step."""
        b_live = lens.shape[0]
        self._grow(b_live)
        status = self._status
        slow, named, continued = _classify(token_ids, num_tokens, lens, self._row_rid, self._row_len, self._row_hash,
                                           self._row_tail, self._row_whole, self._next_audit(b_live), status,
                                           self._hash_old, self._hash_new)
        self.started = []
        self.stats["continued"] += continued
        if slow:
            self._settle(token_ids, num_tokens, lens, status[:b_live], self._hash_old[:b_live])
            _commit(token_ids, num_tokens, lens, status, self._hash_new, self._row_len, self._row_hash, self._row_tail,
                    self._row_whole)
        rids = self._row_rid[:b_live].tolist()
        if named == b_live and not slow:
            return rids
        return [r if st == CONTINUE or st == UNMATCHED else None for st, r in zip(status[:b_live].tolist(), rids)]

    def _next_audit(self, b_live: int) -> int:
        """The row whose whole text this step checks (round robin), or -1 while the
        credit of ``AUDIT_TOKENS`` per step has not yet paid for its length."""
        self._audit_credit += AUDIT_TOKENS
        row = self._audit % b_live
        if self._audit_credit < int(self._row_len[row]):
            return -1
        self._audit_credit = 0
        self._audit = row + 1
        return row

    def _settle(self, token_ids: np.ndarray, num_tokens: np.ndarray, lens: np.ndarray, status: np.ndarray,
                hash_old: np.ndarray) -> None:
        """The rows one jitted pass could not explain: departures to the detached set,
        moved or resumed requests taken back, new requests (and prefill rows) given ids."""
        b_live = lens.shape[0]
        cont = np.zeros(self._row_rid.shape[0], bool)
        cont[:b_live] = (status == CONTINUE) | (status == PREFILL)
        for r in np.flatnonzero((self._row_rid >= 0) & ~cont):  # left its row: finished, moved or preempted
            self._detach(int(r))
        for b in np.flatnonzero(status == UNMATCHED).tolist():
            n, s = int(num_tokens[b]), int(lens[b])
            row = token_ids[b]
            rid = self._reclaim(row, n - s, int(hash_old[b]))
            if rid is not None:
                self._row_whole[b] = _whole_hash(row, n - s)  # equal to the detached request's (checked)
                self.stats["reclaimed"] += 1
            elif row[:n].min() >= 0:
                rid = self._next_rid
                self._next_rid += 1
                self._row_whole[b] = _whole_hash(row, n - s)
                self.stats["new"] += 1
            else:  # placeholders in the text: leave the row untracked
                status[b] = SKIP
                lens[b] = 0
                continue
            self._row_rid[b] = rid
        for b in np.flatnonzero(status == NEW_PREFILL).tolist():
            n = int(num_tokens[b])
            rid = self._reclaim(token_ids[b], n, int(hash_old[b]))  # a resumed request: its automaton is kept
            if rid is not None:
                self.stats["reclaimed"] += 1
            else:  # build it while vLLM prefills it
                rid = self._next_rid
                self._next_rid += 1
                self.started.append((rid, b, n))
                self.stats["new"] += 1
            self._row_rid[b] = rid
            self._row_whole[b] = _whole_hash(token_ids[b], n)
        self._evict()

    def _grow(self, rows: int) -> None:
        more = rows - self._row_rid.shape[0]
        if more <= 0:
            return
        self._row_rid = np.concatenate([self._row_rid, np.full(more, -1, np.int64)])
        self._row_len = np.concatenate([self._row_len, np.zeros(more, np.int32)])
        self._row_hash = np.concatenate([self._row_hash, np.zeros(more, np.uint64)])
        self._row_tail = np.concatenate([self._row_tail, np.zeros((more, TAIL), np.int32)])
        self._row_whole = np.concatenate([self._row_whole, np.zeros(more, np.uint64)])
        self._status = np.zeros(self._row_rid.shape[0], np.int8)  # this step's, per row (scratch)
        self._hash_old = np.zeros(self._row_rid.shape[0], np.uint64)
        self._hash_new = np.zeros(self._row_rid.shape[0], np.uint64)

    def _detach(self, row: int) -> None:
        """Move row ``row``'s request into the detached set (newest last)."""
        rid = int(self._row_rid[row])
        length = int(self._row_len[row])
        tail = self._row_tail[row, : min(TAIL, length)].copy()
        entry = _Detached(rid, length, int(self._row_hash[row]), tail, int(self._row_whole[row]))
        self._detached[rid] = entry
        self._by_key.setdefault((entry.length, entry.hash), []).append(rid)
        self._row_rid[row] = -1

    def _reclaim(self, row: np.ndarray, length: int, hash_: int) -> int | None:
        """The detached request whose text is ``row[:length]`` (fingerprint, tail and
        whole-text hash), taken out of the detached set, with its row state restored; else None."""
        rids = self._by_key.get((length, hash_))
        if not rids:
            return None
        w = min(TAIL, length)
        tail = row[length - w : length]
        whole = None
        for i, rid in enumerate(rids):
            entry = self._detached[rid]
            if not np.array_equal(entry.tail, tail):
                continue
            if whole is None:
                whole = int(_whole_hash(row, length))
            if entry.whole != whole:
                continue
            del rids[i]
            if not rids:
                del self._by_key[(length, hash_)]
            del self._detached[rid]
            return rid
        return None

    def _evict(self) -> None:
        """Drop the oldest detached requests beyond ``max_detached``."""
        while len(self._detached) > self.max_detached:
            rid, entry = self._detached.popitem(last=False)
            key = (entry.length, entry.hash)
            rids = self._by_key[key]
            rids.remove(rid)
            if not rids:
                del self._by_key[key]
            self._on_drop(rid)
            self.stats["freed"] += 1
