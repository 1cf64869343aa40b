"""saspec: speculative-decoding drafts from a suffix automaton over each request's own tokens.

The package is laid out by what each part is for:

* the library an inference engine imports: ``core`` (the automaton, written once
  as numba ``register_jitable`` functions), ``build`` (host automata),
  ``engine`` (``SpecEngine``: add / prepare / extend / remove, over a backend),
  ``host`` (its CPU backend), ``extend`` (the host batch kernels, the pool's
  per-step kernel included), ``pool`` (``RequestPool``: memory across requests),
  ``policy`` (each step's draft length and source per row, from what
  verification costs), ``rules`` (the fixed rules, where the policy is off) and
  ``ngram`` (the n-gram baseline);
* ``saspec.device``: the CUDA backend (device slots, uploads, kernels);
* ``saspec.integrations``: one thin adapter per inference engine.

What measures saspec (workloads, the simulator, benchmarks, model set-up, the
``saspec`` command) is the separate ``saspec_bench`` distribution in ``bench/``;
the library never imports it.

Every module that compiles kernels imports ``kernel_cache`` first (saspec's numba
cache locator); ``import saspec`` itself imports neither numba nor any module.
"""

import importlib
from typing import Any

#: Public names and the modules that define them. They load on first use, so ``import saspec``
#: (and an engine plugin importing ``saspec.integrations``) loads no numba until a kernel is needed.
_EXPORTS = {"OCCURRENCES": "build", "SuffixAutomaton": "build", "SpecEngine": "engine", "NgramDrafter": "ngram",
            "RequestPool": "pool", "DraftPolicy": "policy", "SequencePolicy": "policy", "StepCost": "policy",
            "PolicySettings": "policy"}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'saspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
