"""The blob store's invariant: only complete, digest-checked blobs ever appear in blobs/."""

import hashlib

import pytest

from ingot.artifacts import ArtifactError
from ingot.artifacts.resolve import resolve_artifact
from ingot.artifacts.store import BlobStore, FileBlob

DATA = bytes(range(256)) * 1000


def blob(data: bytes = DATA, path: str = "model.onnx.data") -> FileBlob:
    return FileBlob(path, "sha256:" + hashlib.sha256(data).hexdigest(), len(data))


def test_a_partial_blob_resumes_with_its_hash_and_commits_atomically(tmp_path):
    store, b = BlobStore(tmp_path), blob()
    with store.open_partial(b) as partial:
        partial.write(DATA[:1000])
    assert not store.has_blob(b.digest, b.size)  # interrupted: only tmp/ holds it
    with store.open_partial(b) as partial:
        assert partial.offset == 1000  # resumed, the first 1000 bytes re-hashed
        partial.write(DATA[1000:])
        partial.commit()
    assert store.blob_path(b.digest).read_bytes() == DATA
    assert not list((tmp_path / "tmp").iterdir())


def test_wrong_bytes_are_discarded_naming_the_file(tmp_path):
    store, b = BlobStore(tmp_path), blob()
    with store.open_partial(b) as partial:
        partial.write(DATA[:-1] + b"\x00")
        with pytest.raises(ArtifactError, match=r"model\.onnx\.data: blob refused"):
            partial.commit()
    assert not store.blob_path(b.digest).exists()
    assert not list((tmp_path / "tmp").iterdir())


def test_more_bytes_than_declared_are_refused(tmp_path):
    store, b = BlobStore(tmp_path), blob()
    with store.open_partial(b) as partial, pytest.raises(ArtifactError, match="more than the"):
        partial.write(DATA + b"x")
    assert not store.blob_path(b.digest).exists()


def test_put_bytes_and_read_blob(tmp_path):
    store = BlobStore(tmp_path)
    digest = store.put_bytes(b"{}")
    assert store.read_blob(digest, limit=10) == b"{}"
    assert store.read_blob(digest, limit=1) is None
    assert store.read_blob("sha256:" + "0" * 64, limit=10) is None


def test_store_location_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("INGOT_STORE_DIR", str(tmp_path / "s"))
    assert BlobStore().root == tmp_path / "s"
    assert resolve_artifact(tmp_path / "dir") == tmp_path / "dir"  # paths pass through
