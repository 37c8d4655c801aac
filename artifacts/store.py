"""The local content-addressed store of pulled blobs, and artifact directories made from it.

    <root>/blobs/sha256/<hex>     complete blobs, size and sha256 checked before the rename
    <root>/tmp/<hex>.partial      a download in progress; the next pull resumes from its size
    <root>/artifacts/<hex>/       artifact directories materialized from OCI manifest <hex>
    <root>/verified/<hex>.json    the stat of each of their files once verified (fingerprint.py)

<root> is $INGOT_STORE_DIR, else $INGOT_CACHE_DIR, else ~/.cache/ingot. A blob only ever
appears under blobs/ by an atomic rename of a file whose size and digest matched, so a crash or
a cut connection can leave a partial file in tmp/ but never a wrong one in blobs/.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from ingot.artifacts.digest import sha256_bytes, sha256_file
from ingot.artifacts.errors import ArtifactError
from ingot.artifacts.fingerprint import load_fingerprints, save_fingerprints, take_fingerprints
from ingot.artifacts.partial import PartialRecord, write_partial
from ingot.artifacts.paths import MANIFEST_NAME, display_path, safe_relative_path
from ingot.artifacts.verify import Verified, check_artifact

__all__ = [
    "BlobStore",
    "FileBlob",
    "PartialBlob",
    "default_store_dir",
    "materialize",
    "verify_stored",
]

_CHUNK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")


def default_store_dir() -> Path:
    env = os.environ.get("INGOT_STORE_DIR") or os.environ.get("INGOT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ingot"


@dataclass(frozen=True, slots=True)
class FileBlob:
    """One file of an artifact as a registry holds it: relative path, blob digest, size."""

    path: str
    digest: str  # "sha256:<hex>"
    size: int


class BlobStore:
    """Blobs by sha256 under `root` (default: default_store_dir())."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_store_dir()

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / _hex(digest)

    def has_blob(self, digest: str, size: int) -> bool:
        """A complete blob is present (its digest was checked when it was stored)."""
        try:
            info = os.lstat(self.blob_path(digest))
        except FileNotFoundError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_size == size

    def read_blob(self, digest: str, limit: int) -> bytes | None:
        """A small stored blob's bytes, re-checked against its digest; None if absent or bad."""
        path = self.blob_path(digest)
        try:
            if path.stat().st_size > limit:
                return None
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return data if "sha256:" + sha256_bytes(data) == digest else None

    def put_bytes(self, data: bytes) -> str:
        """Store a small blob (manifest, config) atomically; returns its digest."""
        digest = "sha256:" + sha256_bytes(data)
        if not self.has_blob(digest, len(data)):
            tmp_dir = self._tmp_dir()
            fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=".put-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self._commit(Path(tmp), digest)
        return digest

    def evict(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.blob_path(digest))

    def open_partial(self, blob: FileBlob) -> PartialBlob:
        """The resumable temp file of `blob`, locked against a concurrent pull of the same blob."""
        return PartialBlob(self, blob)

    def artifact_dir(self, manifest_digest: str) -> Path:
        return self.root / "artifacts" / _hex(manifest_digest)

    def fingerprint_path(self, manifest_digest: str) -> Path:
        """The verify-once record of artifact_dir(manifest_digest) (artifacts/fingerprint.py)."""
        return self.root / "verified" / f"{_hex(manifest_digest)}.json"

    def _tmp_dir(self) -> Path:
        path = self.root / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _commit(self, tmp: Path, digest: str) -> None:
        final = self.blob_path(digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o444)  # blobs are immutable; materialized hard links share the inode
        os.replace(tmp, final)


class PartialBlob:
    """<store>/tmp/<hex>.partial: appended to while hashed, renamed into blobs/ when complete.

    Holds an exclusive lock for its lifetime, so two pulls of one blob do not interleave.
    A partial file left by an interrupted pull is re-hashed on open and resumed from its size.
    """

    def __init__(self, store: BlobStore, blob: FileBlob) -> None:
        self.store, self.blob = store, blob
        self.path = store._tmp_dir() / f"{_hex(blob.digest)}.partial"
        self._file = open(self.path, "a+b")  # noqa: SIM115 - closed in close()
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)  # waits for a concurrent pull
        self._hash = hashlib.sha256()
        self._file.seek(0)
        while chunk := self._file.read(_CHUNK):
            self._hash.update(chunk)
        self.offset = self._file.tell()
        if self.offset > blob.size:
            self.restart()

    def restart(self) -> None:
        """Discard what was downloaded (the registry cannot resume it)."""
        self._file.truncate(0)
        self._file.seek(0)
        self._hash, self.offset = hashlib.sha256(), 0

    def write(self, chunk: bytes) -> None:
        if self.offset + len(chunk) > self.blob.size:
            self._discard()
            raise ArtifactError(
                f"{display_path(self.blob.path)}: the registry sent more than the "
                f"{self.blob.size} bytes its manifest declares; refused"
            )
        self._file.write(chunk)
        self._hash.update(chunk)
        self.offset += len(chunk)

    def commit(self) -> None:
        """Check size and sha256 against the manifest, then rename into the store atomically."""
        actual = "sha256:" + self._hash.hexdigest()
        if self.offset != self.blob.size or actual != self.blob.digest:
            self._discard()
            raise ArtifactError(
                f"{display_path(self.blob.path)}: blob refused: expected {self.blob.size} bytes "
                f"with {self.blob.digest[:19]}…, received {self.offset} bytes with "
                f"{actual[:19]}… (the registry's copy is corrupt or was altered); nothing stored"
            )
        self._file.flush()
        os.fsync(self._file.fileno())
        self.store._commit(self.path, self.blob.digest)

    def close(self) -> None:
        self._file.close()  # releases the lock; an incomplete file stays for the next pull

    def _discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.restart()

    def __enter__(self) -> PartialBlob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def materialize(
    store: BlobStore,
    files: Sequence[FileBlob],
    out: Path | str,
    *,
    check: Callable[[Path], object] | None = None,
    partial: PartialRecord | None = None,
    checked: Collection[str] = (),
) -> Verified:
    """Lay `files` out as an artifact directory at `out` from the store, then verify it.

    Files are hard links to the store's blobs where the filesystem allows (no copy, no extra
    space), else copies. The directory is assembled next to `out` and renamed into place only
    after check_artifact (and `check`, e.g. a signature check) passed, so `out` is never a
    half-written or unverified artifact. An existing empty directory (a volume mount point) is
    filled in place instead; an existing non-artifact directory is never overwritten.
    `partial`: the record of the files left out (written beside manifest.json). `checked`: the
    digests of blobs hashed on their way into the store by this very pull; their files are not
    hashed again.
    """
    out = Path(out)
    in_place = out.is_dir() and not out.is_symlink() and not any(out.iterdir())
    if out.exists() and not in_place and not (out / MANIFEST_NAME).is_file():
        raise ArtifactError(f"{out}: exists and is not an ingot artifact; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out if in_place else Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}-"))
    try:
        if not in_place:
            os.chmod(work, 0o755)  # mkdtemp's 0700 would hide it from a server's other user
        for f in files:
            target = safe_relative_path(work, f.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(store.blob_path(f.digest), target)
        if partial is not None:
            write_partial(work, partial)
        # After every link: a link to a blob changes its inode's ctime, so keys taken earlier
        # would not match. Copies (another filesystem) are never trusted: they were not hashed.
        fresh = [f.path for f in files if f.digest in checked]
        linked = [p for p in fresh if os.lstat(work / p).st_nlink > 1]
        verified = check_artifact(work, trusted=take_fingerprints(work, linked))
        if check is not None:
            check(work)
    except BaseException:
        _clear(work, remove_root=not in_place)
        raise
    if not in_place:
        _swap_into_place(work, out)
    return verified


def verify_stored(root: Path, *, full: bool = False) -> Verified:
    """check_artifact for `root`; where it is a store's artifact directory
    (<store>/artifacts/<hex>) with a verify-once record, files whose stat still matches the
    record are not re-hashed (unless `full`), and the record is refreshed for those that were.
    """
    root = Path(root)
    hexname = root.name
    record = root.parent.parent / "verified" / f"{hexname}.json"
    in_store = root.parent.name == "artifacts" and _HEX64.fullmatch(hexname) is not None
    if full or not in_store:
        return check_artifact(root)
    manifest_sha = "sha256:" + sha256_file(root / MANIFEST_NAME)
    verified = check_artifact(root, trusted=load_fingerprints(record, manifest_sha))
    if verified.hashed:  # a new key for what changed on disk but not in content
        present = sorted({f.path for f in verified.manifest.files} - set(verified.absent))
        save_fingerprints(record, verified.digest, take_fingerprints(root, present))
    return verified


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copyfile(source, target)  # another filesystem: the store cannot be shared
        os.chmod(target, 0o644)


def _swap_into_place(new: Path, out: Path) -> None:
    if not out.exists():
        try:
            os.rename(new, out)
            return
        except OSError as e:  # a concurrent pull of the same artifact got there first
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not (out / MANIFEST_NAME).exists():
                raise
            shutil.rmtree(new, ignore_errors=True)
            return
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".old-{out.name}-"))
    os.replace(out, old / "artifact")
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)


def _clear(directory: Path, *, remove_root: bool) -> None:
    if remove_root:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _hex(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or not _HEX64.fullmatch(hexdigest):
        raise ArtifactError(f"{digest!r}: not a sha256:<64 hex> digest")
    return hexdigest
