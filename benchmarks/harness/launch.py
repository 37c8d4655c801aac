"""Running a benchmark's module in a fresh process: under this interpreter, or a peer's own
virtualenv (`benchmarks/.venvs/<peer>/bin/python`, paths.peer_python).

A case runs as a worker: its spec goes to the module as JSON and its result comes back as
JSON (`run_worker`; the module ends with `worker_main(run_spec)`), so one engine's crash, hang
or leftover memory never touches the next one's numbers. Every module runs as
`python -m benchmarks.<group>.<module>` with the repository on PYTHONPATH (`module_env`), so a
peer's interpreter, which has no ingot installed, finds the benchmark's own modules too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import REPO

__all__ = ["WorkerFailed", "module_command", "module_env", "run_worker", "worker_main"]


class WorkerFailed(RuntimeError):
    """The worker timed out, exited non-zero or wrote no result."""


def module_command(module: str, python: str | Path | None = None) -> list[str]:
    """`python -m module`: this interpreter unless given (a peer's runs that peer's engines)."""
    return [str(python or sys.executable), "-m", module]


def module_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH (a module of
    benchmarks/ imports its siblings by their full name), plus `extra`."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), **(extra or {})}


def run_worker(
    module: str,
    spec: dict[str, Any],
    tmp: Path,
    timeout_s: float,
    python: str | Path | None = None,
) -> dict[str, Any]:
    """`python -m module SPEC.json RESULT.json` in `tmp`; the result it wrote. `python` is this
    interpreter unless given (a peer's virtualenv runs that peer's engines)."""
    spec_file, result_file = tmp / "spec.json", tmp / "result.json"
    spec_file.write_text(json.dumps(spec))
    result_file.unlink(missing_ok=True)
    command = [*module_command(module, python), str(spec_file), str(result_file)]
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=module_env()
        )
    except subprocess.TimeoutExpired as e:  # subprocess.run kills the worker it started
        raise WorkerFailed(f"timed out after {timeout_s} s") from e
    if proc.returncode != 0 or not result_file.exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise WorkerFailed(f"worker exited {proc.returncode}: {tail}")
    return json.loads(result_file.read_text())


def worker_main(run_spec: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """A worker module's `__main__`: the spec from argv[1], `run_spec`'s result to argv[2]."""
    spec_file, result_file = sys.argv[1:3]
    outcome = run_spec(json.loads(Path(spec_file).read_text()))
    Path(result_file).write_text(json.dumps(outcome))
