"""Push and pull against a real registry: layout, round trip, store reuse, corrupt blobs,
cut connections, a registry that is down."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from pathlib import Path

import pytest

from ingot.artifacts import ArtifactError, manifest_digest
from ingot.artifacts.oci import ARTIFACT_TYPE, CONFIG_MEDIA_TYPE, pull, push
from ingot.artifacts.oci import MANIFEST_MEDIA_TYPE as OCI
from ingot.artifacts.registry_client import RegistryError, RegistryUnavailable, Retry
from ingot.artifacts.store import BlobStore

pytestmark = pytest.mark.registry
FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05, timeout=5.0)


def files_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def store_is_clean(store: BlobStore) -> bool:
    """Every blob under blobs/sha256 is complete: its name is its sha256."""
    blobs = store.root / "blobs" / "sha256"
    return all(
        hashlib.sha256(p.read_bytes()).hexdigest() == p.name
        for p in (blobs.iterdir() if blobs.exists() else [])
    )


def sha256_of(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def get_json(url: str, accept: str | None = None) -> dict:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def test_round_trip_by_tag_and_by_digest_is_byte_identical(registry, artifact, store, tmp_path):
    pushed = push(artifact, registry.ref("models/tiny:v1"), retry=FAST)
    assert pushed.tag == "v1"
    assert pushed.reference == f"{registry.host}/models/tiny@{pushed.digest}"

    by_tag = pull(registry.ref("models/tiny:v1"), out=tmp_path / "a", store=store, retry=FAST)
    by_digest = pull(
        f"oci://{pushed.reference}", out=tmp_path / "b", store=BlobStore(tmp_path / "s2")
    )
    assert by_tag.digest == by_digest.digest == pushed.digest
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b") == files_of(artifact)
    assert by_tag.downloaded_bytes == sum(len(b) for b in files_of(artifact).values()) + len(
        _config_bytes(registry, pushed.digest)
    )


def _config_bytes(registry, digest: str) -> bytes:
    manifest = get_json(f"http://{registry.host}/v2/models/tiny/manifests/{digest}", OCI)
    url = f"http://{registry.host}/v2/models/tiny/blobs/{manifest['config']['digest']}"
    with urllib.request.urlopen(url) as response:
        return response.read()


def test_layout_is_a_modelpack_artifact_with_one_raw_layer_per_file(registry, artifact):
    pushed = push(artifact, registry.ref("models/layout:v1"), retry=FAST)
    manifest = get_json(f"http://{registry.host}/v2/models/layout/manifests/{pushed.digest}", OCI)
    assert manifest["artifactType"] == ARTIFACT_TYPE
    assert manifest["config"]["mediaType"] == CONFIG_MEDIA_TYPE
    layers = {
        layer["annotations"]["org.cncf.model.filepath"]: layer for layer in manifest["layers"]
    }
    assert set(layers) == set(files_of(artifact))  # manifest.json included, no tarballs
    for path, layer in layers.items():
        assert layer["annotations"]["org.opencontainers.image.title"] == path
        assert layer["mediaType"].startswith("application/vnd.cncf.model.")
        assert layer["mediaType"].endswith(".v1.raw")
        assert (
            layer["digest"]
            == "sha256:" + hashlib.sha256((artifact / path).read_bytes()).hexdigest()
        )
    weights = "engines/onnxruntime-cpu/model.onnx.data"  # the artifact's one weights file
    assert layers[weights]["mediaType"] == "application/vnd.cncf.model.weight.v1.raw"
    assert layers["tokenizer.json"]["mediaType"].endswith("weight.config.v1.raw")
    assert layers["manifest.json"]["digest"] == manifest_digest(artifact)

    url = f"http://{registry.host}/v2/models/layout/blobs/{manifest['config']['digest']}"
    with urllib.request.urlopen(url) as response:
        config = json.loads(response.read())
    assert config["descriptor"] == {"name": "tiny", "version": "0.1.0", "family": "llama"}
    assert config["config"]["format"] == "onnx" and config["config"]["quantization"] == "rtn"
    assert config["config"]["precision"] == "int4" and config["config"]["paramSize"].endswith("K")
    assert config["modelfs"] == {
        "type": "layers",
        "diffIds": [layer["digest"] for layer in manifest["layers"]],
    }


def test_second_pull_takes_blobs_from_the_store(registry, artifact, store, proxy, tmp_path):
    pushed = push(artifact, registry.ref("models/reuse:v1"), retry=FAST)
    watched = proxy()
    via_proxy = f"oci://{watched.host}/models/reuse"
    first = pull(f"{via_proxy}:v1", out=tmp_path / "a", store=store, retry=FAST)
    assert len(watched.requests(r"GET /v2/models/reuse/blobs/")) == len(files_of(artifact)) + 1

    before = len(watched.requests(r"GET /v2/\S+"))
    again = pull(f"{via_proxy}:v1", out=tmp_path / "b", store=store, retry=FAST)
    blob_gets = watched.requests(r"GET /v2/\S+/blobs/")[len(files_of(artifact)) + 1 :]
    assert blob_gets == [] and again.downloaded_bytes == 0  # only the tag was resolved
    assert len(watched.requests(r"GET /v2/\S+")) == before + 1
    assert files_of(tmp_path / "b") == files_of(artifact)

    # By digest, once materialized in the store: no network at all.
    pinned = f"{via_proxy}@{pushed.digest}"
    in_store = pull(pinned, store=store, retry=FAST)
    sent = len(watched.sent)
    assert pull(pinned, store=store, retry=FAST).path == in_store.path
    assert len(watched.sent) == sent
    assert first.digest == again.digest == pushed.digest


def test_blob_corrupted_in_the_registry_is_refused_naming_the_file(
    registry, artifact, store, tmp_path
):
    push(artifact, registry.ref("models/corrupt:v1"), retry=FAST)
    digest = sha256_of(artifact / "engines/onnxruntime-cpu/model.onnx.data")
    stored = registry.blob_file(digest)
    original = stored.read_bytes()
    try:  # same size, one byte flipped: only the digest can tell
        stored.write_bytes(original[:1000] + bytes([original[1000] ^ 0xFF]) + original[1001:])
        with pytest.raises(ArtifactError, match=r"model\.onnx\.data: blob refused.*corrupt"):
            pull(registry.ref("models/corrupt:v1"), out=tmp_path / "out", store=store, retry=FAST)
    finally:
        stored.write_bytes(original)  # blobs are shared by every repository of the registry
    assert not store.blob_path(digest).exists() and store_is_clean(store)
    assert not list((store.root / "tmp").glob(f"{digest[7:]}*"))
    assert not (tmp_path / "out").exists()


def test_cut_connection_leaves_no_partial_blob_and_a_retry_resumes(
    registry, artifact, store, proxy, tmp_path
):
    push(artifact, registry.ref("models/cut:v1"), retry=FAST)
    cutting = proxy(cut_after=100_000)
    once = Retry(attempts=1, timeout=5.0)
    with pytest.raises(RegistryUnavailable, match="connection|closed|broken|reset"):
        pull(f"oci://{cutting.host}/models/cut:v1", out=tmp_path / "out", store=store, retry=once)
    assert cutting.cuts == 1
    assert store_is_clean(store)
    [partial] = (store.root / "tmp").glob("*.partial")
    kept = partial.stat().st_size
    assert 0 < kept < (artifact / "engines/onnxruntime-cpu/model.onnx.data").stat().st_size
    assert not (tmp_path / "out").exists()

    resumed = proxy()
    result = pull(f"oci://{resumed.host}/models/cut:v1", out=tmp_path / "out", store=store)
    assert resumed.requests(rf"Range: bytes={kept}-")  # resumed, not restarted
    assert not partial.exists()
    assert files_of(result.path) == files_of(artifact) and store_is_clean(store)


def test_cut_connection_is_retried_within_one_pull(registry, artifact, store, proxy, tmp_path):
    push(artifact, registry.ref("models/cut2:v1"), retry=FAST)
    cutting = proxy(cut_after=100_000)
    result = pull(
        f"oci://{cutting.host}/models/cut2:v1", out=tmp_path / "o", store=store, retry=FAST
    )
    assert cutting.cuts == 1 and cutting.requests(r"Range: bytes=\d+-")
    assert files_of(result.path) == files_of(artifact)


def test_registry_down_is_a_clear_error_after_bounded_retries(artifact, store, tmp_path, free_port):
    host = f"127.0.0.1:{free_port}"
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match=rf"registry {host} unavailable.*3 time") as e:
        pull(f"oci://{host}/models/x:v1", out=tmp_path / "o", store=store, retry=FAST)
    assert "connection refused" in str(e.value)
    with pytest.raises(RegistryUnavailable, match=rf"registry {host}"):
        push(artifact, f"oci://{host}/models/x:v1", retry=FAST)
    assert time.monotonic() - started < 5
    assert not (tmp_path / "o").exists() and not (store.root / "blobs").exists()


def test_unknown_tag_is_a_clear_error(registry, store, tmp_path):
    with pytest.raises(RegistryError, match="not found"):
        pull(registry.ref("models/never-pushed:v1"), store=store, retry=FAST)


def test_pull_refuses_to_overwrite_a_directory_that_is_not_an_artifact(
    registry, artifact, store, tmp_path
):
    push(artifact, registry.ref("models/tiny:v1"), retry=FAST)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ArtifactError, match="not an ingot artifact"):
        pull(registry.ref("models/tiny:v1"), out=precious, store=store, retry=FAST)
    assert (precious / "notes.txt").read_text() == "keep me"
    # An empty directory (a volume mount point) is filled in place; an artifact is replaced.
    (tmp_path / "mount").mkdir()
    pull(registry.ref("models/tiny:v1"), out=tmp_path / "mount", store=store, retry=FAST)
    pull(registry.ref("models/tiny:v1"), out=tmp_path / "mount", store=store, retry=FAST)
    assert files_of(tmp_path / "mount") == files_of(artifact)
