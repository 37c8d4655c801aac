"""A local artifact directory for what a user names: a path, or an `oci://` reference."""

from __future__ import annotations

from pathlib import Path

from ingot.artifacts.reference import is_oci_reference
from ingot.artifacts.store import BlobStore

__all__ = ["resolve_artifact"]


def resolve_artifact(ref_or_path: Path | str, *, store: BlobStore | None = None) -> Path:
    """The local artifact directory for a path or an `oci://` reference.

    A reference is pulled into the store (blobs already there are not downloaded again; a
    digest reference already materialized needs no network at all). Paths are returned as is:
    verification is the loader's job.
    """
    if is_oci_reference(ref_or_path):
        # requests and oras load only when a registry is named: serving a directory needs neither
        from ingot.artifacts.oci import pull

        return pull(str(ref_or_path), store=store, trust_existing=True).path
    return Path(ref_or_path)
