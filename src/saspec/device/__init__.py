"""The CUDA side of saspec: ``SpecEngine(backend="cuda")`` and the drafting step on the device.

Host-side objects (what a caller constructs or holds):

* ``backend``: ``DeviceBackend``, the engine's CUDA backend (host builds, then resident device slots).
* ``slots``: ``DeviceSlots``, the requests' automata resident in device slots, the batch's row map,
  and O(request) uploads of host-built automata into them.
* ``policy``: ``DevicePolicy``, the drafting policy's state on the device and its step.
* ``drafter``: ``DeviceDrafter``, the ``Drafter``'s lifecycle over device automata and ``DevicePolicy``.

The CUDA kernels (``numba.cuda.jit`` over the same ``register_jitable`` functions as the host), each
module with its ``KERNELS`` and their launch ``SIGNATURES``:

* ``automaton_kernels``: ``extend_kernel`` (a decode step) and the upload's ``unpack_kernel`` / ``link_kernel``.
* ``policy_kernel``: ``decide_kernel``, the policy's step.
* ``drafter_kernels``: the drafting step's ``offers_kernel`` and ``cut_kernel``.

Plumbing:

* ``runtime``: ``TorchDevice`` (torch's allocator and current stream) or ``SimDevice`` (numba's CUDA
  simulator), picked by ``new_device``: memory, staging copies, kernel launches; and the kernels' cache.
* ``portable``: the CUDA implementations of ``saspec.portable``'s helpers.

Importing any of these modules loads numba-cuda; ``saspec`` itself never does unless a
CUDA engine is created.
"""
