"""Safe paths inside an artifact directory.

An artifact comes from a registry or a colleague's disk, so every path in its manifest is
untrusted input: it must name a regular file inside the directory and nothing else. Links are
refused outright rather than resolved, because a link that points inside the directory today
can be re-pointed after verification, and one that points outside leaks host files to an engine.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ingot.artifacts.errors import ArtifactError

__all__ = [
    "MANIFEST_NAME",
    "SIGNATURE_NAME",
    "display_path",
    "iter_artifact_files",
    "safe_relative_path",
    "scan_artifact_files",
    "unsafe_path_reason",
]

MANIFEST_NAME = "manifest.json"
# The optional signature over manifest.json (artifacts/signing.py). It cannot be listed in the
# manifest it signs, so verification admits it unlisted, as a regular file at the top level only.
SIGNATURE_NAME = "model.sig"


def unsafe_path_reason(rel: str) -> str | None:
    """Why `rel` is not an acceptable artifact path by its spelling alone, or None if it is.

    Only canonical POSIX spellings are accepted, so each file has exactly one name in a manifest.
    """
    if not rel:
        return "empty path"
    if not rel.isprintable():
        return "contains a control character"
    if "\\" in rel:
        return "contains a backslash (paths are POSIX, '/'-separated)"
    if rel.startswith("/"):
        return "absolute path"
    for segment in rel.split("/"):
        if segment == "":
            return "empty path segment"
        if segment == "..":
            return "'..' segment"
        if segment == ".":
            return "'.' segment"
    return None


def display_path(rel: str) -> str:
    """`rel` as it should appear in an error: quoted when it could forge or hide a line."""
    return rel if rel and rel.isprintable() else repr(rel)


def _refuse(rel: str, why: str) -> ArtifactError:
    message = f"{display_path(rel)}: unsafe path: {why}"
    return ArtifactError(message, [message])


def safe_relative_path(root: Path, rel: str) -> Path:
    """Resolve `rel` inside `root`, refusing anything that could reach outside it.

    Refused: absolute paths, '..' / '.' / empty segments, backslashes, control characters,
    a symlink at any component, and any path that resolves outside `root`. The path need not
    exist (so a writer can use it too). Returns the resolved path.
    """
    root = Path(root)
    why = unsafe_path_reason(rel)
    if why is not None:
        raise _refuse(rel, why)

    current = root
    for segment in rel.split("/"):
        current = current / segment
        try:
            mode = os.lstat(current).st_mode
        except (FileNotFoundError, NotADirectoryError):
            break  # nothing below a missing component can exist, so no link either
        if stat.S_ISLNK(mode):
            shown = current.relative_to(root).as_posix()
            raise _refuse(rel, f"'{shown}' is a symbolic link")

    # Defence in depth: with no links and no '..' this cannot escape, but the check is cheap.
    resolved = (root / rel).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise _refuse(rel, f"resolves outside the artifact directory ({resolved})")
    return resolved


def scan_artifact_files(root: Path) -> tuple[list[str], dict[str, str]]:
    """Walk `root` without following links.

    Returns (sorted POSIX paths of the regular files, {path: why} for every entry that may not
    be in an artifact: links, FIFOs, sockets, devices, unsafe names). The top-level
    manifest.json is left out of both: it describes the others and cannot list itself.
    """
    files: list[str] = []
    refused: dict[str, str] = {}
    _scan(Path(root), "", files, refused)
    return sorted(files), dict(sorted(refused.items()))


def _scan(directory: Path, prefix: str, files: list[str], refused: dict[str, str]) -> None:
    with os.scandir(directory) as entries:
        for entry in entries:
            rel = prefix + entry.name
            if rel == MANIFEST_NAME:
                continue
            why = unsafe_path_reason(rel)
            if why is not None:
                refused[rel] = f"unsafe file name: {why}"
            elif entry.is_symlink():
                refused[rel] = "is a symbolic link"
            elif entry.is_dir(follow_symlinks=False):
                _scan(Path(entry.path), rel + "/", files, refused)
            elif entry.is_file(follow_symlinks=False):
                files.append(rel)
            else:
                refused[rel] = "is not a regular file"


def iter_artifact_files(root: Path) -> list[str]:
    """Sorted POSIX relative paths of every regular file under `root`, except manifest.json.

    Raises ArtifactError naming every link or non-regular file found.
    """
    files, refused = scan_artifact_files(root)
    if refused:
        problems = [f"{display_path(rel)}: {why}" for rel, why in refused.items()]
        raise ArtifactError.from_problems(f"{root}: not a valid artifact directory", problems)
    return files
