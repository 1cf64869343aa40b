"""saspec: speculative-decoding drafts from a suffix automaton over each request's own tokens.

The package is laid out by what each part is for:

* the library an inference engine imports: ``core`` (the automaton, written once
  as numba ``register_jitable`` functions), ``build`` (host automata),
  ``engine`` (``SpecEngine``: add / prepare / extend / remove), ``extend`` (the
  host batch kernels), ``select`` (the hybrid choice) and ``ngram`` (the n-gram
  baseline);
* ``saspec.device``: the CUDA backend (device slot pool, uploads, kernels);
* ``saspec.integrations``: one thin module per inference engine;
* ``saspec.evidence``: workloads, simulator, benchmarks, model set-up and the
  reference speculative loop. The library never imports it.
"""

from . import kernel_cache

kernel_cache.install()

from .build import POLICIES, SuffixAutomaton  # noqa: E402
from .engine import SpecEngine  # noqa: E402
from .ngram import NgramDrafter  # noqa: E402
from .select import select_drafts  # noqa: E402

__all__ = ["POLICIES", "NgramDrafter", "SpecEngine", "SuffixAutomaton", "select_drafts"]
__version__ = "0.1.0"
