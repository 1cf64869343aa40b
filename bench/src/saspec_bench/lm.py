"""Hugging Face causal LMs as the evidence runs them: which models, in which dtype, with which KV cache.

* which models: :func:`add_model_arguments` (``--family``, ``--target-dir``,
  ``--draft-dir``, ``--dtype``, ``--threads``) and :func:`load_models`, shared by
  ``saspec record-traces`` and ``saspec calibrate``;
* which dtype: :func:`pick_dtype` (bfloat16 only on CPUs with native bf16
  matmuls) and :func:`model_dtype`;
* the KV cache: :func:`new_cache`, :func:`cache_kwarg`, :func:`crop_cache` and
  :class:`CausalLM`, one growing sequence over one cache;
* :func:`count_forwards`, a forward counter for any model.

torch and transformers are imported inside the functions that need them, so
a command can register its options (and ``saspec simulate`` can run) without them.
"""

from __future__ import annotations

import argparse
import inspect
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from . import models
from .options import positive_int

if TYPE_CHECKING:
    import torch

# -- dtype -----------------------------------------------------------------------

DTYPES = ("auto", "float32", "bfloat16")

# /proc/cpuinfo flags of CPUs that compute bf16 matmuls natively: x86 AVX512-BF16 and AMX-BF16, Arm BF16.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU feature flags in ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``);
    ``cpuinfo`` overrides the file's text. Empty where the file is missing."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return set()
    out: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            out.update(value.split())
    return out


def pick_dtype(requested: str = "auto", flags: set[str] | None = None) -> tuple[str, str]:
    """The CPU dtype to run models in: ``(name, reason)``, name ``"float32"`` or ``"bfloat16"``.

    ``"auto"`` is bfloat16 only on a CPU with native bf16 matmuls (one of
    :data:`BF16_CPU_FLAGS` in ``flags``, default this machine's
    ``/proc/cpuinfo``); elsewhere (e.g. AVX2 only) torch's bf16 kernels fall
    back to slow paths, a multi-token verify costs several single-token
    forwards and speculation gains little, so it is float32. An explicit
    ``"float32"`` / ``"bfloat16"`` is kept as asked.
    """
    import torch

    if requested not in DTYPES:
        raise ValueError(f"unknown dtype {requested!r}; choose from {', '.join(DTYPES)}")
    if requested != "auto":
        return requested, "as requested"
    flags = cpu_flags() if flags is None else flags
    native = sorted(f for f in BF16_CPU_FLAGS if f in flags)
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # older torch
        capability = "unknown"
    if native:
        return "bfloat16", f"auto: CPU has native bf16 ({', '.join(native)}; torch capability {capability})"
    return "float32", f"auto: CPU lacks native bf16 (no {'/'.join(BF16_CPU_FLAGS)} flag; torch capability {capability})"


def model_dtype(model: torch.nn.Module) -> str:
    """A model's parameter dtype as a name: ``"float32"``, ``"bfloat16"``, ..."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


# -- the KV cache ----------------------------------------------------------------


def cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the KV-cache argument of ``model.forward`` (``cache`` in recent
    transformers, ``past_key_values`` before)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model: torch.nn.Module) -> Any:
    """An empty ``DynamicCache`` for ``model`` that :func:`crop_cache` can roll back."""
    from transformers import DynamicCache

    if getattr(model.config, "sliding_window", None) and getattr(model.config, "use_sliding_window", True):
        # a sliding-window layer's cache cannot be cropped once the window is full; keep every position
        # (the attention masks still apply the window)
        return DynamicCache()
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()


def crop_cache(cache: Any, keep: int) -> None:
    """Keep the first ``keep`` positions of every layer of ``cache``."""
    remove = cache.get_seq_length() - keep
    if remove < 0:
        raise RuntimeError(f"cannot crop a cache of {cache.get_seq_length()} positions to {keep}")
    if remove:
        cache.crop(-remove)  # negative: tokens to remove (accepted by old and new transformers)


class CausalLM:
    """A causal LM with a KV cache over one growing sequence.

    ``forward(tokens, keep)`` appends ``tokens`` to the cache and returns the
    logits of the last ``keep`` of them: float tensor [keep, vocab] in the
    model's dtype. ``crop(n)`` rolls the cache back to its first ``n``
    positions.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self._kw = cache_kwarg(model)
        self.cache: Any = None
        self.forwards = 0

    def reset(self) -> None:
        self.cache = new_cache(self.model)

    @property
    def cached(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def forward(self, tokens: Sequence[int], keep: int) -> torch.Tensor:
        import torch

        if self.cache is None:
            self.reset()
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)  # [1, T]
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=keep, **{self._kw: self.cache})
        self.forwards += 1
        return out.logits[0, -keep:]

    def crop(self, keep: int) -> None:
        crop_cache(self.cache, keep)


@contextmanager
def count_forwards(model: torch.nn.Module) -> Iterator[list[int]]:
    """Count calls of ``model.forward`` inside the block: yields a one-element list."""
    counter = [0]

    def hook(module, args, kwargs, output):
        counter[0] += 1

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield counter
    finally:
        handle.remove()


# -- which models ------------------------------------------------------------------


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The options :func:`load_models` reads: a model family or two HF directories, dtype, threads."""
    p.add_argument("--family", default=models.DEFAULT_FAMILY, choices=tuple(models.FAMILIES),
                   help="model family (target, draft)")
    p.add_argument("--target-dir", default=None, help="load the target from this HF directory instead of --family")
    p.add_argument("--draft-dir", default=None, help="load the draft model from this HF directory instead of --family")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="weights' dtype")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: all cores)")


def load_models(args: argparse.Namespace) -> tuple[Any, Any, str, str, Any]:
    """(target, draft, target name, draft name, tokenizer or None) as :func:`add_model_arguments`'
    options ask; ``args.fast_verify`` (default True) routes float32 linears through
    ``saspec.integrations.hf.fast_small_linears``."""
    import torch
    from transformers import AutoModelForCausalLM

    from saspec.integrations.hf import fast_small_linears

    dtype = getattr(torch, args.dtype)
    fast = getattr(args, "fast_verify", True)
    tspec, dspec = models.family(args.family)
    loaded = []
    for d, spec in ((args.target_dir, tspec), (args.draft_dir, dspec)):
        if d is not None:
            m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, local_files_only=True).eval()
            if fast:
                fast_small_linears(m)
            loaded.append((m, Path(d).name, None))
        else:
            m, tok = models.load(spec, args.dtype, fast_verify=fast)
            loaded.append((m, spec.name, tok))
    (target, tname, ttok), (draft, dname, _) = loaded
    return target, draft, tname, dname, ttok
