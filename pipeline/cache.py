"""Content-addressed stage cache: a stage's output directory, keyed by everything it depends on.

    <root>/stages/<stage>/<key>/          finished outputs (never modified after the rename)
    <root>/stages/<stage>/.tmp-<key>-<pid>  work in progress; renamed into place on success
    <root>/stages/<stage>/.work-<key>/      a resumable stage's checkpoints; they survive a crash
                                            (same key: same work) and go once the entry exists
    <root>/locks/<stage>-<key>              held (flock) while one build looks up or computes
                                            the entry (empty files, kept: removing one a
                                            waiter has open would let a third build in)

A failed or interrupted stage leaves only a temp directory behind, never a half-written entry,
so the cache and earlier artifacts stay intact.

Each entry records the digests of its files when it was written (``.digest``). A hit
re-hashes the entry (which the build needs anyway, for the stages downstream): one that no
longer matches its record (a file edited in place) is discarded and rebuilt, never served. The
package stage copies an entry's files without hashing them again: their digests are the ones
this build verified.

Builds may share one cache at once (the sweep's variants): `get_or_put` holds an exclusive
lock on the key while it looks the entry up and, on a miss, produces it, so a second build
needing the same stage waits for the first and is served its entry instead of computing the
stage again (and the resumable stages' work directories have one writer). The lock is
`fcntl.flock` on a file of its own under locks/: released by the kernel when its holder dies,
and honoured by the other hosts of a cache on NFS (Linux emulates it with POSIX locks there).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ingot.artifacts.digest import sha256_file

__all__ = ["StageCache", "code_digest", "default_cache_dir", "directory_digest", "stage_key"]


def default_cache_dir() -> Path:
    return Path(os.environ.get("INGOT_CACHE_DIR", Path.home() / ".cache" / "ingot"))


def stage_key(stage: str, recipe_slice: Any, input_digests: dict[str, str], versions: dict) -> str:
    """sha256 over (stage name, its recipe slice, its inputs' digests, the tools it uses)."""
    payload = json.dumps(
        {"stage": stage, "recipe": recipe_slice, "inputs": input_digests, "versions": versions},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def directory_digest(root: Path) -> tuple[str, dict[str, str]]:
    """(digest of the whole tree, {relative path: sha256}) over regular files, sorted by path."""
    files = {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }
    blob = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest(), files


def code_digest(*packages: str, exclude: tuple[str, ...] = ()) -> str:
    """sha256 (hex) over the source of the named packages: each one's every ``.py``, sorted by
    path, as its path relative to the package and its bytes, but for the subpackages under
    ``exclude`` (directories relative to a package's root: code that computes no stage). A
    stage key's input for code whose version number does not change with its source (an
    editable install)."""
    digest = hashlib.sha256()
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ValueError(f"code_digest: no package {name}")
        root = Path(spec.origin).parent
        for file in sorted(root.rglob("*.py")):
            if file.relative_to(root).parts[0] in exclude:
                continue
            digest.update(file.relative_to(root).as_posix().encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


_DIGEST = ".digest"  # an entry's directory_digest, taken when it was written


def _record(entry: Path) -> str:
    """What ``.digest`` holds for ``entry``: its digest and its files' sha256, as JSON."""
    digest, files = directory_digest(entry)
    return json.dumps({"digest": digest, "files": files}, sort_keys=True, indent=1) + "\n"


class StageCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root else default_cache_dir()

    def path(self, stage: str, key: str) -> Path:
        return self.root / "stages" / stage / key

    def get(self, stage: str, key: str) -> Path | None:
        """The finished entry, if there is one and its files are still those it was written
        with; one that changed since is discarded (module docstring)."""
        entry = self.path(stage, key)
        if not (entry / ".complete").exists():
            return None
        measured = _record(entry)
        recorded = entry / _DIGEST
        if not recorded.exists():  # written before entries recorded their digests
            recorded.write_text(measured)
        elif recorded.read_text() != measured:
            warnings.warn(
                f"stage cache entry {entry} changed since it was written: discarded, the "
                "stage runs again",
                stacklevel=2,
            )
            self._discard(entry)
            return None
        return entry

    def digest(self, entry: Path) -> str:
        """The digest of an entry `get` or `put` returned, as they verified or took it."""
        return json.loads((entry / _DIGEST).read_text())["digest"]

    def file_digests(self, entry: Path) -> dict[Path, str]:
        """{file: sha256} of an entry `get` or `put` returned, as they verified or took it."""
        files = json.loads((entry / _DIGEST).read_text())["files"]
        return {entry / rel: sha for rel, sha in files.items()}

    def _discard(self, entry: Path) -> None:
        doomed = entry.with_name(f".discarded-{entry.name}-{os.getpid()}")
        os.replace(entry, doomed)  # out of the way at once; a concurrent build sees no entry
        shutil.rmtree(doomed, ignore_errors=True)

    def work_dir(self, stage: str, key: str) -> Path:
        """A stable directory for ``stage``'s checkpoints under ``key``, kept across crashes."""
        work = self.path(stage, key).with_name(f".work-{key}")
        work.mkdir(parents=True, exist_ok=True)
        return work

    @contextmanager
    def locked(self, stage: str, key: str) -> Iterator[None]:
        """Hold the key's lock (exclusive, across processes) for the block."""
        lock = self.root / "locks" / f"{stage}-{key}"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
            yield

    def get_or_put(
        self, stage: str, key: str, produce: Callable[..., None], *, resumable: bool = False
    ) -> tuple[Path, bool]:
        """(the entry, whether it was already there): `get`, else `put`, under the key's lock
        (module docstring), so concurrent builds compute each entry once."""
        with self.locked(stage, key):
            hit = self.get(stage, key)
            if hit is not None:
                return hit, True
            return self.put(stage, key, produce, resumable=resumable), False

    def put(
        self, stage: str, key: str, produce: Callable[..., None], *, resumable: bool = False
    ) -> Path:
        """Run ``produce(tmp_dir)`` and move its output into the cache atomically.

        A ``resumable`` stage is called as ``produce(tmp_dir, work_dir)``: what it checkpoints
        in ``work_dir`` is there again when a crashed run is repeated, and is removed once the
        entry is in place.
        """
        final = self.path(stage, key)
        tmp = final.parent / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            if resumable:
                produce(tmp, self.work_dir(stage, key))
            else:
                produce(tmp)
            (tmp / _DIGEST).write_text(_record(tmp))
            (tmp / ".complete").write_text("")
            if final.exists():  # a concurrent build won the race with the same outputs
                shutil.rmtree(tmp)
            else:
                os.replace(tmp, final)
            if resumable:
                shutil.rmtree(final.with_name(f".work-{key}"), ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final
