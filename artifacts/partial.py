"""ingot.partial.json: what a partial pull (`ingot pull --target`, `ingot serve oci://`) left out.

A pull for one target fetches only the files of the roles it needs (artifacts/roles.py); the
record beside manifest.json says which roles were pulled and which listed files are absent on
purpose, so verification can tell "not pulled" from "deleted". It is bound to manifest.json by
digest. Like model.sig it is the one other unlisted file verification admits; it only ever
excuses a listed file's absence, never lets an unlisted or altered file through.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ingot.artifacts.errors import ArtifactError

__all__ = ["PARTIAL_NAME", "PartialRecord", "read_partial", "write_partial"]

PARTIAL_NAME = "ingot.partial.json"
_FORMAT = "ingot.partial"
_MAX_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class PartialRecord:
    manifest: str  # sha256:<hex> of the manifest.json it belongs to
    roles: tuple[str, ...]  # the roles pulled
    absent: tuple[str, ...]  # the listed files not pulled

    def to_json(self) -> dict[str, object]:
        return {
            "format": _FORMAT,
            "manifest": self.manifest,
            "roles": sorted(self.roles),
            "absent": sorted(self.absent),
        }


def write_partial(root: Path, record: PartialRecord) -> None:
    path = Path(root) / PARTIAL_NAME
    path.write_text(json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
    os.chmod(path, 0o444)


def read_partial(root: Path | str) -> PartialRecord | None:
    """The record at root/ingot.partial.json, None without one; a malformed one is refused."""
    path = Path(root) / PARTIAL_NAME
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_BYTES:
        raise ArtifactError(f"{path}: not a regular file of at most {_MAX_BYTES} bytes")
    try:
        data = json.loads(path.read_bytes())
        fields = (data["manifest"], data["roles"], data["absent"])
        ok = data.get("format") == _FORMAT and all(
            isinstance(x, str) for x in [fields[0], *fields[1], *fields[2]]
        )
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ArtifactError(f"{path}: not an {_FORMAT} record (manifest, roles, absent)")
    return PartialRecord(fields[0], tuple(fields[1]), tuple(fields[2]))
