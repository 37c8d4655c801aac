"""Read an engine's weights ahead: the kernel reads the external data file while ONNX Runtime
parses the graph and prepacks the first weights, instead of page by page as the prepacking
touches them (the 1B shape from a dropped page cache: 1.8 s to open instead of 2.4 s;
benchmarks/scale/coldstart.py). Nothing is read into Python: the pages go to the page cache,
which ORT's memory map then finds."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["read_ahead"]


def read_ahead(engine_file: Path) -> Path | None:
    """Ask the kernel (POSIX_FADV_WILLNEED, asynchronous) to read `engine_file`'s external data
    file (`<name>.data` beside it, as the engine build writes it); the file asked for, or None
    where there is none or the platform has no posix_fadvise."""
    data = Path(engine_file).with_name(Path(engine_file).name + ".data")
    if not data.is_file() or not hasattr(os, "posix_fadvise"):
        return None
    fd = os.open(data, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)
    return data
