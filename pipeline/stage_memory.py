"""Peak resident memory of each build stage, from the kernel's own high-water mark.

At a stage's start the process's freed heap is handed back to the OS (glibc ``malloc_trim``:
what the stage before it freed but glibc kept must not count as this stage's) and the peak
resident set (``VmHWM``) is reset to the current one (``/proc/self/clear_refs``, "5"); at its
end ``VmHWM`` is the stage's peak. No sampling, so a short spike is not missed. Where the
kernel offers no reset (not Linux, or a restricted /proc) every stage reports None.

The reset is the process's: after a build, `getrusage(RUSAGE_SELF).ru_maxrss` (and VmHWM) is
the last stage's peak, not the whole process's; a caller after that should take the largest
`StageRun.peak_rss_bytes`.
"""

from __future__ import annotations

import ctypes

__all__ = ["StagePeak"]


class StagePeak:
    """``start()`` before a stage, ``peak()`` after it: the stage's peak RSS in bytes, or None."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._resettable = True

    def start(self) -> None:
        if self._libc is not None:
            self._libc.malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := current RSS
        except OSError:
            self._resettable = False

    def peak(self) -> int | None:
        if not self._resettable:
            return None
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024  # kB
        except OSError:
            pass
        return None


def _libc() -> ctypes.CDLL | None:
    """glibc, for malloc_trim; None elsewhere (musl, macOS: nothing to trim the same way)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 (a glibc-only symbol: AttributeError elsewhere)
    except (OSError, AttributeError):
        return None
    return libc
