"""Packaging reads no file twice: a stage's files are copied with the digests the stage cache
verified in this build, the others with their sha256 taken on the way; the manifest's digests
are the files'."""

from __future__ import annotations

from pathlib import Path

from ingot.artifacts import manifest as manifest_module
from ingot.artifacts import verify_artifact
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.stages import package as package_module

from fixtures import write_recipe


def test_package_hashes_while_copying(tmp_path, tiny_checkpoint, monkeypatch):
    hashed: list[str] = []
    real = manifest_module.sha256_file

    def recording(path):
        hashed.append(Path(path).name)
        return real(path)

    copied: list[str] = []
    real_copy = package_module.copy_file_sha256

    def copying(src, dst):
        copied.append(Path(dst).name)
        return real_copy(src, dst)

    monkeypatch.setattr(manifest_module, "sha256_file", recording)
    monkeypatch.setattr(package_module, "copy_file_sha256", copying)
    result = build(
        write_recipe(tmp_path / "r.yaml", tiny_checkpoint),
        tmp_path / "a",
        cache=StageCache(tmp_path / "cache"),
    )
    # Only what package writes itself is hashed after the fact; copies were hashed on the way.
    assert sorted(hashed) == ["chat_template.jinja", "ingot.lock"]
    # Stage outputs (the graph, the engine) came with the cache's digests: none hashed again.
    assert sorted(copied) == ["config.json", "tokenizer.json"]
    manifest = verify_artifact(result.artifact)  # and the digests are the files'
    for entry in manifest.files:
        assert entry.sha256 == real(result.artifact / entry.path)

    # A digest handed to write_manifest is taken as is at the file's size, and ignored at another.
    fields = manifest.model_dump(mode="json")
    del fields["files"]
    fake = "0" * 64
    engine = "engines/onnxruntime-cpu/model.onnx"
    size = (result.artifact / engine).stat().st_size
    for claimed, listed in ((size, fake), (size + 1, real(result.artifact / engine))):
        rewritten, _ = manifest_module.write_manifest(
            result.artifact, fields, written={engine: (claimed, fake)}
        )
        assert {f.path: f.sha256 for f in rewritten.files}[engine] == listed
