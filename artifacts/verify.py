"""Verify an artifact directory against its manifest before anything in it is used."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ingot.artifacts.digest import sha256_bytes, sha256_file
from ingot.artifacts.errors import ArtifactError
from ingot.artifacts.manifest import (
    FileEntry,
    Manifest,
    read_manifest,
    read_manifest_bytes,
    reference_problems,
)
from ingot.artifacts.paths import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    display_path,
    safe_relative_path,
    scan_artifact_files,
)

__all__ = ["manifest_digest", "verify_artifact"]


def verify_artifact(root: Path | str) -> Manifest:
    """Check every file of the artifact at `root` against its manifest; return the manifest.

    All problems are collected and raised together as one ArtifactError (see `.problems`):
    a missing, resized, altered or linked file; a file on disk the manifest does not list
    (an engine could still load it); an unsafe path; a referenced path outside `files`.
    """
    root = Path(root)
    if root.is_symlink():
        raise ArtifactError(f"{root}: artifact root is a symbolic link; pass the real directory")
    if not root.is_dir():
        raise ArtifactError(f"{root}: not a directory")
    manifest = read_manifest(root)

    problems: list[str] = []
    for entry in manifest.files:
        problem = _check_entry(root, entry)
        if problem is not None:
            problems.append(problem)

    listed = {entry.path for entry in manifest.files}
    on_disk, refused = scan_artifact_files(root)
    for rel in on_disk:
        # model.sig signs manifest.json, so it cannot be listed there; it is checked by
        # signing.verify_signature when a signature is required.
        if rel not in listed and rel != SIGNATURE_NAME:
            problems.append(f"{rel}: present but not listed in the manifest")
    for rel, why in refused.items():
        if rel not in listed:  # a listed link was already reported by its entry check
            problems.append(f"{display_path(rel)}: {why}")
    problems += reference_problems(manifest)

    if problems:
        raise ArtifactError.from_problems(f"{root}: artifact verification failed", problems)
    return manifest


def _check_entry(root: Path, entry: FileEntry) -> str | None:
    if entry.path == MANIFEST_NAME:
        return f"{MANIFEST_NAME}: the manifest cannot list itself"
    if entry.path == SIGNATURE_NAME:
        return f"{SIGNATURE_NAME}: the manifest cannot list the signature over itself"
    try:
        path = safe_relative_path(root, entry.path)
    except ArtifactError as e:
        return e.problems[0]
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return f"{entry.path}: missing"
    if not stat.S_ISREG(info.st_mode):
        return f"{entry.path}: not a regular file"
    if info.st_size != entry.size:
        return (
            f"{entry.path}: size mismatch (manifest {entry.size} bytes, file {info.st_size} bytes)"
        )
    actual = sha256_file(path)
    if actual != entry.sha256:
        return f"{entry.path}: sha256 mismatch (manifest {entry.sha256[:12]}…, file {actual[:12]}…)"
    return None


def manifest_digest(root: Path | str) -> str:
    """`sha256:<hex>` of root/manifest.json as stored: the artifact's identity."""
    return "sha256:" + sha256_bytes(read_manifest_bytes(Path(root)))
