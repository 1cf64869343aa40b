"""Slab: a few named arrays kept in one buffer per dtype, so that a jitted call takes them as two or three.

numba unboxes every array argument of a call from Python one by one (about 0.1 µs each), so state kept in
many small arrays makes a call made at every step pay that many times. Here each named array is a view of
its dtype's buffer: Python code reads and writes the views as usual, and a kernel gets the same views back
from the buffers with :func:`view1` and :func:`view2`. The int64 buffer always exists and begins with the
layout: three entries per array, in the order given (its offset in its dtype's buffer, rows, columns).
"""

from __future__ import annotations

import numpy as np
from . import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from .intrinsics import as_rows


def slab(specs: dict[str, tuple[type, tuple[int, ...]]]) -> tuple[dict[type, np.ndarray], dict[str, np.ndarray]]:
    """Allocate zeroed arrays ``{name: (dtype, shape)}`` (shapes 1-D or 2-D, dtypes float64, int64 or int32).

    Returns:
        ``(buffers, views)``: the buffer of each dtype (``buffers[np.int64]`` first holds the layout) and
        each array, a view of its buffer, by name. Array ``i`` of ``specs`` is ``view1``/``view2(buf,
        buffers[np.int64], i)``.

    Raises:
        ValueError: a dtype other than those three, or a shape that is not 1-D or 2-D.
    """
    header = 3 * len(specs)
    sizes = {np.float64: 0, np.int64: header, np.int32: 0}
    layout = []
    for name, (dtype, shape) in specs.items():
        if dtype not in sizes:
            raise ValueError(f"slab array {name!r}: dtype must be float64, int64 or int32, got {dtype}")
        if len(shape) not in (1, 2):
            raise ValueError(f"slab array {name!r}: shape must be 1-D or 2-D, got {shape}")
        rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (shape[0], 1)
        layout.append((sizes[dtype], rows, cols))
        sizes[dtype] += rows * cols
    buffers = {dtype: np.zeros(max(n, 1), dtype) for dtype, n in sizes.items()}
    buffers[np.int64][:header] = np.asarray(layout, np.int64).reshape(-1)
    views = {}
    for (name, (dtype, shape)), (o, rows, cols) in zip(specs.items(), layout):
        views[name] = buffers[dtype][o: o + rows * cols].reshape(shape)
    return buffers, views


# The views are inlined into their kernels: a kernel compiled without reference counting (``core.NO_NRT``)
# then takes them without the reference a separately compiled function would hand it.
@njit(cache=True, inline="always")
def view1(buf, layout, i):
    """Array ``i`` of a slab, 1-D (``buf``: its dtype's buffer; ``layout``: the slab's int64 buffer)."""
    o = layout[3 * i]
    return buf[o: o + layout[3 * i + 1] * layout[3 * i + 2]]


@njit(cache=True, inline="always")
def view2(buf, layout, i):
    """Array ``i`` of a slab, 2-D."""
    o = layout[3 * i]
    rows, cols = layout[3 * i + 1], layout[3 * i + 2]
    return as_rows(buf[o: o + rows * cols], rows, cols)
