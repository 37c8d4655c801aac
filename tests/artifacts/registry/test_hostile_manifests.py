"""Manifests crafted by hand (not by `ingot push`) are refused before anything is written."""

from __future__ import annotations

import hashlib
import json
from contextlib import nullcontext

import pytest

from ingot.artifacts import ArtifactError
from ingot.artifacts.oci import (
    ARTIFACT_TYPE,
    CONFIG_MEDIA_TYPE,
    FILEPATH,
    MANIFEST_MEDIA_TYPE,
    WEIGHT,
    pull,
)
from ingot.artifacts.reference import parse_reference
from ingot.artifacts.registry_client import RegistryClient, Retry

pytestmark = pytest.mark.registry
FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05, timeout=5.0)


def push_crafted(registry, repo: str, layers: list[tuple[str, bytes, str]]) -> str:
    """Upload blobs and a manifest whose layers are (filepath, bytes, mediaType)."""
    client = RegistryClient(parse_reference(registry.ref(f"{repo}:crafted")), retry=FAST)

    def upload(data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        client.upload_blob(digest, len(data), lambda: nullcontext(data))
        return {"digest": digest, "size": len(data)}

    config = b'{"descriptor":{},"config":{},"modelfs":{"type":"layers","diffIds":[]}}'
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, **upload(config)},
        "layers": [
            {"mediaType": kind, **upload(data), "annotations": {FILEPATH: path}}
            for path, data, kind in layers
        ],
    }
    body = json.dumps(manifest).encode()
    client.put_manifest(body, MANIFEST_MEDIA_TYPE, "sha256:" + hashlib.sha256(body).hexdigest())
    return registry.ref(f"{repo}:crafted")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../escape.txt", "'..' segment"),
        ("engines/../../escape.txt", "'..' segment"),
        ("/tmp/escape.txt", "absolute path"),
        ("engines//x", "empty path segment"),
    ],
)
def test_unsafe_paths_are_refused_before_anything_is_written(registry, store, tmp_path, path, why):
    ref = push_crafted(
        registry,
        "hostile/paths",
        [("manifest.json", b"{}", WEIGHT), (path, b"owned", WEIGHT)],
    )
    with pytest.raises(ArtifactError, match=rf"unsafe path: {why}") as e:
        pull(ref, out=tmp_path / "out" / "model", store=store, retry=FAST)
    assert path in str(e.value)
    assert not store.root.exists()  # not even a blob was downloaded
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape.txt").exists()


def test_tar_layers_and_path_clashes_are_refused(registry, store, tmp_path):
    ref = push_crafted(
        registry,
        "hostile/shapes",
        [
            ("manifest.json", b"{}", WEIGHT),
            ("weights.tar", b"tar", "application/vnd.cncf.model.weight.v1.tar"),
            ("a", b"file", WEIGHT),
            ("a/b", b"file below a file", WEIGHT),
        ],
    )
    with pytest.raises(ArtifactError) as e:
        pull(ref, out=tmp_path / "out", store=store, retry=FAST)
    problems = "\n".join(e.value.problems)
    assert "weights.tar: media type" in problems and "never unpacks archives" in problems
    assert "a/b: its directory a is also a file" in problems
    assert not store.root.exists() and not (tmp_path / "out").exists()


def test_a_manifest_that_does_not_match_its_files_is_refused_after_download(
    registry, store, tmp_path
):
    # Safe paths and good blobs, but manifest.json does not describe them: verify_artifact.
    ref = push_crafted(
        registry, "hostile/lies", [("manifest.json", b"{}", WEIGHT), ("x.bin", b"x", WEIGHT)]
    )
    with pytest.raises(ArtifactError, match="manifest.json"):
        pull(ref, out=tmp_path / "out", store=store, retry=FAST)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".tmp-*"))
