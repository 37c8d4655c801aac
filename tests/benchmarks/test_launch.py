"""harness.launch: a benchmark module run in a fresh process under any interpreter (a peer's
virtualenv, benchmarks/.venvs/<peer>/bin/python), its spec and result as JSON."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from benchmarks.harness.launch import WorkerFailed, module_command, module_env, run_worker
from benchmarks.harness.paths import REPO, VENVS, peer_python

TOY_WORKER = """
import sys, time
from benchmarks.harness.launch import worker_main

def run_spec(spec):
    if spec.get("fail"):
        raise SystemExit("the toy engine crashed")
    time.sleep(spec.get("sleep_s", 0))
    return {"ok": True, "doubled": 2 * spec["value"], "executable": sys.executable}

if __name__ == "__main__":
    worker_main(run_spec)
"""


@pytest.fixture
def toy_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A worker module importable from the environment's PYTHONPATH, as a benchmark's is."""
    (tmp_path / "toy_worker.py").write_text(TOY_WORKER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "toy_worker"


def test_a_peer_runs_from_its_own_virtualenv() -> None:
    assert peer_python("vllm") == VENVS / "vllm" / "bin" / "python"
    assert VENVS == REPO / "benchmarks" / ".venvs"
    python = peer_python("onnxruntime-genai")
    assert module_command("benchmarks.decode.engines", python) == [
        str(python),
        "-m",
        "benchmarks.decode.engines",
    ]


def test_the_repository_comes_first_on_the_workers_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["elsewhere", str(REPO)]))
    env = module_env({"VLLM_NO_USAGE_STATS": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "elsewhere"]
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["PATH"] == os.environ["PATH"]


def test_a_worker_gets_its_spec_and_returns_its_result(toy_worker: str, tmp_path: Path) -> None:
    result = run_worker(toy_worker, {"value": 21}, tmp_path, timeout_s=60)
    assert result["doubled"] == 42 and result["executable"] == sys.executable


def test_a_worker_runs_under_the_interpreter_it_is_given(toy_worker: str, tmp_path: Path) -> None:
    # A stand-in for benchmarks/.venvs/<peer>/bin/python: another path to an interpreter,
    # with no ingot installed beside it, still finds the benchmarks' modules.
    python = tmp_path / "peer" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    result = run_worker(toy_worker, {"value": 1}, tmp_path, timeout_s=60, python=python)
    assert result["executable"] == str(python)


def test_a_crashed_worker_is_a_failure_with_its_last_words(toy_worker: str, tmp_path: Path) -> None:
    with pytest.raises(WorkerFailed, match="exited 1: the toy engine crashed"):
        run_worker(toy_worker, {"fail": True}, tmp_path, timeout_s=60)


def test_a_hung_worker_is_a_failure(toy_worker: str, tmp_path: Path) -> None:
    with pytest.raises(WorkerFailed, match="timed out"):
        run_worker(toy_worker, {"value": 1, "sleep_s": 30}, tmp_path, timeout_s=0.5)
