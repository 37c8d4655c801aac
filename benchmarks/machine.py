"""The host a benchmark ran on: CPU, cores, RAM, library versions, memory bandwidth, peak RSS."""

from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "LoadWatch",
    "load_line",
    "machine_info",
    "measure_bandwidth",
    "memory_status",
    "wait_idle",
]

_LIBRARIES = ("numpy", "torch", "onnxruntime", "onnx", "transformers", "tokenizers", "ingot")
_BANDWIDTH_BYTES = 1 << 30  # 1 GiB: far larger than any cache, so every pass streams from DRAM
_BANDWIDTH_REPEATS = 5


class LoadWatch:
    """The host's 1-minute load average sampled around a benchmark, and the verdict on it.

    A run beside other jobs has measured up to 2x off on a 2-core host, so a report whose load
    exceeded the benchmark's thread count is refused: `refusal()` says why, and the caller
    writes that into the report (marked "refused") and exits non-zero instead of quoting it.
    Call `sample()` between cases; the highest sample decides. The benchmark's own threads
    keep the load near their count (the 1-minute average decays slowly after each case), so
    one more runnable process is allowed: other work shows above `threads + 1`.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.samples: list[float] = []
        self.sample()

    def sample(self) -> float:
        load = os.getloadavg()[0]
        self.samples.append(load)
        return load

    def refusal(self) -> str | None:
        """None for a quiet run, else the reason its numbers are not valid."""
        self.sample()
        worst = max(self.samples)
        if worst <= self.threads + 1:
            return None
        return (
            f"host 1-min load reached {worst:.1f} with {self.threads} benchmark threads: other "
            "work competed for the CPU, so the numbers are not valid (rerun on a quiet host)"
        )

    def record(self) -> dict[str, Any]:
        return {"threads": self.threads, "load_1min_samples": [round(v, 2) for v in self.samples]}


def load_line(load: dict[str, Any], refused: str | None) -> str:
    """The report's line on the host load: `load` is LoadWatch.record(), `refused` its
    refusal()."""
    samples = load["load_1min_samples"]
    line = (
        f"Host load (1-min load average, sampled between cases): max {max(samples):.1f}, "
        f"{len(samples)} samples, {load['threads']} benchmark threads"
    )
    return line + (f": REFUSED ({refused})." if refused else ": quiet enough.")


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


def wait_idle(limit_s: float, log: Callable[[str], None], poll_s: float = 30) -> float:
    """Wait (up to limit_s, polling every poll_s) until other work leaves the CPU (the 1-min
    load drops below 1): the engines need every core. Returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s and os.getloadavg()[0] >= 1.0:
        log(f"waiting for an idle host (1-min load {os.getloadavg()[0]:.2f})")
        time.sleep(poll_s)
    return time.perf_counter() - started
