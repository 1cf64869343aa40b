"""RequestPool: one shared automaton over the texts of finished requests.

A request's own automaton knows only its prompt and output. Traffic also
repeats *across* requests (one instruction over many inputs, agent loops,
structured output), so a ``SpecEngine`` can be given a pool: when a request is
removed its text joins one shared automaton of at most ``max_tokens`` tokens,
and every batch row follows its text in the pool as well as in its own
automaton. A row drafts from the pool only where the pool's match is strictly
longer than its own: an own match of the same length is usually the better
copy source (the study in BENCHMARKS.md, "Cross-request pool", found that rule
never lost on any workload; prepending the pool to each request did).

How a row follows the pool: its match state ``(s, m)`` advances with each
accepted token by ``core.follow`` (matching a text against an automaton, O(1)
amortized), and the draft is the pool text after ``s``'s occurrence, up to the
separator that ends each pooled text (``core.continuation``, ``core.draft_from``).
The per-row state lives in the engine's host backend (``extend.pool_rows`` updates it each step).

Building never blocks a step. ``add`` queues a text; one background thread
per pool builds it in with the GIL released into a *copy* of the current
automaton, then swaps the copy in. Copying keeps every state's number, so the
rows' match states stay valid across the swap (an appended text can only add
occurrences: ``core.follow`` keeps a match real though perhaps not the longest
until it is next broken). When the texts would exceed ``max_tokens`` the oldest
are dropped, down to 3/4 of it (so this happens once per quarter of the pool),
and the automaton is rebuilt from the texts kept; that changes the state
numbers, so it bumps ``epoch``, and each row re-finds its match from its own
last ``sync_tokens`` tokens at its next step (O(sync_tokens) once per
rebuild). Memory: the automaton and the texts (bytes per pooled token: BENCHMARKS.md,
"Cross-request pool"), and during a build one more copy of the automaton.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from . import build, core
from .arena import address, blob_bytes
from .validate import as_tokens, check_int

SEPARATOR = core.SEPARATOR  # ends each pooled text: drafts stop there
DEFAULT_SYNC_TOKENS = 256
# Of several earlier occurrences, copy from the first: measured as good as the most recent or better on
# every recorded workload (BENCHMARKS.md, "Cross-request pool"), and its builds update no positions.
POOL_POLICY = "first"


class RequestPool:
    """A bounded automaton over finished requests' texts, shared by the rows of one or more engines.

    Args:
        max_tokens: most tokens the pool holds (separators included); the
            oldest texts are dropped first. An int >= 1.
        prompts: pool each request's prompt with its output (default: the
            output only; BENCHMARKS.md, "Cross-request pool", has both).
        sync_tokens: how many of a row's last tokens it re-matches after a
            rebuild or when it first meets the pool; pool matches found that
            way are at most this long until they grow. An int >= 1.
        manual: texts are built, and the engines see them, only at
            ``publish()`` calls (see there) instead of as soon as they are
            built: for callers whose drafts must not depend on a background
            thread's timing (tensor-parallel ranks must draft alike).

    Raises:
        TypeError, ValueError: an argument is not an int in range.
    """

    def __init__(self, max_tokens: int, *, prompts: bool = False, sync_tokens: int = DEFAULT_SYNC_TOKENS,
                 manual: bool = False) -> None:
        self.max_tokens = check_int(max_tokens, "max_tokens", 2)
        self.sync_tokens = check_int(sync_tokens, "sync_tokens", 1)
        self.prompts = bool(prompts)
        self.manual = bool(manual)
        self._waiting: list[np.ndarray] = []  # manual: added since the last publish()
        self._policy = build.policy_code(POOL_POLICY)
        self._depth = build.DEFAULT_RECENT_DEPTH
        self._cond = threading.Condition()
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0  # with their separators: kept <= max_tokens (add drops the oldest)
        self._building = False
        self._texts: deque[np.ndarray] = deque()  # the pooled texts, oldest first
        self._held = 0  # their tokens, one separator each included
        # (blob, epoch, the blob's address): read once per step by the engines; replaced whole by the
        # builder (manual: by publish()); _latest is the builder's newest, which its next build copies
        empty = build.new_blob(0)
        self.current: tuple[np.ndarray, int, int] = (empty, 0, address(empty))
        self._latest = self.current
        self._stats = {"added": 0, "builds": 0, "rebuilds": 0, "evicted": 0}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- what an engine calls ----------------------------------------------------

    def add(self, tokens: Any, prompt_len: int = 0) -> None:
        """Queue a finished request's text (1-D token ids; its first ``prompt_len`` are its
        prompt, pooled only with ``prompts=True``). Returns at once: a background thread
        builds it in. Raises ``TypeError``/``ValueError`` for bad ids or ``prompt_len``,
        and re-raises a failure of an earlier build."""
        ids = as_tokens(tokens, "tokens")
        check_int(prompt_len, "prompt_len", 0)
        if prompt_len > ids.shape[0]:
            raise ValueError(f"prompt_len={prompt_len} is more than the text's {ids.shape[0]} tokens")
        text = ids if self.prompts else ids[prompt_len:]
        with self._cond:
            self._raise_failure()
            self._stats["added"] += 1
            if text.shape[0] == 0:
                return
            if self.manual:
                self._waiting.append(np.array(text, np.int32))
                held = sum(t.shape[0] + 1 for t in self._waiting)
                while held > self.max_tokens and len(self._waiting) > 1:  # would be evicted unbuilt
                    held -= self._waiting.pop(0).shape[0] + 1
                    self._stats["evicted"] += 1
                return
            self._queue([np.array(text, np.int32)])

    def publish(self) -> None:
        """Manual pools: make what the builder built from the texts of the previous call the
        engines' pool, then start building the texts added since. It waits only if that
        build is still running (called every few decode steps, it has had them to finish).
        Every caller that adds the same texts between the same calls sees the same pool."""
        if not self.manual:
            raise RuntimeError("publish() is for RequestPool(manual=True); this pool publishes each build")
        with self._cond:
            self._cond.wait_for(lambda: not self._pending and not self._building or self._error)
            self._raise_failure()
            self.current = self._latest
            waiting, self._waiting = self._waiting, []
            if waiting:
                self._queue(waiting)

    def _queue(self, texts: list[np.ndarray]) -> None:
        """Hand texts to the builder (under the lock), dropping the oldest beyond the bound."""
        for t in texts:
            self._pending.append(t)
            self._pending_tokens += t.shape[0] + 1
        while self._pending_tokens > self.max_tokens and len(self._pending) > 1:  # would be evicted unbuilt
            self._pending_tokens -= self._pending.pop(0).shape[0] + 1
            self._stats["evicted"] += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="saspec-pool", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every text handed to the builder is built in (manual pools: those of
        the last ``publish()``, not yet seen by the engines); False if ``timeout`` (s) passed first."""
        with self._cond:
            done = self._cond.wait_for(lambda: not self._pending and not self._building or self._error, timeout)
            self._raise_failure()
            return bool(done)

    # -- inspection ----------------------------------------------------------------

    def texts(self) -> list[np.ndarray]:
        """Copies of the texts built into the pool (manual pools: the newest build, which the
        engines see from the next ``publish()``), oldest first (for tests and inspection)."""
        with self._cond:
            return [t.copy() for t in self._texts]

    @property
    def tokens(self) -> int:
        """Tokens in the built pool (separators included)."""
        return int(self.current[0][core.H_N])

    def stats(self) -> dict[str, int]:
        """``texts`` and ``tokens`` pooled, ``bytes`` (automaton + texts), ``pending`` texts,
        and counters: ``added``, ``builds``, ``rebuilds`` (evictions), ``evicted`` texts."""
        with self._cond:
            blob, epoch, _ = self.current
            return {"texts": len(self._texts), "tokens": int(blob[core.H_N]),
                    "bytes": blob_bytes(blob) + 4 * sum(t.shape[0] for t in self._texts),
                    "pending": len(self._pending), "epoch": epoch, **self._stats}

    # -- the builder thread ----------------------------------------------------------

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise RuntimeError("saspec: building the request pool failed") from self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending)
                batch, self._pending, self._pending_tokens = self._pending, [], 0
                self._building = True
            try:
                self._build(batch)
            except BaseException as exc:  # surfaced by the next add() or flush()
                with self._cond:
                    self._error = exc
                    self._building = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._building = False
                self._cond.notify_all()

    def _build(self, batch: list[np.ndarray]) -> None:
        cap = self.max_tokens
        batch = [t[-(cap - 1):] for t in batch]  # a text longer than the pool keeps its end
        new = sum(t.shape[0] + 1 for t in batch)
        blob, epoch, _ = self._latest
        if self._held + new <= cap:
            seq = _joined(batch)
            blob = build.ingest(build.copy_with_room(blob, seq.shape[0]), seq, self._policy, self._depth)
        else:  # drop the oldest texts, to 3/4 of the pool with the new ones, and rebuild
            texts = list(self._texts) + batch
            keep, held = [], 0
            for t in reversed(texts):
                if held + t.shape[0] + 1 > (3 * cap) // 4 and keep:
                    break
                keep.append(t)
                held += t.shape[0] + 1
            keep.reverse()
            dropped = len(texts) - len(keep)
            seq = _joined(keep)
            blob = build.ingest(build.new_blob(seq.shape[0], 0), seq, self._policy, self._depth)
            with self._cond:
                self._texts = deque()
                self._held = 0
                self._stats["rebuilds"] += 1
                self._stats["evicted"] += dropped
            batch = keep
            epoch += 1
        with self._cond:
            self._texts.extend(batch)
            self._held += sum(t.shape[0] + 1 for t in batch)
            self._latest = (blob, epoch, address(blob))
            if not self.manual:
                self.current = self._latest
            self._stats["builds"] += 1


def _joined(texts: list[np.ndarray]) -> np.ndarray:
    """The texts, each followed by ``SEPARATOR``, as one int32 array."""
    out = np.empty(sum(t.shape[0] + 1 for t in texts), np.int32)
    i = 0
    for t in texts:
        out[i: i + t.shape[0]] = t
        i += t.shape[0]
        out[i] = SEPARATOR
        i += 1
    return out
