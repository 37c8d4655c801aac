"""Verify an artifact directory against its manifest before anything in it is used."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ingot.artifacts.digest import sha256_bytes, sha256_file
from ingot.artifacts.errors import ArtifactError
from ingot.artifacts.fingerprint import StatKey, stat_key
from ingot.artifacts.manifest import (
    FileEntry,
    Manifest,
    parse_manifest,
    read_manifest_bytes,
    reference_problems,
)
from ingot.artifacts.partial import PARTIAL_NAME, PartialRecord, read_partial
from ingot.artifacts.paths import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    display_path,
    safe_relative_path,
    scan_artifact_files,
)

__all__ = ["Verified", "check_artifact", "manifest_digest", "verify_artifact"]


@dataclass(frozen=True, slots=True)
class Verified:
    manifest: Manifest
    digest: str  # sha256:<hex> of manifest.json
    hashed: tuple[str, ...]  # the files whose bytes were hashed (the others matched `trusted`)
    partial: PartialRecord | None  # the record of a partial pull, None for a whole artifact

    @property
    def absent(self) -> tuple[str, ...]:
        return self.partial.absent if self.partial is not None else ()


def verify_artifact(root: Path | str, *, trusted: Mapping[str, StatKey] | None = None) -> Manifest:
    """Check every file of the artifact at `root` against its manifest; return the manifest.
    See check_artifact."""
    return check_artifact(root, trusted=trusted).manifest


def check_artifact(root: Path | str, *, trusted: Mapping[str, StatKey] | None = None) -> Verified:
    """Check every file of the artifact at `root` against its manifest.

    All problems are collected and raised together as one ArtifactError (see `.problems`):
    a missing, resized, altered or linked file; a file on disk the manifest does not list
    (an engine could still load it); an unsafe path; a referenced path outside `files`.
    A file the partial-pull record (ingot.partial.json) lists as absent may be missing.
    `trusted` ({path: stat key}, artifacts/fingerprint.py): a file whose stat still equals its
    key is not re-hashed (its bytes were checked when the key was taken); every other is.
    """
    root = Path(root)
    if root.is_symlink():
        raise ArtifactError(f"{root}: artifact root is a symbolic link; pass the real directory")
    if not root.is_dir():
        raise ArtifactError(f"{root}: not a directory")
    raw = read_manifest_bytes(root)
    manifest = parse_manifest(raw, str(root / MANIFEST_NAME))
    digest = "sha256:" + sha256_bytes(raw)
    partial = read_partial(root)
    problems = _partial_problems(partial, manifest, digest)
    absent = set(partial.absent) if partial is not None else set()

    hashed: list[str] = []
    for entry in manifest.files:
        problem = _check_entry(root, entry, trusted or {}, hashed)
        if problem == f"{entry.path}: missing" and entry.path in absent:
            continue
        if problem is not None:
            problems.append(problem)

    listed = {entry.path for entry in manifest.files}
    on_disk, refused = scan_artifact_files(root)
    for rel in on_disk:
        # model.sig signs manifest.json, so it cannot be listed there; it is checked by
        # signing.verify_signature when a signature is required. The partial-pull record
        # only excuses absences (above).
        if rel not in listed and rel not in (SIGNATURE_NAME, PARTIAL_NAME):
            problems.append(f"{rel}: present but not listed in the manifest")
    for rel, why in refused.items():
        if rel not in listed:  # a listed link was already reported by its entry check
            problems.append(f"{display_path(rel)}: {why}")
    problems += reference_problems(manifest)

    if problems:
        raise ArtifactError.from_problems(f"{root}: artifact verification failed", problems)
    return Verified(manifest, digest, tuple(hashed), partial)


def _partial_problems(partial: PartialRecord | None, manifest: Manifest, digest: str) -> list[str]:
    if partial is None:
        return []
    if partial.manifest != digest:
        return [f"{PARTIAL_NAME}: written for manifest {partial.manifest[:19]}…, not this one"]
    listed = {f.path for f in manifest.files}
    return [
        f"{PARTIAL_NAME}: lists {display_path(p)} as absent, a file the manifest does not list"
        for p in partial.absent
        if p not in listed
    ]


def _check_entry(
    root: Path, entry: FileEntry, trusted: Mapping[str, StatKey], hashed: list[str]
) -> str | None:
    if entry.path == MANIFEST_NAME:
        return f"{MANIFEST_NAME}: the manifest cannot list itself"
    if entry.path == SIGNATURE_NAME:
        return f"{SIGNATURE_NAME}: the manifest cannot list the signature over itself"
    if entry.path == PARTIAL_NAME:
        return f"{PARTIAL_NAME}: the manifest cannot list the partial-pull record"
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
    if trusted.get(entry.path) == stat_key(info):
        return None  # unchanged since its bytes were checked
    hashed.append(entry.path)
    actual = sha256_file(path)
    if actual != entry.sha256:
        return f"{entry.path}: sha256 mismatch (manifest {entry.sha256[:12]}…, file {actual[:12]}…)"
    return None


def manifest_digest(root: Path | str) -> str:
    """`sha256:<hex>` of root/manifest.json as stored: the artifact's identity."""
    return "sha256:" + sha256_bytes(read_manifest_bytes(Path(root)))
