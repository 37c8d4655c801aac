"""`--executor ray` against a real local Ray cluster started here (`ray start --head --block`,
stopped by terminating that process): two variants built as Ray tasks into a shared cache give
the local executor's artifacts (the same manifest digests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ingot.artifacts import manifest_digest
from ingot.pipeline.sweep.executor import BuildJob, make_executor

pytest.importorskip("ray", reason="ray is the sweep-ray extra's (and the dev extra's)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, head: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if head.poll() is not None:
            pytest.fail(f"ray start exited {head.returncode}: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"the Ray head did not listen on {port} within 120 s: {log.read_text()[-2000:]}")


@pytest.fixture
def ray_cluster(tmp_path):
    port, log = _free_port(), tmp_path / "ray-head.log"
    command = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        f"--port={port}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--block",  # this process owns the cluster: terminating it stops the cluster's processes
    ]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "w") as out:
        head = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for_port(port, head, log)
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()
        head.wait(90)


def test_ray_tasks_build_the_local_executors_artifacts(
    tmp_path, sweep_recipes, local_outcomes, ray_cluster
):
    built = [o for o in local_outcomes if o.artifact is not None]  # g32, g64
    jobs = [
        BuildJob(o.name, sweep_recipes[o.name], tmp_path / o.name, tmp_path / "c") for o in built
    ]
    outcomes = make_executor("ray", address=ray_cluster).run(jobs)
    assert [o.name for o in outcomes] == [o.name for o in built]
    for ray_built, local in zip(outcomes, built, strict=True):
        assert ray_built.error is None and ray_built.artifact == (tmp_path / local.name)
        assert manifest_digest(ray_built.artifact) == manifest_digest(local.artifact)
        assert ray_built.peak_build_bytes > 20 << 20 and ray_built.build_s > 0
