"""Give freed heap memory back to the system after a request that needed a lot of it.

glibc serves a large allocation with its own mmap and unmaps it when freed, but only below a
threshold that rises to the size of the largest such block once one is freed (up to 32 MiB):
after the first multi-megabyte request body, later ones come from the heap, and the heap keeps
what they freed. A server that parsed a few 9 MB bodies then stays hundreds of megabytes
larger for the rest of its life. `malloc_trim(0)` returns the free pages of every arena; it
costs milliseconds, so it runs only after big requests (middleware.TRIM_AFTER_BYTES), not
per request. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["give_back_freed_memory"]


def _malloc_trim():  # -> the C function, or None where there is none
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


_TRIM = _malloc_trim()


def give_back_freed_memory() -> None:
    """Return the heap's free pages to the system (glibc's malloc_trim); a no-op elsewhere."""
    if _TRIM is not None:
        _TRIM(0)
