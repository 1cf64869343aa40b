"""Validate: the argument checks of the public API, in one place.

Every public entry point checks its arguments before it changes anything and
raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, out
of range) with a message that names the argument. These helpers return the
value in the form the library works with.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

MAX_TOKEN = 2**31 - 1  # token ids are int32


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch object (a tensor), told without importing torch."""
    return type(x).__module__.startswith("torch")


def check_int(value: Any, name: str, low: int, high: int | None = None, *, what: str = "an int") -> int:
    """``value`` as an int if it is an int (numpy ints too, not a bool) in
    ``[low, high]`` (``high`` None: no upper bound); otherwise ``TypeError``
    or ``ValueError`` naming ``name``."""
    bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {what} {bounds}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {what} {bounds}, got {value}")
    return int(value)


def optional_int(value: Any, name: str, low: int) -> int | None:
    """``None``, or ``value`` checked by :func:`check_int`."""
    return None if value is None else check_int(value, name, low, what="None or an int")


def check_count(value: Any, name: str) -> int:
    """``value`` (an int, or a float with a whole value; not a bool) as an int
    >= 1; ``ValueError`` naming ``name`` otherwise."""
    try:
        whole = not isinstance(value, bool) and int(value) == value and value >= 1
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def check_seconds(value: Any, name: str) -> float:
    """A duration: a finite real number > 0, as a float; ``ValueError``
    naming ``name`` otherwise (a clock that went backwards or an overflow
    must not be taken as a free or endless step)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def check_timing(value: Any, name: str = "seconds") -> float:
    """A measured duration as a float: any real number (int, float, numpy real;
    not a bool, not None), else ``TypeError`` naming ``name``. Unlike
    :func:`check_seconds`, a value that is not finite or not > 0 passes: the
    cost model ignores such a timing and counts it (a clock that did not move
    must not stop a step)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number of seconds, got {value!r}")
    return float(value)


def check_int_tensor(t: Any, name: str) -> None:
    """``ValueError`` unless torch tensor ``t`` holds integers (not bool)."""
    import torch

    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers, got dtype {t.dtype}")


def as_tokens(tokens: Any, name: str = "tokens") -> np.ndarray:
    """Validate a 1-D sequence of token ids and return it as contiguous int32.

    Accepts lists, numpy arrays and CPU torch tensors of an integer dtype with
    values in [0, 2**31). Raises ``TypeError`` or ``ValueError`` naming the problem.
    """
    if is_torch(tokens):
        if tokens.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor, got device {tokens.device}")
        tokens = tokens.detach().numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int32)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > MAX_TOKEN:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} holds token {bad}, outside [0, 2**31)")
    return np.ascontiguousarray(arr, dtype=np.int32)


def as_int32_array(x: Any, name: str, ndim: int, *, writable: bool = False, where: str = "for backend 'cpu'") -> np.ndarray:
    """View a numpy array or CPU torch tensor as a C-contiguous int32 numpy array
    without copying, or raise a ``TypeError``/``ValueError`` naming the problem."""
    if is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor {where}, got device {x.device}")
        if x.requires_grad:
            raise ValueError(f"{name} must not require grad")
        x = x.numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or torch tensor, got {type(x).__name__}")
    if x.dtype != np.int32:
        raise TypeError(f"{name} must have dtype int32, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writable and not x.flags.writeable:
        raise ValueError(f"{name} must be writable")
    return x


def array_span(x: Any) -> tuple[int, int] | None:
    """Byte range of a numpy array or torch tensor's elements (from metadata
    only: no sync), or None for anything else or an empty one."""
    if isinstance(x, np.ndarray):
        lo, n = x.__array_interface__["data"][0], x.nbytes
    elif is_torch(x) and hasattr(x, "data_ptr"):
        lo, n = x.data_ptr(), x.numel() * x.element_size()
    else:
        return None
    return (lo, lo + n) if n else None


# extend's arguments, in its order
STEP_ARG_NAMES = ("accepted", "accepted_lens", "match_len_out", "draft_out", "source_out", "branch_out")
OUTPUT_PAIRS = ((0, 2), (0, 3), (1, 2), (1, 3), (2, 3))  # an output and an input, or both outputs
SOURCE_PAIRS = ((4, 0), (4, 1), (4, 2), (4, 3))  # source_out and each of the others
BRANCH_PAIRS = ((5, 0), (5, 1), (5, 2), (5, 3), (5, 4))  # branch_out and each of the others


def check_no_overlap(args: Any, pairs: Any = OUTPUT_PAIRS) -> None:
    """Raise ``ValueError`` if an output shares memory with an input or with
    another output (``args`` in ``extend``'s order, ``STEP_ARG_NAMES``;
    ``pairs``: which of them to compare)."""
    spans = [array_span(x) for x in args]
    for i, j in pairs:
        a, b = spans[i], spans[j]
        if a is not None and b is not None and a[0] < b[1] and b[0] < a[1]:
            raise ValueError(overlap_message(i, j))


def overlap_message(i: int, j: int) -> str:
    """The message for step arguments ``i`` and ``j`` (``STEP_ARG_NAMES``) sharing memory."""
    return (
        f"{STEP_ARG_NAMES[i]} and {STEP_ARG_NAMES[j]} share memory: "
        "the outputs must not overlap an input or each other"
    )
