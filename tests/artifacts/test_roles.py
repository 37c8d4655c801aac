"""Roles: each manifest file's role from its path, older manifests without roles, what a pull
target needs (the engine's own files, what its record `reads`), and unknown roles refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from test_verify import FILES, edit_manifest, manifest_fields

from ingot.artifacts import ArtifactError, read_manifest, write_manifest
from ingot.artifacts.roles import check_roles, engine_roles, files_with_roles, target_engine

from fixtures import write_files

MORE = {
    "config.json": b"{}",
    "engines/onnxruntime-cpu/model.onnx.data": b"ort-weights",
    "eval/report.md": b"# eval",
    "interop/compressed-tensors/model.safetensors": b"ct",
    "interop/compressed-tensors/config.json": b"{}",
}
OPENVINO = {
    "name": "openvino-cpu",
    "engine": "openvino",
    "device": "cpu",
    "path": "model.onnx",  # the portable graph: the engine rebuilds its model from it
    "reads": ["portable"],
}


def build(tmp_path: Path, reads: list[str] | None = ["portable"]) -> Path:  # noqa: B006
    root = write_files(tmp_path / "artifact", {**FILES, **MORE})
    fields = manifest_fields(hashlib.sha256(FILES["ingot.lock"]).hexdigest())
    openvino = {**OPENVINO, "reads": reads} if reads is not None else dict(OPENVINO)
    if reads is None:
        del openvino["reads"]
    fields["engines"] = [*fields["engines"], openvino]
    fields["interop"] = [
        {"format": "compressed-tensors", "path": "interop/compressed-tensors",
         "quantization_config": {}}
    ]  # fmt: skip
    write_manifest(root, fields)
    return root


def roles_of(root: Path) -> dict[str, str]:
    return {f.path: f.role for f in read_manifest(root).files}


EXPECTED = {
    "chat_template.jinja": "common",
    "config.json": "common",
    "ingot.lock": "common",
    "tokenizer.json": "common",
    "model.onnx": "portable",
    "model.onnx.data": "portable",
    "engines/onnxruntime-cpu/model.onnx": "engine:onnxruntime-cpu",
    "engines/onnxruntime-cpu/model.onnx.data": "engine:onnxruntime-cpu",
    "eval/report.json": "eval",
    "eval/report.md": "eval",
    "interop/compressed-tensors/config.json": "interop:compressed-tensors",
    "interop/compressed-tensors/model.safetensors": "interop:compressed-tensors",
}


def test_write_manifest_gives_each_file_its_role(tmp_path):
    root = build(tmp_path)
    assert roles_of(root) == EXPECTED
    written = json.loads((root / "manifest.json").read_text())
    assert all("role" in f for f in written["files"])


def test_a_manifest_written_before_roles_loads_with_roles_from_the_paths(tmp_path):
    root = build(tmp_path)
    edit_manifest(root, lambda d: [f.pop("role") for f in d["files"]])
    assert "role" not in (root / "manifest.json").read_text()
    assert roles_of(root) == EXPECTED


def test_an_unknown_role_is_refused_with_one_line(tmp_path):
    root = build(tmp_path)
    edit_manifest(root, lambda d: d["files"][0].update(role="engine:tensorrt-gpu"))
    with pytest.raises(ArtifactError) as exc:
        read_manifest(root)
    [problem] = exc.value.problems
    assert "role 'engine:tensorrt-gpu' is not one this manifest knows" in problem


def test_a_record_reading_an_unknown_role_is_refused(tmp_path):
    root = build(tmp_path)
    edit_manifest(root, lambda d: d["engines"][1].update(reads=["interop:gguf"]))
    with pytest.raises(ArtifactError, match=r"engines\[openvino-cpu\]\.reads: unknown role"):
        read_manifest(root)


def paths_for(root: Path, target: str) -> set[str]:
    manifest = read_manifest(root)
    return {
        f.path
        for f in files_with_roles(manifest, engine_roles(manifest, target_engine(manifest, target)))
    }  # noqa: E501


def test_onnxruntime_target_needs_its_engine_and_the_common_files_only(tmp_path):
    root = build(tmp_path)
    assert paths_for(root, "onnxruntime-cpu") == {
        p for p, role in EXPECTED.items() if role in ("common", "engine:onnxruntime-cpu")
    }


@pytest.mark.parametrize("reads", [["portable"], None], ids=["reads", "record-before-reads"])
def test_openvino_target_gets_the_portable_graph_it_reads(tmp_path, reads):
    # Without `reads` (a record written before the field) its `path`'s role still brings
    # the graph and its data.
    root = build(tmp_path, reads)
    assert paths_for(root, "openvino") == {
        p for p, role in EXPECTED.items() if role in ("common", "portable")
    }


def test_reads_comes_from_the_record_not_from_the_engine_kind(tmp_path):
    root = build(tmp_path)
    edit_manifest(root, lambda d: d["engines"][1].update(reads=["eval"]))
    assert "eval/report.md" in paths_for(root, "openvino-cpu")


def test_a_target_picks_by_name_then_the_first_engine_of_that_kind(tmp_path):
    manifest = read_manifest(build(tmp_path))
    assert target_engine(manifest, "openvino").name == "openvino-cpu"
    assert target_engine(manifest, "onnxruntime-cpu").name == "onnxruntime-cpu"
    with pytest.raises(ArtifactError) as exc:
        target_engine(manifest, "tensorrt")
    assert "it has: onnxruntime-cpu (onnxruntime), openvino-cpu (openvino)" in str(exc.value)


def test_roles_asked_for_are_checked_against_the_manifest(tmp_path):
    manifest = read_manifest(build(tmp_path))
    assert check_roles(manifest, ["interop:compressed-tensors"]) == {"interop:compressed-tensors"}
    with pytest.raises(ArtifactError, match="role interop:gguf: not a role of this artifact"):
        check_roles(manifest, ["interop:gguf"])


def test_draft_files_go_with_the_engines_that_run_them(tmp_path):
    from test_manifest_speculative import DRAFT_ENGINE, FILES, HEADS, _medusa, draft, fields

    root = write_files(tmp_path / "spec", FILES)
    write_manifest(root, fields({"method": "draft_model", "num_speculative_tokens": 3,
                                 "draft": draft()}))  # fmt: skip
    assert roles_of(root)[DRAFT_ENGINE] == "draft:onnxruntime-cpu"
    assert roles_of(root)[HEADS] == "draft"  # on disk, not used by this draft_model artifact
    needed = paths_for(root, "onnxruntime-cpu")
    assert DRAFT_ENGINE in needed and HEADS not in needed
    write_manifest(root, fields(_medusa()))
    assert HEADS in paths_for(root, "onnxruntime-cpu")


def test_an_engine_directory_no_record_names_keeps_its_path_role(tmp_path):
    # As an older manifest may have it: the role its path gives is accepted, never pulled
    # for a target, fetched by a full pull.
    root = build(tmp_path)
    edit_manifest(root, lambda d: d["engines"].pop(0))
    assert roles_of(root)["engines/onnxruntime-cpu/model.onnx"] == "engine:onnxruntime-cpu"
    assert "engines/onnxruntime-cpu/model.onnx" not in paths_for(root, "openvino-cpu")
