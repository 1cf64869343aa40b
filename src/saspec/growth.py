"""The growth of the CPU backend's full blobs: ahead of need on a background thread, inside a step
within a copy budget, else parked (``Growth``; ``host.HostBackend`` holds one and calls it)."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from . import build, core
from . import extend as kx
from .faults import inject

# The CPU backend's logger: growth was its job before it had a module of its own, and logging
# set-ups that filter these reports name it.
_log = logging.getLogger("saspec.host")

# The most int32 words of blobs one step copies to grow full rows (1 MiB, a few
# hundred microseconds of copying); other full rows are parked (see Growth).
STEP_GROWTH_WORDS = 1 << 18

_GROWER: ThreadPoolExecutor | None = None  # the process's one growth-ahead thread (started on first use)


def _grower() -> ThreadPoolExecutor:
    global _GROWER
    if _GROWER is None:
        _GROWER = ThreadPoolExecutor(1, thread_name_prefix="saspec-grow")
    return _GROWER


def _grow_ahead(ref: weakref.ref, slots: list[int]) -> None:
    """Grow each marked slot of the ``Growth`` ``ref()`` (the thread holds it only while it
    grows one: an engine dropped meanwhile is collected)."""
    for slot in slots:
        growth = ref()
        if growth is None:
            return
        growth.grow_slot(slot)
        del growth


def _report_failure(exc: Exception, tokens: int, where: str) -> None:
    """Log one failed growth: a warning, since the row is retried; the traceback only for what is
    not a plain ``MemoryError``."""
    _log.warning("saspec: growing a request's automaton of %d tokens %s failed (%s: %s); it is retried at a "
                 "later step, its row drafting nothing while its blob is full", tokens, where,
                 type(exc).__name__, str(exc),  # a string: a kept record keeps no frame (and no blob) alive
                 exc_info=None if isinstance(exc, MemoryError) else exc)


class Growth:
    """The growth of one ``host.HostBackend``'s full blobs, and the parking of the rows it cannot grow yet.

    Growth ahead of need: a blob that must grow mid-step is copied inside that
    ``extend`` call, and rows of one prompt length fill up in the same step, so
    one step would pay every row's copy at once. Instead, after each step the
    rows whose blobs passed their fill mark (``extend.rows_past_mark``) are
    handed to one process-wide background thread, which rebuilds each from its
    text into a larger blob without the engine's lock (and without the GIL), then
    takes the lock only to append the tokens the row gained meanwhile (no more
    than the new blob has room for) and swap it in. The automaton is the same
    (the same tokens through the same ``core.extend``), so drafts are too.

    A row that fills up before its turn is grown inside the step while the
    step's copies stay within ``step_growth_words`` (a small blob's copy costs
    less than waiting for it). Past that budget the row is *parked*: its blob is
    sealed (token capacity set to its count, so the kernels append nothing to it),
    the tokens it cannot take wait in ``slots.parked``, it reports match 0 and no
    draft, and the background thread appends them when it swaps the grown blob
    in; each step also grows parked rows itself, earliest first, with what is
    left of its budget. So no step copies more than ``step_growth_words`` words,
    however many rows fill up at once and however close the steps come, and a
    parked row drafts again within a few steps.

    A growth that fails (``MemoryError``, on the thread or inside a step) is
    reported, never raised: logged once on the ``saspec.host`` logger and counted
    (``growth_failures``). A row whose growth ahead failed is unmarked, so the next
    step that sees it nearly full hands it to the thread again, and a parked one
    goes back to the thread at the next step (``unpark``), which also grows it
    itself within its budget; a full row whose growth inside a step failed is
    parked. So one failure costs a row a few undrafted steps, never the rest of its
    life, and once no row is parked every step takes the fast path again.

    The backend calls it under the engine's lock, at a few points of its batch and step:
    ``prepare`` (the batch's size), ``grow_marked`` after a step (its rows past their mark),
    ``unpark`` and ``check_parked`` before a step that has parked rows, ``grow_full_rows`` for
    the rows a step stopped for lack of room, and ``park`` after it. A slot's marks and parked
    tokens live in its ``slots`` (``host.HostSlots.ahead`` and ``parked``), which a freed slot
    drops; a growth handed to the thread for a slot freed or grown since does nothing.

    Args:
        slots: the backend's ``host.HostSlots`` (blobs, address table, ``ahead`` marks,
            ``parked`` tokens, the arena growth allocates from).
        kind: the blobs' kind (``host.BlobKind``): ``grow`` inside a step, ``build`` and
            ``append_fitting`` on the thread (kinds whose ``grows_ahead`` is set).

    ``step_growth_words`` (default ``STEP_GROWTH_WORDS``) may be set per backend. ``lock``
    is the engine's lock (set by the engine through the backend); growth ahead takes it.
    ``faults`` is the engine's fault-injection hook (``saspec.faults``; None: off), asked
    before each growth: ``"grow_ahead"`` on the thread, without the lock, and
    ``"grow_in_step"``. Counters: ``grown_ahead`` (blobs grown on the thread),
    ``grown_in_step``, ``parked_rows`` and ``growth_failures``.
    """

    def __init__(self, slots: Any, kind: Any) -> None:
        self.slots = slots
        self.kind = kind
        self.lock: Any = None
        self.faults: Any = None
        self.marked = np.zeros(0, dtype=np.int32)  # slots rows_past_mark marked this step
        self._growth: list[Future] = []  # growth ahead handed to the background thread, not yet seen done
        self.step_growth_words = STEP_GROWTH_WORDS
        self.grown_ahead = 0  # blobs grown ahead of need
        self.grown_in_step = 0  # blobs grown inside a step (full before their turn)
        self.parked_rows = 0  # rows parked (full before their turn, past the step's budget)
        self.growth_failures = 0  # growths that failed (each logged), ahead or inside a step

    def prepare(self, batch: int) -> None:
        """A batch of ``batch`` rows is prepared: room in ``marked`` for each."""
        if self.marked.shape[0] < batch:
            self.marked = np.zeros(batch, dtype=np.int32)

    def grow_marked(self, n: int) -> None:
        """After a step: hand ``marked[:n]`` (the slots ``extend.rows_past_mark`` just marked) to the thread."""
        self._grow_later(self.marked[:n].tolist())

    # -- full rows: grown inside the step within its budget, else parked (see the class docstring) --

    def grow_full_rows(self, rp: np.ndarray, lens: np.ndarray, budget: int | None,
                       restep: Callable[[], object]) -> None:
        """Grow the blobs of the rows that stopped for lack of room and resume them (``restep``: the
        step again), while the step's copies fit ``budget`` words (None: ``step_growth_words``); park
        the others. ``rp``: the batch's slots and progress (int32 [2, B]); ``lens``: int32 [B]."""
        s, rows, progress = self.slots, rp[0], rp[1]
        if budget is None:
            budget = self.step_growth_words
        while True:
            grew = False
            for r in np.flatnonzero(progress < lens).tolist():
                slot = int(rows[r])
                if slot in s.parked:
                    continue
                blob = s.blobs[slot]
                if blob.shape[0] <= budget or not self.kind.grows_ahead:
                    try:
                        inject(self.faults, "grow_in_step")
                        new = self.kind.grow(blob, int(lens[r] - progress[r]), s.arena)
                    except MemoryError as exc:
                        if not self.kind.grows_ahead:
                            raise  # nothing else would ever grow it
                        self._failed(exc, blob, "inside a step")
                    else:
                        budget -= blob.shape[0]
                        s.put(slot, new)
                        self.grown_in_step += 1
                        grew = True
                        continue
                self._seal(slot)
                self.parked_rows += 1
            if not grew:
                return
            restep()

    def unpark(self) -> int:
        """Before a step: grow parked rows (the earliest parked first) while their copies fit
        ``step_growth_words``, appending their parked tokens, so that the steps themselves drain what the
        background thread has not reached; returns the budget left. A parked row whose growth failed (no
        longer marked) goes to the background thread again."""
        s, budget = self.slots, self.step_growth_words
        again = []
        for slot in list(s.parked):
            blob = s.blobs[slot]
            if blob.shape[0] <= budget:
                waiting = s.parked[slot]
                try:
                    inject(self.faults, "grow_in_step")
                    new = self.kind.grow(blob, waiting.shape[0], s.arena)
                except MemoryError as exc:
                    self._failed(exc, blob, "inside a step")
                else:
                    budget -= blob.shape[0]
                    del s.parked[slot]
                    took = self.kind.append_fitting(new, waiting)
                    s.put(slot, new)
                    s.pool_state[2, slot] = -1  # its pool match may have been synced from the sealed text
                    self.grown_in_step += 1
                    if took < waiting.shape[0]:
                        self._seal(slot)
                        s.parked[slot] = waiting[took:].copy()
                    continue
            if not s.ahead[0, slot]:
                s.ahead[0, slot] = 1
                again.append(slot)
        if again:
            self._grow_later(again)
        return budget

    def _failed(self, exc: Exception, blob: np.ndarray, where: str) -> None:
        """A growth inside a step failed (under the engine's lock): counted and reported."""
        self.growth_failures += 1
        _report_failure(exc, self.kind.tokens(blob), where)

    def _seal(self, slot: int) -> None:
        """Park slot ``slot``: its blob takes no more tokens (they wait in ``slots.parked``)
        until the background thread swaps in a grown one."""
        s = self.slots
        blob = s.blobs[slot]
        blob[core.H_CAP_TOK] = blob[core.H_N]  # core.extend finds no room, and writes nothing
        s.parked[slot] = np.zeros(0, dtype=np.int32)
        if not s.ahead[0, slot]:
            s.ahead[0, slot] = 1
            self._grow_later([slot])

    def _parked_rows(self, rp: np.ndarray) -> np.ndarray:
        """The batch rows whose slots are parked."""
        parked = self.slots.parked
        return np.flatnonzero(np.isin(rp[0], np.fromiter(parked, np.int32, len(parked))))

    def check_parked(self, rp: np.ndarray, lens: np.ndarray, ctl: np.ndarray) -> int:
        """``extend.check_step``'s token limit (``ctl[extend.C_LIMIT]``) for parked rows, counting their
        parked tokens: ``extend.OK``, or ``extend.TOO_LONG`` with the row and its total in ``ctl``'s
        error words."""
        s, limit = self.slots, ctl[kx.C_LIMIT]
        for r in self._parked_rows(rp).tolist():
            slot = int(rp[0, r])
            total = self.kind.tokens(s.blobs[slot]) + s.parked[slot].shape[0] + int(lens[r])
            if total > limit:
                ctl[kx.C_ERR], ctl[kx.C_ERR + 1] = r, total
                return kx.TOO_LONG
        return kx.OK

    def park(self, rp: np.ndarray, acc, lens, mout, dout, src, bout) -> None:
        """After the step: parked rows keep the tokens their blobs did not take and draft nothing
        (the step's arrays, as ``extend.step`` takes them; ``src`` None where there is no pool)."""
        s, rows, progress = self.slots, rp[0], rp[1]
        for r in self._parked_rows(rp).tolist():
            slot = int(rows[r])
            if progress[r] < lens[r]:
                s.parked[slot] = np.concatenate((s.parked[slot], acc[r, progress[r]: lens[r]]))
            mout[r] = 0
            dout[r] = -1
            if src is not None:
                src[r] = 0
            if bout.shape[0] > r:
                bout[r] = 0

    # -- growth ahead of need (see the class docstring) --------------------------------

    def _grow_later(self, slots: list[int]) -> None:
        self._growth = [f for f in self._growth if not f.done()]
        self._growth.append(_grower().submit(_grow_ahead, weakref.ref(self), slots))

    def wait(self) -> None:
        """Wait until the growth handed to the background thread is done, including
        what it hands on to itself (for tests)."""
        while self._growth:
            self._growth.pop(0).result()

    def grow_slot(self, slot: int) -> None:
        """Grow slot ``slot``'s blob if it is still marked: rebuilt from its text without
        the lock, then caught up and swapped in under it (the engine's lock is not held)."""
        s = self.slots
        with self.lock:
            if slot >= s.ahead.shape[1] or not s.ahead[0, slot]:
                return  # freed or grown since it was marked
            blob = s.blobs[slot]
            text = self.kind.text(blob)
            waiting = s.parked[slot].shape[0] if slot in s.parked else 0
        n = text.shape[0]
        try:
            inject(self.faults, "grow_ahead")
            new = self.kind.build(text, max(1, int((build.GROWTH - 1) * n), 2 * waiting), s.arena)
        except Exception as exc:  # reported, not raised (nobody would see it): the row is retried
            with self.lock:
                if s.blobs[slot] is blob:  # unmarked: the next step that sees it marks it again
                    s.ahead[0, slot] = 0
                self.growth_failures += 1
            _report_failure(exc, n, "on the growth thread")  # not under the engine's lock
            return
        with self.lock:
            if s.blobs[slot] is not blob:
                return  # grown inside a step, or freed, meanwhile
            o = int(blob[core.H_O_TEXT])
            late = blob[o + n: o + int(blob[core.H_N])]  # appended since the copy
            parked = s.parked.pop(slot, None)
            if parked is not None:
                late = np.concatenate((late, parked))
                s.pool_state[2, slot] = -1  # its pool match may have been synced from the sealed text
            took = self.kind.append_fitting(new, late)  # only what fits: no copy under the lock
            s.put(slot, new)
            self.grown_ahead += 1
            if took < late.shape[0]:  # more came than the grown blob holds: park the rest, grow again
                self._seal(slot)
                s.parked[slot] = late[took:].copy()

    def stats(self, slots: Any) -> dict[str, int]:
        """The counters, and ``parked_now``: how many of ``slots`` (an iterable of slot numbers) are parked."""
        return {"grown_ahead": self.grown_ahead, "grown_in_step": self.grown_in_step,
                "parked": self.parked_rows, "parked_now": sum(s in self.slots.parked for s in slots),
                "growth_failures": self.growth_failures}
