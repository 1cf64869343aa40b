"""Arithmetic that gives the same bits on the host and on a CUDA device.

The policy's kernels (``acceptance``, ``allocation``, ``step_cost.cost_of``) are
``register_jitable`` functions compiled for the host with ``numba.njit`` and for
the device with ``numba.cuda.jit`` (``saspec.device.policy_kernel``), and the device
must choose the same draft lengths as the host. Two things differ between the
targets unless the kernels say otherwise, and the kernels use these helpers
where they would:

* ``fmul(a, b)``: a product that is rounded on its own. CUDA's compiler fuses a
  product and a sum into one FMA (one rounding instead of two) unless told not
  to; the host never does. Every product whose result is added to something
  goes through it.
* ``add_at(a, i, v)`` / ``add_at2(a, i, j, v)``: ``a[i] += v`` where device
  threads share ``a``: an atomic add on the device (``saspec.device.portable``).
  Only for values whose sums are exact in any order (integers, or floats
  holding integers below 2**53), so the order the threads add in changes
  nothing.

Here are the host's implementations (plain arithmetic, inlined); the CUDA ones
are registered by ``saspec.device.portable``, which the device kernels import.
Called from Python (numba's CUDA simulator runs the kernels as Python threads)
they are the plain operations, the adds under a lock.
"""

from __future__ import annotations

import threading

from numba.extending import overload

_lock = threading.Lock()


def fmul(a, b):
    """``a * b``, never fused with a following add."""
    return a * b


def add_at(a, i, v):
    """``a[i] += v``, atomically where device threads share ``a`` (see the module doc)."""
    with _lock:
        a[i] += v


def add_at2(a, i, j, v):
    """``a[i, j] += v``, atomically where device threads share ``a`` (see the module doc)."""
    with _lock:
        a[i, j] += v


@overload(fmul, inline="always")
def _fmul_host(a, b):
    return lambda a, b: a * b


@overload(add_at, inline="always")
def _add_at_host(a, i, v):
    def impl(a, i, v):
        a[i] += v

    return impl


@overload(add_at2, inline="always")
def _add_at2_host(a, i, j, v):
    def impl(a, i, j, v):
        a[i, j] += v

    return impl
