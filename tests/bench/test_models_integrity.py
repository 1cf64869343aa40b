"""An installed model is checked at load against what install recorded in its ``.complete``
marker: a file changed, truncated, removed or added after install is refused with an error
naming it, before anything is loaded; small files are hashed at every load, the weights only by
a full check (and by a rerun of ``saspec models install``). A tiny fake converted copy stands in
for a real one."""

from __future__ import annotations

import json

import pytest

from saspec_bench import models
from saspec_bench.models import ModelError, ModelSpec

SPEC = ModelSpec("test-model", "saspec-test-model-part", 1, "1.0.0", 4, "test.gguf", "0" * 64, ("0" * 64,))
FILES = {"config.json": b'{"model_type": "qwen2"}', "tokenizer.json": b'{"version": "1.0"}',
         "model.safetensors": bytes(range(256)) * 8, "sub/extra_config.json": b"{}"}


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A converted copy of ``SPEC`` under a fresh model cache, recorded as install records it."""
    monkeypatch.setenv("SASPEC_MODELS", str(tmp_path / "cache"))
    d = models.converted_dir(SPEC)
    for rel, data in FILES.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    manifest = models.record_converted(SPEC)
    assert set(manifest["files"]) == set(FILES)
    return d


def test_an_unchanged_copy_passes(installed):
    assert models.check_converted(SPEC) == installed
    assert models.check_converted(SPEC, full=True) == installed


def test_the_marker_records_each_files_size_and_sha256(installed):
    marker = json.loads((installed / ".complete").read_text())
    assert marker["gguf_sha256"] == SPEC.gguf_sha256  # what install() looks for in the marker
    assert {rel: v["size"] for rel, v in marker["files"].items()} == {rel: len(b) for rel, b in FILES.items()}


@pytest.mark.parametrize("rel", list(FILES))
def test_a_file_of_another_size_is_refused_at_load_and_named(installed, rel):
    (installed / rel).write_bytes(FILES[rel] + b"more")
    with pytest.raises(ModelError, match=rf"{rel}.* bytes, {len(FILES[rel]):,} at install"):
        models.load(SPEC)  # refused before torch or transformers read anything


@pytest.mark.parametrize("rel", list(FILES))
def test_a_small_file_changed_in_place_is_refused_at_load(installed, rel):
    data = bytearray(FILES[rel])
    data[0] ^= 1  # same size, other bytes
    (installed / rel).write_bytes(bytes(data))
    with pytest.raises(ModelError, match=rf"{rel} does not have the sha256 recorded at install"):
        models.load(SPEC)


def test_large_files_are_hashed_only_by_the_full_check(installed, monkeypatch):
    monkeypatch.setattr(models, "HASH_AT_LOAD_BYTES", 1024)  # model.safetensors (2 KiB) counts as large here
    data = bytearray(FILES["model.safetensors"])
    data[7] ^= 1
    (installed / "model.safetensors").write_bytes(bytes(data))
    assert models.check_converted(SPEC) == installed  # its size is right: the cheap check at load passes
    with pytest.raises(ModelError, match="model.safetensors does not have the sha256"):
        models.check_converted(SPEC, full=True)


def test_a_missing_file_is_refused(installed):
    (installed / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match="tokenizer.json, recorded at install, is missing"):
        models.load(SPEC)


def test_an_added_file_is_refused(installed):
    (installed / "model-00002.safetensors").write_bytes(b"x")
    with pytest.raises(ModelError, match="model-00002.safetensors was not there at install"):
        models.load(SPEC)


def test_a_marker_without_a_record_asks_for_a_reinstall(installed):
    (installed / ".complete").write_text(f"test-model from test.gguf sha256 {SPEC.gguf_sha256}\n")
    with pytest.raises(ModelError, match="rerun `saspec models install` to record them"):
        models.load(SPEC)


def test_install_records_an_earlier_installs_files_then_checks_them_in_full(installed, monkeypatch):
    monkeypatch.setitem(models.FAMILIES, "test-family", (SPEC, SPEC))
    (installed / ".complete").write_text(f"test-model from test.gguf sha256 {SPEC.gguf_sha256}\n")
    logs: list[str] = []
    models.install("test-family", logs.append)
    assert "recorded for the checks at load" in logs[0] and logs[1].startswith("test-model: ready")
    assert models.check_converted(SPEC, full=True) == installed
    (installed / "config.json").write_bytes(b'{"model_type": "llama"}')
    with pytest.raises(ModelError, match="config.json"):
        models.install("test-family", logs.append)  # a rerun checks the recorded copy in full
