"""saspec.slab: named arrays in one buffer per dtype, the same views in Python and in a kernel."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from saspec.slab import slab, view1, view2


@njit
def _write(f, i, k):
    a, b, c = view2(f, i, 0), view1(i, i, 1), view2(k, i, 2)
    a[1, 2] = 7.0
    b[3] = -5
    c[0, 1] = 9
    return a.shape[0] * 100 + a.shape[1], b.shape[0], c.shape[0] * 100 + c.shape[1]


def test_views_share_their_buffers_in_python_and_in_a_kernel():
    bufs, v = slab({"a": (np.float64, (2, 3)), "b": (np.int64, (4,)), "c": (np.int32, (3, 2)),
                    "d": (np.float64, (5,))})
    assert v["a"].shape == (2, 3) and v["b"].shape == (4,) and v["c"].shape == (3, 2) and v["d"].shape == (5,)
    assert bufs[np.float64].shape == (11,) and bufs[np.int32].dtype == np.int32
    assert bufs[np.int64].shape == (3 * 4 + 4,)  # the layout, then "b"
    v["d"][:] = 1.5
    shapes = _write(bufs[np.float64], bufs[np.int64], bufs[np.int32])
    assert shapes == (203, 4, 302)
    assert v["a"][1, 2] == 7.0 and v["b"][3] == -5 and v["c"][0, 1] == 9
    assert np.all(v["d"] == 1.5) and v["a"].sum() == 7.0  # nothing written past an array's end
    assert np.array_equal(bufs[np.int64][:12], [0, 2, 3, 12, 4, 1, 0, 3, 2, 6, 5, 1])


def test_bad_specs_are_rejected():
    with pytest.raises(ValueError, match="'x': dtype must be float64, int64 or int32"):
        slab({"x": (np.float32, (2,))})
    with pytest.raises(ValueError, match="'y': shape must be 1-D or 2-D"):
        slab({"y": (np.float64, (2, 2, 2))})
