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
