"""The host a benchmark ran on: CPU, cores, RAM, library versions, memory bandwidth, peak RSS.

Whether the host was quiet while it ran is load.py's.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["machine_info", "measure_bandwidth", "memory_status"]

_LIBRARIES = ("numpy", "torch", "onnxruntime", "onnx", "transformers", "tokenizers", "ingot")
_BANDWIDTH_BYTES = 1 << 30  # 1 GiB: far larger than any cache, so every pass streams from DRAM
_BANDWIDTH_REPEATS = 5


def machine_info() -> dict[str, Any]:
    cpuinfo = _read("/proc/cpuinfo")
    meminfo = _read("/proc/meminfo")
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_model": _first_field(cpuinfo, "model name"),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "ram_bytes": int(_first_field(meminfo, "MemTotal").split()[0]) * 1024,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in _LIBRARIES},
    }


def measure_bandwidth(threads: int) -> dict[str, Any]:
    """DRAM read bandwidth (bytes read per second, best of 5) by three methods.

    Decode streams weights once per token, so a read-mostly reduction is the matching kernel.
    numpy reductions run on one thread; torch's sum uses `threads`, which is what the
    multi-threaded engines can draw on. The bound uses the highest read-only figure, so it is
    the most demanding bound this host supports.
    """
    a = np.ones(_BANDWIDTH_BYTES // 4, dtype=np.float32)
    b = np.empty_like(a)
    methods = {
        "numpy_sum_1thread": _best_rate(lambda: a.sum(), a.nbytes),
        # Reads 1 GiB and writes 1 GiB; reported as bytes read / s (writes not counted).
        "numpy_add_out_1thread": _best_rate(lambda: np.add(a, 0, out=b), a.nbytes),
    }
    methods[f"torch_sum_{threads}threads"] = _torch_sum_rate(a, threads)
    read_only = {k: v for k, v in methods.items() if "add_out" not in k and v is not None}
    best = max(read_only, key=read_only.get)
    return {
        "bytes_per_pass": a.nbytes,
        "repeats": _BANDWIDTH_REPEATS,
        "methods_bytes_per_s": methods,
        "bound_method": best,
        "bytes_per_s": read_only[best],
    }


def memory_status() -> dict[str, int]:
    """This process's peak resident set size, and the current one (at exit for a worker, after
    the engine is freed), in bytes, from /proc/self/status."""
    status = _read("/proc/self/status")
    return {
        "peak_rss_bytes": int(_first_field(status, "VmHWM").split()[0]) * 1024,
        "rss_at_exit_bytes": int(_first_field(status, "VmRSS").split()[0]) * 1024,
    }


def _best_rate(kernel, nbytes: int) -> float:
    kernel()  # first touch: page faults are not bandwidth
    best = float("inf")
    for _ in range(_BANDWIDTH_REPEATS):
        start = time.perf_counter()
        kernel()
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def _torch_sum_rate(a: np.ndarray, threads: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t = torch.from_numpy(a)  # shares the buffer: no copy, same pages
        return _best_rate(lambda: t.sum(), a.nbytes)
    finally:
        torch.set_num_threads(previous)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _first_field(text: str, key: str) -> str:
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return "unknown"


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None
