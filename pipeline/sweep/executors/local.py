"""`--executor local`: the variants' builds on this host, as many at once as fit in memory.

The width is how many of the largest planned build (`ingot plan`'s peak host memory) fit in
the memory available now (pipeline/resources.py's reading), capped by the `jobs` option
(default: the usable CPU count); at least one. Each build is its own process
(build_worker.py); a thread per running build waits for it. Builds sharing the stage cache
compute each stage once (the cache's per-key lock, pipeline/cache.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ...plan import format_bytes
from ...resources import host_memory_available
from ..build_worker import run_build
from ..executor import BuildJob, BuildOutcome, ExecutorOptionError, planned_peak_bytes

__all__ = ["LocalExecutor", "PLUGIN", "parallel_builds"]

log = logging.getLogger(__name__)


def parallel_builds(jobs: Sequence[BuildJob], limit: int | None = None) -> int:
    """How many of `jobs` to build at once: the largest planned peak into the available
    memory, at most `limit` (default: the usable CPU count), at least 1."""
    cap = limit if limit is not None else len(os.sched_getaffinity(0))
    peaks = [p for p in map(planned_peak_bytes, {job.recipe for job in jobs}) if p]
    available, _ = host_memory_available()
    if peaks and available is not None:
        fit = available // max(peaks)
        log.info(
            "%d builds fit in %s available (%s each at most)",
            fit,
            format_bytes(available),
            format_bytes(max(peaks)),
        )
        cap = min(cap, fit)
    return max(1, min(cap, len(jobs)))


class LocalExecutor:
    def __init__(self, jobs: int | None = None) -> None:
        if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
            raise ExecutorOptionError(f"executor local: jobs must be an integer >= 1, not {jobs!r}")
        self.jobs = jobs

    def run(self, jobs: Sequence[BuildJob]) -> list[BuildOutcome]:
        if not jobs:
            return []
        with ThreadPoolExecutor(parallel_builds(jobs, self.jobs)) as pool:
            return list(pool.map(run_build, jobs))


PLUGIN = LocalExecutor
