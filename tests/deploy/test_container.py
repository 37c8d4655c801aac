"""deploy/Containerfile without a container builder (none works in this sandbox: no registry
for the base image, and crun may not set rlimits; README, Deploy): its RUN lines, as
written, in a fresh virtual environment standing for the image's Python, on a copy of the
build context its .containerignore leaves. Then what the image runs: `ingot plan --serve` and
`ingot serve` with the plan's options on the demo, /health, one completion and a drain on
SIGTERM, all from the runtime-only install."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "Containerfile"
IMAGE_ONLY = ("useradd ",)  # the image's user: nothing to install


def _instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", "", CONTAINERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(" ", 1)) for line in lines if line and not line.startswith("#")]


def _build_context(dest: Path) -> None:
    patterns = [
        line.strip().removeprefix("**/")
        for line in (REPO / ".containerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(*patterns), symlinks=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_containerfile_runs_ingot_as_its_entrypoint():
    every = _instructions()
    last_from = max(i for i, (instruction, _) in enumerate(every) if instruction == "FROM")
    instructions = dict(every[last_from:])  # the final stage's (one of each here)
    assert instructions["ENTRYPOINT"] == '["ingot"]'
    assert instructions["USER"] == "10001"
    assert instructions["ENV"] == "INGOT_STORE_DIR=/var/lib/ingot/store"


@pytest.mark.slow
def test_the_containerfiles_commands_install_a_runtime_that_plans_and_serves(
    tmp_path, demo_artifact
):
    _build_context(tmp_path / "src")
    assert not (tmp_path / "src" / ".venv").exists() and (tmp_path / "src" / "runtime").is_dir()
    subprocess.run([sys.executable, "-m", "venv", tmp_path / "image"], check=True)
    bin_dir = tmp_path / "image" / "bin"
    shutil.copy(REPO / "deploy" / "install-runtime.sh", bin_dir / "install-runtime.sh")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    args = {"INGOT_EXTRAS": None}
    for instruction, argument in _instructions():
        if instruction == "ARG":
            name, _, default = argument.partition("=")
            args[name] = default
        if instruction != "RUN" or argument.startswith(IMAGE_ONLY):
            continue
        command = argument.replace("/src", str(tmp_path / "src"))
        command = command.replace("/wheel", str(tmp_path / "wheel"))
        run_env = {**env, **{k: v for k, v in args.items() if v is not None}}
        subprocess.run(["sh", "-c", command], check=True, env=run_env, cwd=tmp_path)
    assert args["INGOT_EXTRAS"] == "openvino" and not (tmp_path / "wheel").exists()
    ingot = str(bin_dir / "ingot")
    plan = json.loads(
        subprocess.run(
            [ingot, "plan", demo_artifact, "--serve", "--memory", "512MiB", "--json"],
            check=True, capture_output=True, text=True, env=env, cwd=tmp_path,
        ).stdout
    )  # fmt: skip
    _serve_and_drain(ingot, demo_artifact, plan["serve_args"], env, tmp_path)


def _serve_and_drain(ingot: str, artifact: Path, serve_args: list[str], env, cwd) -> None:
    port = _free_port()
    command = [ingot, "serve", str(artifact), "--port", str(port), *serve_args]
    server = subprocess.Popen(command, env=env, cwd=cwd, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the server did not become healthy"
            time.sleep(0.5)
        body = json.dumps({"prompt": "The os module", "max_tokens": 4}).encode()
        request = urllib.request.Request(
            f"{base}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.load(response)["usage"]["completion_tokens"] == 4
        server.send_signal(signal.SIGTERM)  # what the kubelet sends after preStop
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    log = server.stderr.read()
    assert "KV cache: " in log and "server stopped" in log
