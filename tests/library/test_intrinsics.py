"""saspec.intrinsics.as_rows: a 2-D view of a 1-D array, in kernels with and without reference counting."""

from __future__ import annotations

import gc

import numpy as np
from numba import njit

from saspec.core import NO_NRT
from saspec.intrinsics import as_rows


@njit
def _made_inside():
    return as_rows(np.arange(12.0)[2:8], 2, 3)  # the view must keep the kernel's own array alive


@njit(**NO_NRT)
def _write_through(buf):
    v = as_rows(buf[2:8], 3, 2)
    v[2, 1] = -1
    v[0, 0] = 9
    return v.shape[0] * 10 + v.shape[1], v.strides[0], v[1, 1]


def test_a_view_returned_from_a_kernel_owns_its_memory():
    v = _made_inside()
    gc.collect()
    junk = [np.full(6, 7.0) for _ in range(100)]  # reuse freed memory, were the view's owner freed
    assert v.shape == (2, 3) and v.flags.c_contiguous and not v.flags.owndata
    assert np.array_equal(v, np.arange(2.0, 8.0).reshape(2, 3)) and len(junk) == 100


def test_a_view_in_a_kernel_without_reference_counting_writes_its_buffer():
    buf = np.arange(10, dtype=np.int32)
    shape, row_stride, middle = _write_through(buf)
    assert (shape, row_stride, middle) == (32, 8, 5)
    assert buf.tolist() == [0, 1, 9, 3, 4, 5, 6, -1, 8, 9]  # rows of two from index 2; nothing else written
