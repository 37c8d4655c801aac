"""Verify once: the stat of each file of a store-materialized artifact, taken when its bytes
were known to match the manifest, so a later load compares stats instead of re-hashing.

A file's key is (size, mtime_ns, ctime_ns, inode, device). A write through any hard link to the
file (the store's blob or the artifact's entry share the inode) changes mtime and ctime; `touch`
or os.utime can put mtime back but the kernel sets ctime to now, which no unprivileged call can
undo; replacing the file changes the inode. A key that differs is not a failure: that file is
hashed again (new hard links and chmod change ctime too) and its key refreshed.

The record lives in the store, <store>/verified/<manifest hex>.json, outside the artifact
directory, and names the manifest.json digest it was taken for.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["StatKey", "load_fingerprints", "save_fingerprints", "stat_key", "take_fingerprints"]

StatKey = tuple[int, int, int, int, int]  # size, mtime_ns, ctime_ns, inode, device


def stat_key(info: os.stat_result) -> StatKey:
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


def take_fingerprints(root: Path, paths: Iterable[str]) -> dict[str, StatKey]:
    """{path: key} of the files `paths` under `root` (no link is followed)."""
    return {rel: stat_key(os.lstat(Path(root) / rel)) for rel in paths}


def save_fingerprints(record: Path, manifest_digest: str, keys: Mapping[str, StatKey]) -> bool:
    """Write `record` atomically; False where the store is read-only (loads then hash)."""
    data = json.dumps({"manifest": manifest_digest, "files": keys}, sort_keys=True).encode()
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=record.parent, prefix=".fp-")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, record)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True


def load_fingerprints(record: Path, manifest_digest: str) -> dict[str, StatKey]:
    """The keys recorded for `manifest_digest`; {} when there is no usable record."""
    try:
        data = json.loads(record.read_bytes())
        if data.get("manifest") != manifest_digest:
            return {}
        return {
            rel: tuple(int(v) for v in key)  # type: ignore[misc]
            for rel, key in data["files"].items()
            if isinstance(key, list) and len(key) == 5
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
