"""The quiet-host rule shared by the benchmarks and `ingot sweep`'s speed runs: sample the
host's 1-minute load average around timed work and refuse (or mark) a run whose load exceeded
what its own threads explain.

A run beside other jobs has measured up to 2x off on a 2-core host. Standard library only
(`os.getloadavg`), so every layer and the benchmarks' harness (benchmarks/harness/load.py,
which adds finer tools for noisier settings) use this one rule.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LoadWatch"]


class LoadWatch:
    """The host's 1-minute load average sampled around timed work, and the verdict on it.

    `refusal()` says why a run's numbers are not valid, or None. Call `sample()` between cases;
    the highest sample decides. The run's own threads keep the load near their count (the
    1-minute average decays slowly after each case), so one more runnable process is allowed:
    other work shows above `threads + 1`. An untimed run's watch (`timed` False) records the
    load but never refuses.
    """

    def __init__(self, threads: int, timed: bool = True) -> None:
        self.threads, self.timed = threads, timed
        self.samples: list[float] = []
        self.sample()

    def sample(self) -> float:
        load = os.getloadavg()[0]
        self.samples.append(load)
        return load

    def refusal(self) -> str | None:
        """None for a quiet run (or an untimed one), else the reason its numbers are not
        valid."""
        self.sample()
        worst = max(self.samples)
        if not self.timed or worst <= self.threads + 1:
            return None
        return (
            f"host 1-min load reached {worst:.1f} with {self.threads} benchmark threads: other "
            "work competed for the CPU, so the numbers are not valid (rerun on a quiet host)"
        )

    def record(self) -> dict[str, Any]:
        return {"threads": self.threads, "load_1min_samples": [round(v, 2) for v in self.samples]}

    @contextmanager
    def sampling(self, every_s: float) -> Iterator[None]:
        """Sample every `every_s` seconds while the block runs: other work that starts during
        a long case is caught, not only work still running between cases."""
        done = threading.Event()

        def sample() -> None:
            while not done.wait(every_s):
                self.sample()

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield
        finally:
            done.set()
            sampler.join()
