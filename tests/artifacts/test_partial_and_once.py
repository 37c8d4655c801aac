"""A partial artifact (ingot.partial.json) verifies for what it has and names what it lacks;
a store artifact is checked by the stat recorded at pull time, and `ingot verify --full`
re-hashes it."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_verify import FILES, manifest_fields

from ingot.artifacts import ArtifactError, manifest_digest, write_manifest
from ingot.artifacts.fingerprint import save_fingerprints, take_fingerprints
from ingot.artifacts.partial import PARTIAL_NAME, PartialRecord, write_partial
from ingot.artifacts.store import verify_stored
from ingot.artifacts.verify import check_artifact
from ingot.cli import main

from fixtures import write_files

NOT_PULLED = ("eval/report.json", "model.onnx", "model.onnx.data")


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    root = write_files(tmp_path / "artifact", FILES)
    write_manifest(root, manifest_fields(hashlib.sha256(FILES["ingot.lock"]).hexdigest()))
    return root


@pytest.fixture
def partial(artifact: Path) -> Path:
    for rel in NOT_PULLED:
        (artifact / rel).unlink()
    roles = ("common", "engine:onnxruntime-cpu")
    write_partial(artifact, PartialRecord(manifest_digest(artifact), roles, NOT_PULLED))
    return artifact


def test_a_partial_artifact_verifies_and_lists_what_is_absent(partial):
    verified = check_artifact(partial)
    assert verified.absent == NOT_PULLED and verified.partial.roles == (
        "common",
        "engine:onnxruntime-cpu",
    )
    result = CliRunner().invoke(main, ["verify", str(partial)])
    assert result.exit_code == 0, result.output  # intact for what it has: not corruption
    assert "partial: 3 files absent" in result.output
    assert all(f"absent  {rel}" in result.output for rel in NOT_PULLED)


def test_a_partial_artifact_still_catches_a_missing_or_altered_file(partial):
    (partial / "tokenizer.json").unlink()  # pulled, then lost: not excused by the record
    (partial / "engines/onnxruntime-cpu/model.onnx").write_bytes(b"x" * 24)
    (partial / "stray.bin").write_bytes(b"stray")
    with pytest.raises(ArtifactError) as exc:
        check_artifact(partial)
    assert sorted(exc.value.problems) == [
        "engines/onnxruntime-cpu/model.onnx: sha256 mismatch "
        f"(manifest {hashlib.sha256(FILES['engines/onnxruntime-cpu/model.onnx']).hexdigest()[:12]}…"
        f", file {hashlib.sha256(b'x' * 24).hexdigest()[:12]}…)",
        "stray.bin: present but not listed in the manifest",
        "tokenizer.json: missing",
    ]
    assert CliRunner().invoke(main, ["verify", str(partial)]).exit_code == 1


def test_a_record_of_another_manifest_or_of_unlisted_files_is_refused(partial):
    os.chmod(partial / PARTIAL_NAME, 0o644)
    write_partial(partial, PartialRecord("sha256:" + "0" * 64, ("common",), NOT_PULLED))
    with pytest.raises(ArtifactError, match=f"{PARTIAL_NAME}: written for manifest sha256:0"):
        check_artifact(partial)
    os.chmod(partial / PARTIAL_NAME, 0o644)
    write_partial(partial, PartialRecord(manifest_digest(partial), (), (*NOT_PULLED, "x.bin")))
    with pytest.raises(ArtifactError, match="lists x.bin as absent, a file the manifest"):
        check_artifact(partial)


@pytest.fixture
def stored(artifact: Path, tmp_path: Path) -> Path:
    """The artifact as a store holds it, with the record a pull writes."""
    root = tmp_path / "store" / "artifacts" / ("ab" * 32)
    root.parent.mkdir(parents=True)
    shutil.move(artifact, root)
    record = tmp_path / "store" / "verified" / f"{'ab' * 32}.json"
    save_fingerprints(record, manifest_digest(root), take_fingerprints(root, sorted(FILES)))
    return root


def test_a_store_artifact_is_checked_by_stat_without_hashing(stored):
    assert verify_stored(stored).hashed == ()
    assert sorted(verify_stored(stored, full=True).hashed) == sorted(FILES)


def same_size_change_keeping_mtime(path: Path) -> None:
    before = os.stat(path)
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_a_same_size_same_mtime_change_is_caught_by_the_stat_check_and_by_full(stored):
    same_size_change_keeping_mtime(stored / "model.onnx.data")
    # ctime moved (no call can set it back), so the stat check hashes the file again.
    with pytest.raises(ArtifactError, match=r"model\.onnx\.data: sha256 mismatch"):
        verify_stored(stored)
    result = CliRunner().invoke(main, ["verify", "--full", str(stored)])
    assert result.exit_code == 1 and "model.onnx.data: sha256 mismatch" in result.output


def test_a_touched_but_unchanged_file_is_hashed_once_and_its_stat_recorded(stored):
    os.utime(stored / "model.onnx.data")
    assert verify_stored(stored).hashed == ("model.onnx.data",)
    assert verify_stored(stored).hashed == ()  # the record was refreshed
