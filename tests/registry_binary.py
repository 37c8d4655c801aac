"""Where the registry tests find Debian's `docker-registry` (the CNCF distribution).

The README's test command must pass on a fresh machine with no manual step, so a missing
binary is fetched rather than skipped: `apt-get download docker-registry` (no install, no
root needed once the package lists exist) unpacked with `dpkg-deb -x` into a per-user cache,
reused by later runs. The binary is a static Go program needing only libc, so the unpacked
`usr/bin/docker-registry` runs as it is. Where none of that works the tests fail, saying why.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["SYSTEM_BIN", "registry_binary"]

SYSTEM_BIN = Path("/usr/bin/docker-registry")
PACKAGE = "docker-registry"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ingot-tests" / PACKAGE


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


def _download(into: Path) -> Path:
    """The package's .deb in `into`; refreshes the package lists once if apt cannot find it
    (a fresh image ships none) and this process may."""
    result = _run(["apt-get", "download", PACKAGE], into)
    if result.returncode != 0 and os.geteuid() == 0:
        update = _run(["apt-get", "update", "-q"], into)
        if update.returncode != 0:
            raise RuntimeError(f"apt-get update failed: {update.stderr.strip()[-400:]}")
        result = _run(["apt-get", "download", PACKAGE], into)
    debs = sorted(into.glob(f"{PACKAGE}_*.deb"))
    if result.returncode != 0 or not debs:
        raise RuntimeError(f"apt-get download {PACKAGE} failed: {result.stderr.strip()[-400:]}")
    return debs[0]


def _fetch(cache: Path) -> Path:
    binary = cache / "usr" / "bin" / PACKAGE
    # Unpacked beside the cache, so the final rename is atomic: no half-written binary.
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=cache.parent) as tmp:
        deb = _download(Path(tmp))
        unpacked = Path(tmp) / "root"
        result = _run(["dpkg-deb", "-x", str(deb), str(unpacked)], Path(tmp))
        if result.returncode != 0:
            raise RuntimeError(f"dpkg-deb -x {deb.name} failed: {result.stderr.strip()[-400:]}")
        if cache.exists():
            shutil.rmtree(cache)
        unpacked.rename(cache)
    return binary


def registry_binary() -> Path:
    """The system's docker-registry, else a cached unpacked copy, else one fetched now.

    Raises RuntimeError naming the step that failed (no apt-get, no network, no package)."""
    if os.access(SYSTEM_BIN, os.X_OK):
        return SYSTEM_BIN
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise RuntimeError(
            f"{SYSTEM_BIN} not found and this machine has no apt-get / dpkg-deb to fetch "
            f"Debian's {PACKAGE} package"
        )
    cache = _cache_dir()
    binary = cache / "usr" / "bin" / PACKAGE
    cache.parent.mkdir(parents=True, exist_ok=True)
    # One fetch at a time: concurrent test sessions share the cache.
    with open(cache.parent / f"{PACKAGE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.access(binary, os.X_OK):
            binary = _fetch(cache)
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"the {PACKAGE} package unpacked to {cache} has no {binary.name}")
    return binary
