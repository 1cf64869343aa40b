"""The CUDA backend of ``SpecEngine(backend="cuda")``.

* ``backend``: the engine's CUDA backend (host builds, then resident device slots).
* ``prepare``: the device slots, and O(request) uploads of host-built automata.
* ``extend``: the kernels (``numba.cuda.jit`` over the same ``core`` functions as the
  host) and the graph-capturable launch adapter.

Importing this package loads numba-cuda; ``saspec`` itself never does unless a
CUDA engine is created.
"""
