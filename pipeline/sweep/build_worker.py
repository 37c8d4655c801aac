"""One variant's build in a process of its own, so that its peak memory and time are its own.

The parent calls `run_build(job)`: it starts

    python -m ingot.pipeline.sweep.build_worker JOB.json RESULT.json

waits for it and turns RESULT.json into a `BuildOutcome`. The peak memory is the child's own
report, the largest of its stages' peaks (`StageRun.peak_rss_bytes`, the kernel's high-water
mark per stage): not `os.wait4`'s ru_maxrss, which on Linux keeps the high-water mark of the
memory the child was forked from, so a sweep process holding 500 MiB would read 500 MiB for
every build below that. ru_maxrss stands in only for a child that died without a result (an
upper bound then). The child runs
`ingot.pipeline.build.build` against the shared stage cache and writes the artifact's path or
the reason it failed: an IngotError's one line as it is, anything else with its type named
(a bug, but still one failed variant, not a failed sweep). A child that dies without a result
(killed, out of memory) is a failed variant too, with its exit status and last stderr line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ingot.common.errors import IngotError

from ..build import build
from ..cache import StageCache
from .executor import BuildJob, BuildOutcome

__all__ = ["main", "run_build"]

_MODULE = "ingot.pipeline.sweep.build_worker"


def run_build(job: BuildJob) -> BuildOutcome:
    """Build `job` in a fresh interpreter and measure it; never raises for a failed build."""
    with tempfile.TemporaryDirectory(prefix=f"ingot-build-{job.name}-") as tmp:
        spec, result, log = Path(tmp, "job.json"), Path(tmp, "result.json"), Path(tmp, "log")
        spec.write_text(json.dumps({k: str(v) for k, v in asdict(job).items()}))
        started = time.perf_counter()
        with open(log, "wb") as stderr:
            child = subprocess.Popen(
                [sys.executable, "-m", _MODULE, str(spec), str(result)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
            )
            _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        seconds = time.perf_counter() - started
        peak = usage.ru_maxrss * 1024  # KiB on Linux; includes the parent's RSS at the fork
        if result.exists():
            outcome = json.loads(result.read_text())
            artifact = outcome["artifact"]
            error = outcome["error"]
            peak = outcome["peak_rss_bytes"] or peak
        else:
            artifact, error = None, _died(child.returncode, log)
    return BuildOutcome(job.name, Path(artifact) if artifact else None, seconds, peak, error)


def _died(code: int, log: Path) -> str:
    """The one line for a build process that exited without writing its result."""
    how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
    lines = log.read_text(errors="replace").strip().splitlines()
    return f"build process {how}" + (f": {lines[-1]}" if lines else "")


def build_job(job: dict[str, str]) -> dict[str, Any]:
    """The child's work: {artifact, error, stages} for one job (JOB.json's fields)."""
    try:
        result = build(job["recipe"], job["out"], cache=StageCache(Path(job["cache_root"])))
    except IngotError as e:
        return _failed(_one_line(str(e)))
    except Exception as e:  # a bug, reported as this variant's failure with its type
        return _failed(_one_line(f"{type(e).__name__}: {e}"))
    stages = [{"stage": s.stage, "cached": s.cached} for s in result.stages]
    # Each stage resets the high-water mark (stage_memory.py): the build's peak is the largest.
    peaks = [s.peak_rss_bytes for s in result.stages if s.peak_rss_bytes is not None]
    artifact = str(result.artifact.resolve())
    return {
        "artifact": artifact,
        "error": None,
        "stages": stages,
        "peak_rss_bytes": max(peaks, default=None),
    }


def _failed(error: str) -> dict[str, Any]:
    return {"artifact": None, "error": error, "stages": [], "peak_rss_bytes": None}


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else "failed (no message)"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: python -m {_MODULE} JOB.json RESULT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    outcome = build_job(job)
    Path(argv[1]).write_text(json.dumps(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
