"""A local artifact directory for what a user names: a path, or an `oci://` reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ingot.artifacts.reference import is_oci_reference
from ingot.artifacts.store import BlobStore

if TYPE_CHECKING:  # oci.py imports requests: only when a registry is named
    from ingot.artifacts.oci import PullResult, Roles

__all__ = ["pull_reference", "resolve_artifact"]


def resolve_artifact(
    ref_or_path: Path | str, *, store: BlobStore | None = None, roles: Roles = None
) -> Path:
    """The local artifact directory for a path or an `oci://` reference.

    A reference is pulled into the store (only the files of `roles`, None: all; blobs already
    there are not downloaded again; a digest reference already materialized needs no network
    at all). Paths are returned as is: verification is the loader's job.
    """
    if is_oci_reference(ref_or_path):
        return pull_reference(str(ref_or_path), store=store, roles=roles).path
    return Path(ref_or_path)


def pull_reference(
    reference: str,
    *,
    store: BlobStore | None = None,
    roles: Roles = None,
    check: Callable[[Path], object] | None = None,
) -> PullResult:
    """Pull `reference` into the store (oci.pull): the files of `roles`, each checked on its
    way in, or by its recorded stat if the store already holds it."""
    # requests and oras load only when a registry is named: serving a directory needs neither
    from ingot.artifacts.oci import pull

    return pull(reference, store=store, roles=roles, check=check)
