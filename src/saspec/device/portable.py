"""The CUDA implementations of ``saspec.portable``'s helpers (its module doc says why they exist).

* ``fmul``: libdevice's ``dmul_rn``, a product the compiler never fuses into an FMA;
* ``add_at`` / ``add_at2``: ``cuda.atomic.add``.

Imported by the device kernels that use the helpers (``saspec.device.policy_kernel``).
Under numba's CUDA simulator the kernels run as Python and call the helpers'
Python bodies: nothing is registered.
"""

from __future__ import annotations

from numba import cuda

from .. import portable
from .runtime import simulated

if not simulated():
    from numba.cuda import libdevice
    from numba.cuda.extending import overload

    @overload(portable.fmul, target="cuda", inline="always")
    def _fmul_cuda(a, b):
        def impl(a, b):
            return libdevice.dmul_rn(float(a), float(b))

        return impl

    @overload(portable.add_at, target="cuda", inline="always")
    def _add_at_cuda(a, i, v):
        def impl(a, i, v):
            cuda.atomic.add(a, i, v)

        return impl

    @overload(portable.add_at2, target="cuda", inline="always")
    def _add_at2_cuda(a, i, j, v):
        def impl(a, i, j, v):
            cuda.atomic.add(a, (i, j), v)

        return impl
