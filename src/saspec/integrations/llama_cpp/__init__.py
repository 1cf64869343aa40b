"""llama.cpp through llama-cpp-python: saspec's drafters and its own speculative loop.

::

    from llama_cpp import Llama
    from saspec.integrations.llama_cpp import SADraftModel, ModelDrafter, LlamaCppHybridDrafter, generate

    target = Llama("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", n_ctx=8192, n_threads=2)
    out = generate(target, prompt_ids, 256, SADraftModel())              # the automaton
    draft = Llama("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", n_ctx=8192, n_threads=2)
    out = generate(target, prompt_ids, 256, LlamaCppHybridDrafter(SADraftModel(), ModelDrafter(draft)))
    out.tokens, out.accepted, out.drafted

* :func:`generate` / :class:`Speculator` (``loop``): saspec's loop over llama.cpp's C API:
  one ``llama_decode`` per step with logits only at the verified positions, the
  rejected positions removed from the KV cache; greedy or exact speculative sampling.
  Its drafting step is a :class:`saspec.drafter.Drafter` built from the drafter's
  settings; per-call options (``options={"enabled": False}``, ``{"max_draft_tokens": 2}``,
  ``{"hints": ids}``).
* :class:`SADraftModel` (``drafter``): the automaton, incremental; also a
  llama-cpp-python ``LlamaDraftModel`` (``Llama(draft_model=SADraftModel())`` runs it in
  llama-cpp-python's own, slower loop; pass ``logits_all=True`` there for prompts longer
  than ``n_batch``).
* :class:`ModelDrafter`, :class:`LlamaCppHybridDrafter` (``drafter``): a small GGUF draft
  model with a lazily caught-up KV cache, and both drafters together. The drafting
  policy (on by default; ``policy=False`` for the match-length rule) times every target
  decode and draft-model call and chooses each step's source and draft length.
* ``python -m saspec.integrations.llama_cpp.server``: llama-cpp-python's OpenAI server
  with saspec's loop and drafters, per-request options in the body (see ``server``).

llama_cpp is imported only when a context or the server is made; ``import saspec``
never loads it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"SADraftModel": "drafter", "ModelDrafter": "drafter", "LlamaCppHybridDrafter": "drafter",
            "generate": "loop", "Speculator": "loop", "Sampler": "loop", "GenerateResult": "loop",
            "Context": "lowlevel"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
