"""Fault injection: a test hook that makes chosen allocations fail as if memory had run out.

``SpecEngine(faults=...)`` takes any object with a ``should_fail(kind) -> bool`` method. The engine
asks it just before each allocation of one of ``KINDS`` and, where it answers True, raises
``MemoryError`` there instead of allocating, so tests and soak runs drive the very recovery paths a
real out-of-memory takes, through the public API. ``should_fail`` may be called from the engine's
background growth thread as well as from the caller's threads: it must be thread-safe. The thread asks
about ``"grow_ahead"`` without the engine's lock and before it builds or swaps in anything, so a test
may also block there to hold the thread at a known point.

With ``faults=None`` (the default) nothing is asked, and a step's fast path never asks in any case:
the hook sits on the build and growth paths only, so it costs nothing where it is unset.
"""

from __future__ import annotations

from typing import Any, Protocol

#: What may be made to fail: ``add_request``'s build of a new automaton; the growth of a nearly full
#: blob on the background thread (CPU backend); a full blob's growth inside a step (CPU backend).
KINDS = ("build", "grow_ahead", "grow_in_step")


class Faults(Protocol):
    """What ``SpecEngine(faults=...)`` takes (a test hook)."""

    def should_fail(self, kind: str) -> bool:
        """Whether the allocation about to happen, of kind ``kind`` (one of ``KINDS``), fails."""
        ...


def check_faults(faults: Any) -> Any:
    """Validate the ``faults`` argument: ``None`` or an object with a callable ``should_fail``.

    Raises:
        TypeError: anything else.
    """
    if faults is not None and not callable(getattr(faults, "should_fail", None)):
        raise TypeError(f"faults must be None or have a should_fail(kind) method, got {type(faults).__name__}")
    return faults


def inject(faults: Faults | None, kind: str) -> None:
    """Raise ``MemoryError`` where ``faults`` (``None``: never) says the ``kind`` allocation fails."""
    if faults is not None and faults.should_fail(kind):
        raise MemoryError(f"saspec: injected fault: {kind}")


#: The environment variable :func:`from_env` reads: a test hook for processes a test cannot reach into
#: (vLLM's workers), e.g. ``SASPEC_FAULTS="build=3,grow_ahead=3,grow_in_step=3"``.
FAULTS_ENV = "SASPEC_FAULTS"


class EveryNth:
    """Fail every ``n``-th allocation of each kind named in ``every`` (``{kind: n}``; thread-safe).

    Raises:
        ValueError: an unknown kind or an ``n`` below 1.
    """

    def __init__(self, every: dict[str, int]) -> None:
        import threading

        for kind, n in every.items():
            if kind not in KINDS:
                raise ValueError(f"unknown fault kind {kind!r}; the kinds are {', '.join(KINDS)}")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"fault kind {kind!r}: n must be an int >= 1, got {n!r}")
        self.every = dict(every)
        self.asked = {kind: 0 for kind in every}
        self.failed = {kind: 0 for kind in every}
        self._lock = threading.Lock()

    def should_fail(self, kind: str) -> bool:
        n = self.every.get(kind)
        if n is None:
            return False
        with self._lock:
            self.asked[kind] += 1
            fail = self.asked[kind] % n == 0
            self.failed[kind] += fail
        return fail


def from_env(name: str = FAULTS_ENV) -> EveryNth | None:
    """The :class:`EveryNth` that ``$name`` describes (``kind=n`` pairs separated by commas), or None where
    it is unset or empty.

    Raises:
        ValueError: a malformed value, naming the variable.
    """
    import os

    value = os.environ.get(name, "").strip()
    if not value:
        return None
    every = {}
    for part in value.split(","):
        kind, _, n = part.partition("=")
        if not n.strip().isdigit():
            raise ValueError(f"${name} must be kind=n pairs separated by commas (kinds: {', '.join(KINDS)}), "
                             f"got {value!r}")
        every[kind.strip()] = int(n)
    try:
        return EveryNth(every)
    except ValueError as e:
        raise ValueError(f"${name}: {e}") from None
