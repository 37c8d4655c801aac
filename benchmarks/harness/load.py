"""The quiet-host rule: sample the host's load around a benchmark, record it in the report, and
refuse a run whose load exceeded its thread count.

The rule itself, `LoadWatch`, is ingot's (ingot.common.host_load: `ingot sweep` times its
variants under it too); it is re-exported here. Every benchmark keeps a
`LoadWatch` of its thread count, samples it between cases (or every few seconds while a long
case runs: `sampling`), puts `record()` in its report and `refusal()` under "refused"; the
report writer (report.py) then marks the report REFUSED and the benchmark exits 1. A benchmark
that reports no timing (perplexity, bytes, agreement) keeps a watch that records but never
refuses (`timed=False`). Finer tools for noisier settings: `wait_idle` before a run starts,
`SettledWatch` around each run (a pause, then a wait for the load to come down), and
`OtherWork`, which repeats a timed measurement while other processes took CPU during it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ingot.common.host_load import LoadWatch

__all__ = ["LoadWatch", "OtherWork", "SettledWatch", "load_line", "wait_idle"]

Result = TypeVar("Result")
_KERNEL_UPDATE_S = 5  # the kernel recomputes the load average every 5 s


class SettledWatch:
    """The host's load around each run, settled first. Before a run: a pause of `settle_s`,
    then a wait (at most `max_wait_s`) for the 1-minute load average to come down to the thread
    count, so that the previous run's own threads (or a server's compile at start) fade from
    it; then the LoadWatch sample, which is mostly other work: where it still exceeds the
    rule's limit the run is refused. After it: the load right away, its own threads included
    (recorded beside the run only)."""

    def __init__(self, watch: LoadWatch, settle_s: float, max_wait_s: float) -> None:
        self.watch, self.settle_s, self.max_wait_s = watch, settle_s, max_wait_s

    def settle(self) -> tuple[float, float]:
        """(the sample, seconds waited)."""
        started = time.monotonic()
        time.sleep(self.settle_s)
        deadline = started + self.settle_s + self.max_wait_s
        while os.getloadavg()[0] > self.watch.threads and time.monotonic() < deadline:
            time.sleep(_KERNEL_UPDATE_S)
        return self.watch.sample(), time.monotonic() - started

    def around(self, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`run`'s result with the load before it (settled) and right after it."""
        before, waited = self.settle()
        result = run()
        after = os.getloadavg()[0]
        loads = {"loadavg_1min_before": before, "loadavg_1min_after": after, "settled_s": waited}
        return result | loads

    def finish(self) -> str | None:
        """A last settled sample, then the watch's refusal."""
        self.settle()
        return self.watch.refusal()


class OtherWork:
    """Runs a timed measurement again while other processes took CPU during it: their CPU
    time is the host's busy time (/proc/stat, steal included) less this process's own. A few
    seconds of someone else's work barely moves the 1-min load but spoils one timed run (and
    so its ratio to the run it is paired with)."""

    def __init__(self, limit_cores: float, max_attempts: int) -> None:
        self.limit_cores, self.max_attempts = limit_cores, max_attempts
        self.tick = os.sysconf("SC_CLK_TCK")
        self.records: list[dict[str, float]] = []

    def call(self, measure: Callable[[], Result]) -> Result:
        """`measure()`, repeated (up to max_attempts in all) while others used more than
        `limit_cores` cores during it; the last attempt's result is kept whatever it saw."""
        for attempt in range(1, self.max_attempts + 1):
            start = self._snapshot()
            result = measure()
            end = self._snapshot()
            wall = end[0] - start[0]
            others = ((end[1] - start[1]) - (end[2] - start[2])) / wall
            if others <= self.limit_cores or attempt == self.max_attempts:
                self.records.append({"others_cores": others, "attempts": attempt})
                return result
        raise AssertionError("unreachable")

    def summary(self) -> dict[str, Any]:
        return {
            "limit_cores": self.limit_cores,
            "max_attempts": self.max_attempts,
            "measurements": len(self.records),
            "repeated": sum(r["attempts"] > 1 for r in self.records),
            "extra_attempts": sum(r["attempts"] - 1 for r in self.records),
            "still_disturbed": sum(r["others_cores"] > self.limit_cores for r in self.records),
            "max_others_cores_kept": max((r["others_cores"] for r in self.records), default=0),
        }

    def _snapshot(self) -> tuple[float, float, float]:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        # user, nice, system, irq, softirq, steal (idle and iowait are not busy)
        busy = sum(ticks[i] for i in (0, 1, 2, 5, 6, 7)) / self.tick
        own = os.times()
        return time.perf_counter(), busy, own.user + own.system


def load_line(load: dict[str, Any], refused: str | None) -> str:
    """The report's line on the host load: `load` is LoadWatch.record(), `refused` its
    refusal()."""
    samples = load["load_1min_samples"]
    line = (
        f"Host load (1-min load average, sampled between cases): max {max(samples):.1f}, "
        f"{len(samples)} samples, {load['threads']} benchmark threads"
    )
    return line + (f": REFUSED ({refused})." if refused else ": quiet enough.")


def wait_idle(limit_s: float, log: Callable[[str], None], poll_s: float = 30) -> float:
    """Wait (up to limit_s, polling every poll_s) until other work leaves the CPU (the 1-min
    load drops below 1): the engines need every core. Returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s and os.getloadavg()[0] >= 1.0:
        log(f"waiting for an idle host (1-min load {os.getloadavg()[0]:.2f})")
        time.sleep(poll_s)
    return time.perf_counter() - started
