"""SHA-256 digests of files and bytes, as lowercase hex."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["sha256_bytes", "sha256_file"]

# Large enough to keep hashing I/O-bound, small enough that a multi-GB weights file never
# sits in memory.
_CHUNK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """Hex SHA-256 of a file's contents, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()
