"""Pull only what runs: `ingot pull --target/--role`, `LLM("oci://…")` pulling the files of the
engine it selects, a partial artifact's absent files, verify-once in the store, and tampering
caught on the way in and after."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingot.artifacts import ArtifactError, read_manifest, write_manifest
from ingot.artifacts.oci import pull, push
from ingot.artifacts.partial import PARTIAL_NAME
from ingot.artifacts.registry_client import Retry
from ingot.artifacts.signing import sign_artifact, verify_signature
from ingot.artifacts.store import BlobStore
from ingot.artifacts.verify import check_artifact
from ingot.cli import main

pytestmark = pytest.mark.registry
FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05, timeout=5.0)
INTEROP = "interop/compressed-tensors"


@pytest.fixture
def multi(artifact: Path) -> Path:
    """The tiny build with an OpenVINO engine record (it reads the portable graph) and a
    compressed-tensors export beside its ONNX Runtime engine."""
    (artifact / INTEROP).mkdir(parents=True)
    (artifact / INTEROP / "config.json").write_text("{}")
    (artifact / INTEROP / "model.safetensors").write_bytes(b"ct" * 64)
    fields = read_manifest(artifact).model_dump(mode="json")
    del fields["files"]
    openvino = {"name": "openvino-cpu", "engine": "openvino", "device": "cpu"}
    fields["engines"].append({**openvino, "path": "model.onnx", "reads": ["portable"]})
    fields["interop"] = [
        {"format": "compressed-tensors", "path": INTEROP, "quantization_config": {}}
    ]
    write_manifest(artifact, fields)
    return artifact


def roles_of(artifact: Path) -> dict[str, str]:
    return {f.path: f.role for f in read_manifest(artifact).files}


def digests(artifact: Path, paths: set[str]) -> set[str]:
    listed = {f.path: "sha256:" + f.sha256 for f in read_manifest(artifact).files}
    return {listed[p] for p in paths}


def blob_gets(proxy, repo: str) -> list[str]:
    return proxy.requests(rf"GET /v2/{repo}/blobs/(sha256:[0-9a-f]{{64}})")


ORT = {"common", "engine:onnxruntime-cpu"}
SELECTIONS = {
    "target onnxruntime-cpu": (["--target", "onnxruntime-cpu"], ORT),
    "target openvino (kind)": (["--target", "openvino"], {"common", "portable"}),
    "role interop": (["--role", "interop:compressed-tensors"], {"interop:compressed-tensors"}),
    "target + role eval": (
        ["--target", "onnxruntime-cpu", "--role", "eval"],
        {"common", "engine:onnxruntime-cpu", "eval"},
    ),
}  # fmt: skip


@pytest.mark.parametrize("flags,roles", SELECTIONS.values(), ids=SELECTIONS.keys())
def test_a_pull_for_a_selection_fetches_only_its_blobs(
    registry, multi, proxy, tmp_path, monkeypatch, flags, roles
):
    monkeypatch.setenv("INGOT_STORE_DIR", str(tmp_path / "store"))
    pushed = push(multi, registry.ref("partial/sel:v1"), retry=FAST)
    watched = proxy()
    out = tmp_path / "out"
    ref = f"oci://{watched.host}/partial/sel@{pushed.digest}"
    result = CliRunner().invoke(main, ["pull", ref, "--out", str(out), *flags, "--json"])
    assert result.exit_code == 0, result.output

    wanted = {p for p, role in roles_of(multi).items() if role in roles}
    absent = set(roles_of(multi)) - wanted
    got = blob_gets(watched, "partial/sel")
    config = json.loads(Path(registry.blob_file(pushed.digest)).read_bytes())["config"]
    expected = digests(multi, wanted) | {config["digest"], _manifest_json_digest(multi)}
    assert sorted(got) == sorted(expected)  # each once, nothing else
    assert json.loads(result.output)["absent"] == sorted(absent)
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert on_disk == wanted | {"manifest.json", PARTIAL_NAME}
    assert set(check_artifact(out).absent) == absent


def _manifest_json_digest(artifact: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256((artifact / "manifest.json").read_bytes()).hexdigest()


def test_an_unknown_target_or_role_names_what_the_artifact_has(registry, multi, proxy, tmp_path):
    pushed = push(multi, registry.ref("partial/unknown:v1"), retry=FAST)
    watched = proxy()
    ref = f"oci://{watched.host}/partial/unknown@{pushed.digest}"
    runner = CliRunner(env={"INGOT_STORE_DIR": str(tmp_path / "store")})
    result = runner.invoke(main, ["pull", ref, "--target", "tensorrt"])
    assert result.exit_code == 1
    assert "it has: onnxruntime-cpu (onnxruntime), openvino-cpu (openvino)" in result.output
    result = runner.invoke(main, ["pull", ref, "--role", "interop:gguf"])
    assert (
        result.exit_code == 1 and "role interop:gguf: not a role of this artifact" in result.output
    )
    assert len(blob_gets(watched, "partial/unknown")) == 2  # manifest.json and the config only


def test_a_later_pull_adds_only_what_the_first_left_out(registry, multi, proxy, tmp_path):
    pushed = push(multi, registry.ref("partial/grow:v1"), retry=FAST)
    store = BlobStore(tmp_path / "store")
    watched = proxy()
    ref = f"oci://{watched.host}/partial/grow@{pushed.digest}"
    first = pull(ref, store=store, roles={"common", "engine:onnxruntime-cpu"}, retry=FAST)
    before = len(blob_gets(watched, "partial/grow"))
    second = pull(ref, store=store, roles={"common", "portable"}, retry=FAST)
    portable = {p for p, r in roles_of(multi).items() if r == "portable"}
    assert sorted(blob_gets(watched, "partial/grow")[before:]) == sorted(digests(multi, portable))
    assert second.path == first.path
    assert set(second.partial.roles) == {"common", "engine:onnxruntime-cpu", "portable"}
    again = pull(ref, store=store, roles={"portable"}, retry=FAST)  # all there: no GET
    assert again.downloaded_bytes == 0 and len(blob_gets(watched, "partial/grow")) == before + 2
    whole = pull(ref, store=store, retry=FAST)
    assert whole.partial is None and not (whole.path / PARTIAL_NAME).exists()
    assert check_artifact(whole.path).absent == ()


@pytest.mark.parametrize("how", ["same size, one byte flipped", "longer than declared"])
def test_a_tampered_blob_is_refused_and_leaves_no_half_written_file(registry, multi, tmp_path, how):
    push(multi, registry.ref("partial/tampered:v1"), retry=FAST)
    [digest] = digests(multi, {"engines/onnxruntime-cpu/model.onnx.data"})
    stored = registry.blob_file(digest)
    original = stored.read_bytes()
    store = BlobStore(tmp_path / "store")
    try:
        flipped = original[:100] + bytes([original[100] ^ 0xFF]) + original[101:]
        stored.write_bytes(flipped if how.startswith("same") else original + b"extra")
        with pytest.raises(ArtifactError, match=r"model\.onnx\.data: .*(refused|more than)"):
            pull(registry.ref("partial/tampered:v1"), store=store,
                 roles={"common", "engine:onnxruntime-cpu"}, retry=FAST)  # fmt: skip
    finally:
        stored.write_bytes(original)  # blobs are shared by every repository of the registry
    assert not store.blob_path(digest).exists()
    assert not [p for p in (store.root / "tmp").iterdir() if p.name.startswith(digest[7:])]
    assert not (store.root / "artifacts").exists() or not any((store.root / "artifacts").iterdir())


def test_a_signature_is_checked_before_any_weight_is_fetched(
    registry, multi, keys, proxy, tmp_path
):
    sign_artifact(multi, keys["private"])
    pushed = push(multi, registry.ref("partial/signed:v1"), retry=FAST)
    watched = proxy()
    ref = f"oci://{watched.host}/partial/signed@{pushed.digest}"

    def wrong(root):
        verify_signature(root, keys["other_public"])

    with pytest.raises(ArtifactError, match="does not verify"):
        pull(ref, store=BlobStore(tmp_path / "store"), check=wrong, retry=FAST)
    heads = {_manifest_json_digest(multi), *digests_of_sig(multi)}
    assert set(blob_gets(watched, "partial/signed")) - heads == {_config_digest(registry, pushed)}


def digests_of_sig(artifact: Path) -> set[str]:
    import hashlib

    return {"sha256:" + hashlib.sha256((artifact / "model.sig").read_bytes()).hexdigest()}


def _config_digest(registry, pushed) -> str:
    return json.loads(registry.blob_file(pushed.digest).read_bytes())["config"]["digest"]


def test_push_refuses_a_partial_artifact(registry, multi, tmp_path):
    pushed = push(multi, registry.ref("partial/repush:v1"), retry=FAST)
    out = tmp_path / "out"
    pull(f"oci://{pushed.reference}", out=out, store=BlobStore(tmp_path / "s"),
         roles={"common"}, retry=FAST)  # fmt: skip
    with pytest.raises(ArtifactError, match="a partial artifact .* push the whole artifact"):
        push(out, registry.ref("partial/repush:v2"), retry=FAST)


def test_an_artifact_without_roles_pulls_by_target(registry, artifact, tmp_path):
    path = artifact / "manifest.json"  # as written before roles existed
    path.write_text(re.sub(r',?\s*"role": "[^"]*"', "", path.read_text()))
    assert '"role"' not in path.read_text()
    pushed = push(artifact, registry.ref("partial/old:v1"), retry=FAST)
    out = tmp_path / "out"
    result = pull(f"oci://{pushed.reference}", out=out, store=BlobStore(tmp_path / "s"),
                  roles={"common", "engine:onnxruntime-cpu"}, retry=FAST)  # fmt: skip
    assert "model.onnx.data" in result.absent and (out / "engines").is_dir()
    assert set(check_artifact(out).absent) == set(result.absent)


def test_llm_pulls_only_its_engine_and_serves_text(registry, multi, tmp_path, monkeypatch):
    from ingot import LLM, SamplingParams

    monkeypatch.setenv("INGOT_STORE_DIR", str(tmp_path / "store"))
    pushed = push(multi, registry.ref("partial/llm:v1"), retry=FAST)
    llm = LLM(f"oci://{pushed.reference}")
    root = llm.model.root
    assert llm.model.engine.name == "onnxruntime-cpu"
    assert not (root / "model.onnx.data").exists() and not (root / INTEROP).exists()
    assert (root / PARTIAL_NAME).is_file()
    [out] = llm.generate(["def add"], SamplingParams(max_tokens=4, temperature=0))
    assert len(out.outputs[0].token_ids) == 4 and out.outputs[0].text


def test_a_load_from_the_store_hashes_nothing_and_catches_a_later_change(
    registry, artifact, tmp_path, monkeypatch
):
    from ingot.artifacts import verify as verify_module
    from ingot.runtime.model import LoadedModel

    monkeypatch.setenv("INGOT_STORE_DIR", str(tmp_path / "store"))
    pushed = push(artifact, registry.ref("partial/once:v1"), retry=FAST)
    ref = f"oci://{pushed.reference}"
    root = LoadedModel.load(ref).root  # pulled: every blob hashed on its way in, once
    hashed: list[str] = []
    real = verify_module.sha256_file
    monkeypatch.setattr(verify_module, "sha256_file", lambda p: hashed.append(p) or real(p))
    LoadedModel.load(ref)
    assert hashed == []  # a load from the store compares stats, not bytes

    weights = root / "engines/onnxruntime-cpu/model.onnx.data"
    before = os.stat(weights)
    os.chmod(weights, 0o644)  # the store made it read-only; the hard link shares the blob's inode
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as before
    with pytest.raises(ArtifactError, match=r"engines/onnxruntime-cpu/model\.onnx\.data"):
        LoadedModel.load(ref)


def test_a_partial_directory_skips_the_engines_it_lacks(registry, multi, tmp_path):
    from ingot.runtime.engine_select import EngineUnavailable, select_engine
    from ingot.runtime.model import LoadedModel

    pushed = push(multi, registry.ref("partial/dir:v1"), retry=FAST)
    out = tmp_path / "out"
    pull(f"oci://{pushed.reference}", out=out, store=BlobStore(tmp_path / "s"),
         roles={"common", "portable"}, retry=FAST)  # fmt: skip
    verified = check_artifact(out)
    engine, skipped = select_engine(verified.manifest, absent=verified.absent)
    why = "not pulled (2 of its files are absent, e.g. engines/onnxruntime-cpu/model.onnx)"
    assert engine.name == "openvino-cpu" and skipped == [f"onnxruntime-cpu: {why}"]
    with pytest.raises(EngineUnavailable, match=re.escape(why)):
        LoadedModel.load(out, engine="onnxruntime-cpu")  # a plain directory: all hashed


def test_serve_engine_flag_narrows_the_pull_before_any_weight(registry, multi, proxy, tmp_path):
    pushed = push(multi, registry.ref("partial/serve:v1"), retry=FAST)
    watched = proxy()
    ref = f"oci://{watched.host}/partial/serve@{pushed.digest}"
    runner = CliRunner(env={"INGOT_STORE_DIR": str(tmp_path / "store")})
    result = runner.invoke(main, ["serve", ref, "--engine", "tensorrt"])
    assert result.exit_code == 1 and "--engine: engine 'tensorrt'" in result.output
    assert len(blob_gets(watched, "partial/serve")) == 2  # manifest.json and the config only
