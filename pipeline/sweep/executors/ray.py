"""`--executor ray`: each variant's build a Ray task on an existing cluster.

The task runs the same build worker as the local executor (build_worker.run_build: a
subprocess, so the peak memory is the build's own) on whichever node Ray picks, with `ingot
plan`'s peak memory as the task's `memory` resource: Ray's scheduler, not ours, decides how
many run at once on each node. The stage cache root and the artifacts' directories must be
paths every node sees (a shared filesystem); the cache's per-key lock keeps two nodes from
computing one stage at once. Every node runs the same ingot (the task imports it there).

Options: `address` (a running cluster, e.g. "ray://head:10001" or "head:6379"; default:
`ray.init()`, which joins the cluster this host belongs to or starts a local one) and
`num_cpus` (CPUs reserved per build, default 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..build_worker import run_build
from ..executor import BuildJob, BuildOutcome, ExecutorOptionError, planned_peak_bytes

__all__ = ["PLUGIN", "RayExecutor"]


class RayExecutor:
    def __init__(self, address: str | None = None, num_cpus: float = 1) -> None:
        if not isinstance(num_cpus, int | float) or num_cpus <= 0:
            raise ExecutorOptionError(f"executor ray: num_cpus must be > 0, not {num_cpus!r}")
        self.address, self.num_cpus = address, num_cpus

    def run(self, jobs: Sequence[BuildJob]) -> list[BuildOutcome]:
        # ray is the `sweep-ray` extra's: imported only when this executor runs
        import ray

        if not jobs:
            return []
        started_here = not ray.is_initialized()
        if started_here:
            ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        try:
            task = ray.remote(run_build)
            refs = [task.options(**self._resources(job)).remote(_absolute(job)) for job in jobs]
            return [_outcome(ray, job, ref) for job, ref in zip(jobs, refs, strict=True)]
        finally:
            if started_here:
                ray.shutdown()

    def _resources(self, job: BuildJob) -> dict[str, Any]:
        resources: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": 0}
        peak = planned_peak_bytes(job.recipe)
        if peak:
            resources["memory"] = peak
        return resources


def _absolute(job: BuildJob) -> BuildJob:
    """The job with absolute paths: a Ray worker runs in a directory of its own."""
    paths = {f: Path(getattr(job, f)).resolve() for f in ("recipe", "out", "cache_root")}
    return replace(job, **paths)


def _outcome(ray: Any, job: BuildJob, ref: Any) -> BuildOutcome:
    """The task's outcome; a task Ray could not run (its node died) is a failed variant."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return BuildOutcome(job.name, None, 0.0, 0, f"ray task failed: {reason}")


PLUGIN = RayExecutor
