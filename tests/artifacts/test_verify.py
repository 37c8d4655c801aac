"""verify_artifact: every way an artifact can be altered is caught, and named."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ingot.artifacts import (
    ArtifactError,
    manifest_digest,
    read_manifest,
    verify_artifact,
    write_manifest,
)

from fixtures import write_files

FILES = {
    "ingot.lock": b'{"lock_version": 1, "stages": {}}\n',
    "tokenizer.json": b'{"model": {"type": "BPE"}}',
    "chat_template.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}",
    "model.onnx": b"\x08\x09fake-onnx-graph",
    "model.onnx.data": bytes(range(256)) * 4,
    "engines/onnxruntime-cpu/model.onnx": b"fake-ort-optimized-graph",
    "eval/report.json": b'{"perplexity": 5.0}',
}


def manifest_fields(lock_sha256: str) -> dict[str, Any]:
    return {
        "name": "tiny-llama",
        "version": "0.1.0",
        "recipe": {"source": {"path": "./ckpt"}, "kv_cache": {"dtype": "fp16", "block_size": 16}},
        "lock": {"path": "ingot.lock", "sha256": lock_sha256},
        "model": {
            "architecture": "LlamaForCausalLM",
            "vocab_size": 256,
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 16,
            "max_seq_len": 128,
            "bos_token_id": 1,
            "eos_token_ids": [2],
            "tie_word_embeddings": True,
            "quantization": [{"method": "rtn", "bits": 4, "group_size": 32}],
        },
        "tokenizer": {
            "path": "tokenizer.json",
            "chat_template": "chat_template.jinja",
            "bos_token": "<s>",
            "eos_token": "</s>",
        },
        "graph": {
            "path": "model.onnx",
            "opset": 23,
            "inputs": [
                {"name": "input_ids", "dtype": "int64", "shape": ["S", "Q"]},
                {"name": "positions", "dtype": "int64", "shape": ["S", "Q"]},
            ],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["S", "Q", 8]}],
            "num_layers": 2,
            "kv_block_size": 16,
            "kv_dtype": "fp16",
            "num_kv_heads": 2,
            "head_dim": 16,
        },
        "engines": [
            {
                "name": "onnxruntime-cpu",
                "engine": "onnxruntime",
                "device": "cpu",
                "path": "engines/onnxruntime-cpu/model.onnx",
                "requires": {"onnxruntime": ">=1.23,<2", "cpu_isa": ["avx2"]},
                "session_options": {"intra_op_num_threads": 1},
            }
        ],
        "eval": {"perplexity": 5.0},
    }


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    root = write_files(tmp_path / "artifact", FILES)
    write_manifest(root, manifest_fields(hashlib.sha256(FILES["ingot.lock"]).hexdigest()))
    return root


def problems_of(root: Path) -> list[str]:
    with pytest.raises(ArtifactError) as exc:
        verify_artifact(root)
    # The message must carry every problem, not only the structured list.
    for problem in exc.value.problems:
        assert problem in str(exc.value)
    return exc.value.problems


def edit_manifest(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def test_intact_artifact_verifies(artifact: Path) -> None:
    manifest = verify_artifact(artifact)
    assert manifest == read_manifest(artifact)
    assert [f.path for f in manifest.files] == sorted(FILES)
    assert verify_artifact(str(artifact)) == manifest


@pytest.mark.parametrize("rel", sorted(FILES))
def test_flipped_byte_is_named(artifact: Path, rel: str) -> None:
    path = artifact / rel
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    [problem] = problems_of(artifact)
    assert problem.startswith(f"{rel}: sha256 mismatch (manifest ")


def test_truncated_file_reports_size(artifact: Path) -> None:
    path = artifact / "model.onnx.data"
    path.write_bytes(path.read_bytes()[:-1])
    assert problems_of(artifact) == [
        "model.onnx.data: size mismatch (manifest 1024 bytes, file 1023 bytes)"
    ]


@pytest.mark.parametrize("rel", sorted(FILES))
def test_deleted_file_is_named(artifact: Path, rel: str) -> None:
    (artifact / rel).unlink()
    assert problems_of(artifact) == [f"{rel}: missing"]


@pytest.mark.parametrize("rel", ["extra.bin", "engines/onnxruntime-cpu/custom_op.so"])
def test_unlisted_extra_file_is_refused(artifact: Path, rel: str) -> None:
    (artifact / rel).write_bytes(b"")
    assert problems_of(artifact) == [f"{rel}: present but not listed in the manifest"]


@pytest.mark.parametrize("rel", ["model.onnx", "engines/onnxruntime-cpu/model.onnx"])
def test_symlink_with_identical_content_is_refused(
    artifact: Path, tmp_path: Path, rel: str
) -> None:
    copy = tmp_path / "identical-copy"
    shutil.copyfile(artifact / rel, copy)
    (artifact / rel).unlink()
    (artifact / rel).symlink_to(copy)
    assert problems_of(artifact) == [f"{rel}: unsafe path: '{rel}' is a symbolic link"]


def test_symlinked_directory_is_refused(artifact: Path, tmp_path: Path) -> None:
    copy = tmp_path / "engines-copy"
    shutil.copytree(artifact / "engines", copy)
    shutil.rmtree(artifact / "engines")
    (artifact / "engines").symlink_to(copy, target_is_directory=True)
    assert problems_of(artifact) == [
        "engines/onnxruntime-cpu/model.onnx: unsafe path: 'engines' is a symbolic link",
        "engines: is a symbolic link",
    ]


def test_directory_in_place_of_file_is_refused(artifact: Path) -> None:
    (artifact / "eval" / "report.json").unlink()
    (artifact / "eval" / "report.json").mkdir()
    assert problems_of(artifact) == ["eval/report.json: not a regular file"]


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a//b", "a\\b"])
def test_unsafe_manifest_entry_is_refused(artifact: Path, tmp_path: Path, bad: str) -> None:
    # Make "../x" exist with a matching digest: a correct digest must not excuse the path.
    (tmp_path / "x").write_bytes(b"")
    empty = {"path": bad, "size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
    edit_manifest(artifact, lambda m: m["files"].append(empty))
    [problem] = problems_of(artifact)
    assert problem.startswith(f"{bad}: unsafe path: ")


@pytest.mark.parametrize(
    ("field", "set_path"),
    [
        ("graph.path", lambda m: m["graph"].update(path="other.onnx")),
        ("tokenizer.path", lambda m: m["tokenizer"].update(path="other.json")),
        ("tokenizer.chat_template", lambda m: m["tokenizer"].update(chat_template="other.json")),
        ("engines[onnxruntime-cpu].path", lambda m: m["engines"][0].update(path="other.json")),
        ("lock.path", lambda m: m["lock"].update(path="other.json")),
    ],
)
def test_referenced_path_outside_files_is_refused(
    artifact: Path, field: str, set_path: Callable[[dict[str, Any]], None]
) -> None:
    edit_manifest(artifact, set_path)
    [problem] = problems_of(artifact)
    assert problem.startswith("other.")
    assert problem.endswith(f": referenced by {field} but not listed in files")


def test_graph_present_on_disk_but_unlisted_is_refused(artifact: Path) -> None:
    edit_manifest(artifact, lambda m: m["files"].remove(_entry(m, "model.onnx")))
    assert problems_of(artifact) == [
        "model.onnx: present but not listed in the manifest",
        "model.onnx: referenced by graph.path but not listed in files",
    ]


def test_lock_digest_mismatch_is_refused(artifact: Path) -> None:
    edit_manifest(artifact, lambda m: m["lock"].update(sha256="0" * 64))
    [problem] = problems_of(artifact)
    assert problem.startswith("ingot.lock: lock sha256 mismatch (lock 000000000000…")


def test_manifest_may_not_list_itself(artifact: Path) -> None:
    entry = {"path": "manifest.json", "size": 0, "sha256": "0" * 64}
    edit_manifest(artifact, lambda m: m["files"].append(entry))
    assert problems_of(artifact) == ["manifest.json: the manifest cannot list itself"]


def test_duplicate_file_entry_is_refused(artifact: Path) -> None:
    edit_manifest(artifact, lambda m: m["files"].append(_entry(m, "model.onnx")))
    [problem] = problems_of(artifact)
    assert "files lists a path more than once: model.onnx" in problem


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_unknown_format_version_is_refused(artifact: Path, version: object) -> None:
    edit_manifest(artifact, lambda m: m.update(format_version=version))
    with pytest.raises(ArtifactError, match=rf"format_version {version!r} is not supported"):
        verify_artifact(artifact)


def test_corrupted_manifest_json_is_refused(artifact: Path) -> None:
    path = artifact / "manifest.json"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ArtifactError, match=r"manifest\.json: not valid JSON"):
        verify_artifact(artifact)


def test_symlinked_root_is_refused(artifact: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(artifact, target_is_directory=True)
    with pytest.raises(ArtifactError, match="artifact root is a symbolic link"):
        verify_artifact(link)


def test_root_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    for root in (tmp_path / "file", tmp_path / "missing"):
        with pytest.raises(ArtifactError, match="not a directory"):
            verify_artifact(root)


def test_all_problems_are_reported_together(artifact: Path) -> None:
    (artifact / "tokenizer.json").write_bytes(b"X" * len(FILES["tokenizer.json"]))
    (artifact / "chat_template.jinja").unlink()
    (artifact / "stray.py").write_text("import os")
    edit_manifest(artifact, lambda m: m["lock"].update(sha256="0" * 64))
    problems = problems_of(artifact)
    assert [p.split(":")[0] for p in problems] == [
        "chat_template.jinja",
        "tokenizer.json",
        "stray.py",
        "ingot.lock",
    ]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_unlisted_fifo_is_refused(artifact: Path) -> None:
    os.mkfifo(artifact / "pipe")
    assert problems_of(artifact) == ["pipe: is not a regular file"]


def test_manifest_digest_is_the_sha256_of_the_stored_bytes(artifact: Path) -> None:
    stored = (artifact / "manifest.json").read_bytes()
    assert manifest_digest(artifact) == "sha256:" + hashlib.sha256(stored).hexdigest()
    edit_manifest(artifact, lambda m: m.update(version="0.1.1"))
    assert manifest_digest(artifact) != "sha256:" + hashlib.sha256(stored).hexdigest()


def _entry(manifest: dict[str, Any], rel: str) -> dict[str, Any]:
    [entry] = [f for f in manifest["files"] if f["path"] == rel]
    return entry
