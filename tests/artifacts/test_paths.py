"""safe_relative_path and iter_artifact_files: only plain files inside the directory pass."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ingot.artifacts import ArtifactError, iter_artifact_files, safe_relative_path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "engines" / "cpu").mkdir(parents=True)
    (root / "model.onnx").write_bytes(b"graph")
    (root / "engines" / "cpu" / "model.onnx").write_bytes(b"engine")
    return root


def test_accepts_nested_path_and_returns_it_resolved(root: Path) -> None:
    got = safe_relative_path(root, "engines/cpu/model.onnx")
    assert got == root.resolve() / "engines" / "cpu" / "model.onnx"


def test_accepts_path_that_does_not_exist_yet(root: Path) -> None:
    assert safe_relative_path(root, "new/dir/file.bin") == root.resolve() / "new/dir/file.bin"


@pytest.mark.parametrize(
    ("rel", "why"),
    [
        ("/etc/passwd", "absolute path"),
        ("../x", "'..' segment"),
        ("engines/../../x", "'..' segment"),
        ("engines/..", "'..' segment"),
        ("a//b", "empty path segment"),
        ("a/", "empty path segment"),
        ("a\\b", "backslash"),
        ("..\\x", "backslash"),
        ("", "empty path"),
        ("./model.onnx", "'.' segment"),
        ("a\nb", "control character"),
    ],
)
def test_refuses_unsafe_spelling(root: Path, rel: str, why: str) -> None:
    with pytest.raises(ArtifactError) as exc:
        safe_relative_path(root, rel)
    shown = rel if rel and rel.isprintable() else repr(rel)
    [problem] = exc.value.problems
    assert problem.startswith(f"{shown}: unsafe path: ")
    assert why in problem
    assert str(exc.value) == problem


def test_refuses_symlink_leaf_even_to_a_file_inside(root: Path) -> None:
    (root / "alias.onnx").symlink_to("model.onnx")
    with pytest.raises(ArtifactError, match=r"^alias\.onnx: unsafe path: 'alias\.onnx' is a sym"):
        safe_relative_path(root, "alias.onnx")


def test_refuses_symlinked_directory_component(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "cpu").mkdir(parents=True)
    (outside / "cpu" / "model.onnx").write_bytes(b"engine")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ArtifactError, match=r"'linked' is a symbolic link"):
        safe_relative_path(root, "linked/cpu/model.onnx")


def test_refuses_dangling_symlink(root: Path) -> None:
    (root / "dangling").symlink_to("/nonexistent/target")
    with pytest.raises(ArtifactError, match="symbolic link"):
        safe_relative_path(root, "dangling")


def test_iter_lists_regular_files_sorted_posix_without_manifest(root: Path) -> None:
    (root / "manifest.json").write_text("{}")
    (root / "engines" / "manifest.json").write_text("{}")  # only the top-level one is special
    (root / "empty-dir").mkdir()
    (root / "a.txt").write_text("a")
    assert iter_artifact_files(root) == [
        "a.txt",
        "engines/cpu/model.onnx",
        "engines/manifest.json",
        "model.onnx",
    ]


def test_iter_refuses_symlinked_file(root: Path) -> None:
    (root / "engines" / "cpu" / "alias.onnx").symlink_to("model.onnx")
    with pytest.raises(ArtifactError) as exc:
        iter_artifact_files(root)
    assert exc.value.problems == ["engines/cpu/alias.onnx: is a symbolic link"]


def test_iter_refuses_symlinked_directory_without_descending(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ArtifactError) as exc:
        iter_artifact_files(root)
    assert exc.value.problems == ["linked: is a symbolic link"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_iter_refuses_non_regular_file_and_collects_all(root: Path) -> None:
    os.mkfifo(root / "pipe")
    (root / "alias").symlink_to("model.onnx")
    with pytest.raises(ArtifactError) as exc:
        iter_artifact_files(root)
    assert exc.value.problems == ["alias: is a symbolic link", "pipe: is not a regular file"]
    assert "alias" in str(exc.value) and "pipe" in str(exc.value)


def test_iter_refuses_unsafe_file_name(root: Path) -> None:
    (root / "a\\b").write_text("x")
    with pytest.raises(ArtifactError) as exc:
        iter_artifact_files(root)
    assert exc.value.problems == [
        "a\\b: unsafe file name: contains a backslash (paths are POSIX, '/'-separated)"
    ]
