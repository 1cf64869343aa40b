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

Lifecycle: ``add`` (an engine's ``remove_request`` calls it), ``publish`` (manual
pools), ``flush`` (wait for the builder), ``close`` (stop the builder; a context
manager calls it; an unreferenced pool is collected and its thread ends).

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

import logging
import threading
import weakref
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
POOL_OCCURRENCE = "first"
_log = logging.getLogger("saspec")


class RequestPool:
    """A bounded automaton over finished requests' texts, shared by the rows of one or more engines.

    Lifecycle: create it (or let ``SpecEngine(pool_tokens=...)`` create one it owns),
    hand it to engines, which ``add`` each removed request's text; ``close()`` it (or
    use it as a context manager) when no engine will step with it again: that stops
    its builder thread and drops queued texts. An engine closes a pool it created in
    its own ``close()``. A pool nobody references is collected like any object, and
    its thread then ends: the thread holds the pool only while it builds.

    A build that fails (e.g. ``MemoryError``) is reported, not raised: logged on the
    ``saspec`` logger and counted in ``stats()["failed_builds"]`` (its texts in
    ``"failed_texts"``); the pool keeps serving what it had built and builds later texts.

    Args:
        max_tokens: most tokens the pool holds (separators included); the
            oldest texts are dropped first (queued ones included). An int in
            [2, ``build.MAX_REQUEST_TOKENS``] (blob offsets are int32).
        prompts: pool each request's prompt with its output (default: the
            output only; BENCHMARKS.md, "Cross-request pool", has both).
        sync_tokens: how many of a row's last tokens it re-matches after a
            rebuild or when it first meets the pool; pool matches found that
            way are at most this long until they grow. An int in
            [1, ``build.MAX_REQUEST_TOKENS``] (no row holds more tokens).
        manual: texts are built, and the engines see them, only at
            ``publish()`` calls (see there) instead of as soon as they are
            built: for callers whose drafts must not depend on a background
            thread's timing (tensor-parallel ranks must draft alike).

    Raises:
        TypeError, ValueError: an argument is not an int in range.
    """

    def __init__(self, max_tokens: int, *, prompts: bool = False, sync_tokens: int = DEFAULT_SYNC_TOKENS,
                 manual: bool = False) -> None:
        self.max_tokens = check_int(max_tokens, "max_tokens", 2, build.MAX_REQUEST_TOKENS)
        # a row never holds more tokens, and the device backend keeps it in an int32 word
        self.sync_tokens = check_int(sync_tokens, "sync_tokens", 1, build.MAX_REQUEST_TOKENS)
        self.prompts = bool(prompts)
        self.manual = bool(manual)
        self._waiting: list[np.ndarray] = []  # manual: added since the last publish()
        self._waiting_tokens = 0  # with their separators
        self._waiting_drop = False  # some were dropped unbuilt: the built texts go with the next build
        self._occurrence = build.occurrence_code(POOL_OCCURRENCE)
        self._depth = build.DEFAULT_RECENT_DEPTH
        self._cond = threading.Condition()
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0  # with their separators: kept <= max_tokens (add drops the oldest)
        # Queued texts were dropped unbuilt: every built text, being older, goes at the next build.
        self._drop_built = False
        self._building = False
        self._texts: deque[np.ndarray] = deque()  # the pooled texts, oldest first
        self._held = 0  # their tokens, one separator each included
        # (blob, epoch, the blob's address): read once per step by the engines; replaced whole by the
        # builder (manual: by publish()); _latest is the builder's newest, which its next build copies
        empty = build.new_blob(0)
        self.current: tuple[np.ndarray, int, int] = (empty, 0, address(empty))
        self._latest = self.current
        self._stats = {"added": 0, "builds": 0, "rebuilds": 0, "evicted": 0, "failed_builds": 0, "failed_texts": 0}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # The thread sees the pool through a weak reference; this stops it once the pool is collected.
        weakref.finalize(self, _stop_builder, self._cond, self._stop)

    # -- what an engine calls ----------------------------------------------------

    def add(self, tokens: Any, prompt_len: int = 0) -> None:
        """Queue a finished request's text (1-D token ids; its first ``prompt_len`` are its
        prompt, pooled only with ``prompts=True``). Returns at once: a background thread
        builds it in. A text longer than the pool keeps its last ``max_tokens - 1`` tokens
        (a copy: the caller's array is not kept). Raises ``TypeError``/``ValueError`` for
        bad ids or ``prompt_len`` and ``RuntimeError`` after ``close()``."""
        ids = as_tokens(tokens, "tokens")
        check_int(prompt_len, "prompt_len", 0)
        if prompt_len > ids.shape[0]:
            raise ValueError(f"prompt_len={prompt_len} is more than the text's {ids.shape[0]} tokens")
        text = ids if self.prompts else ids[prompt_len:]
        text = np.array(text[-(self.max_tokens - 1):], np.int32)  # a text longer than the pool keeps its end
        with self._cond:
            if self._stop.is_set():
                raise RuntimeError("saspec: the request pool is closed")
            self._stats["added"] += 1
            if text.shape[0] == 0:
                return
            if self.manual:
                self._waiting.append(text)
                self._waiting_tokens += text.shape[0] + 1
                while self._waiting_tokens > self.max_tokens and len(self._waiting) > 1:  # would be evicted unbuilt
                    self._waiting_tokens -= self._waiting.pop(0).shape[0] + 1
                    self._stats["evicted"] += 1
                    self._waiting_drop = True
                return
            self._queue([text])

    def publish(self) -> None:
        """Manual pools: make what the builder built from the texts of the previous call the
        engines' pool, then start building the texts added since. It waits only if that
        build is still running (called every few decode steps, it has had them to finish).
        Every caller that adds the same texts between the same calls sees the same pool."""
        if not self.manual:
            raise RuntimeError("publish() is for RequestPool(manual=True); this pool publishes each build")
        with self._cond:
            self._cond.wait_for(lambda: not self._pending and not self._building or self._stop.is_set())
            self.current = self._latest
            waiting, self._waiting, self._waiting_tokens = self._waiting, [], 0
            drop, self._waiting_drop = self._waiting_drop, False
            if waiting and not self._stop.is_set():
                self._queue(waiting, drop)

    def _queue(self, texts: list[np.ndarray], drop_built: bool = False) -> None:
        """Hand texts to the builder (under the lock), dropping the oldest beyond the bound
        (and with them, at the next build, every built text: those are older still)."""
        self._drop_built |= drop_built
        for t in texts:
            self._pending.append(t)
            self._pending_tokens += t.shape[0] + 1
        while self._pending_tokens > self.max_tokens and len(self._pending) > 1:  # would be evicted unbuilt
            self._pending_tokens -= self._pending.pop(0).shape[0] + 1
            self._stats["evicted"] += 1
            self._drop_built = True
        if self._thread is None:
            self._thread = threading.Thread(target=_build_loop, args=(weakref.ref(self), self._cond, self._stop),
                                            name="saspec-pool", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every text handed to the builder is built in (manual pools: those of
        the last ``publish()``, not yet seen by the engines); False if ``timeout`` (s) passed
        first. Texts of a build that failed count as done (see ``stats()``)."""
        with self._cond:
            done = self._cond.wait_for(lambda: not self._pending and not self._building or self._stop.is_set(),
                                       timeout)
            return bool(done)

    def close(self) -> None:
        """Stop the builder thread (after the build it is running, if any) and drop queued
        texts. What was built stays readable (``current``, ``texts()``); ``add`` raises
        from now on. Idempotent; call it when no engine will use the pool again."""
        with self._cond:
            self._stop.set()
            self._pending, self._pending_tokens = [], 0
            self._waiting, self._waiting_tokens = [], 0
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._stop.is_set()

    def __enter__(self) -> RequestPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        """``texts`` and ``tokens`` pooled, ``bytes`` (the automata held, two for a manual
        pool whose newest build is not published yet, plus the texts), ``pending`` texts,
        and counters: ``added``, ``builds``, ``rebuilds`` (evictions), ``evicted`` texts,
        ``failed_builds`` and the ``failed_texts`` they dropped."""
        with self._cond:
            blob, epoch, _ = self.current
            held = blob_bytes(blob)
            if self._latest[0] is not blob:
                held += blob_bytes(self._latest[0])
            return {"texts": len(self._texts), "tokens": int(blob[core.H_N]),
                    "bytes": held + 4 * sum(t.shape[0] for t in self._texts),
                    "pending": len(self._pending) + len(self._waiting), "epoch": epoch, **self._stats}

    # -- the builder thread ----------------------------------------------------------

    def _take_batch(self) -> tuple[list[np.ndarray], bool]:
        """The queued texts and whether every built text goes (under the lock)."""
        batch, self._pending, self._pending_tokens = self._pending, [], 0
        drop, self._drop_built = self._drop_built, False
        self._building = True
        return batch, drop

    def _build_or_report(self, batch: list[np.ndarray], drop_built: bool) -> None:
        try:
            self._build(batch, drop_built)
        except Exception as exc:  # reported, not raised: the pool keeps what it has and builds on
            _log.error("saspec: building %d text(s) into the request pool failed; they are dropped",
                       len(batch), exc_info=exc)
            with self._cond:
                self._stats["failed_builds"] += 1
                self._stats["failed_texts"] += len(batch)
        finally:
            with self._cond:
                self._building = False
                self._cond.notify_all()

    def _build(self, batch: list[np.ndarray], drop_built: bool = False) -> None:
        cap = self.max_tokens
        new = sum(t.shape[0] + 1 for t in batch)
        blob, epoch, _ = self._latest
        if not drop_built and self._held + new <= cap:
            seq = _joined(batch)
            blob = build.ingest(build.copy_with_room(blob, seq.shape[0]), seq, self._occurrence, self._depth)
        else:  # drop the oldest texts, to 3/4 of the pool with the new ones, and rebuild
            texts = ([] if drop_built else list(self._texts)) + batch
            keep, held = [], 0
            for t in reversed(texts):
                if held + t.shape[0] + 1 > (3 * cap) // 4 and keep:
                    break
                keep.append(t)
                held += t.shape[0] + 1
            keep.reverse()
            dropped = len(texts) - len(keep) + (len(self._texts) if drop_built else 0)
            seq = _joined(keep)
            blob = build.ingest(build.new_blob(seq.shape[0], 0), seq, self._occurrence, self._depth)
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


def _stop_builder(cond: threading.Condition, stop: threading.Event) -> None:
    """Wake a pool's builder thread to end (its pool was collected)."""
    with cond:
        stop.set()
        cond.notify_all()


def _build_loop(ref: weakref.ref, cond: threading.Condition, stop: threading.Event) -> None:
    """A pool's builder thread. It holds the pool (``ref()``) only while it takes a
    batch and builds it, so a pool nobody else references is collected (and its
    finalizer sets ``stop``)."""
    while True:
        with cond:
            while True:
                if stop.is_set():
                    return
                pool = ref()
                if pool is None:
                    return
                if pool._pending:
                    batch, drop = pool._take_batch()
                    break
                del pool
                cond.wait()
        pool._build_or_report(batch, drop)
        del pool, batch


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
