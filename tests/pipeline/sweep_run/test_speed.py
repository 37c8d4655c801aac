"""measure_speed: every artifact timed in fresh interpreters, rounds interleaved, medians over
rounds, the host's load recorded, and a loaded host refused (when asked) or reported."""

from __future__ import annotations

import os

import pytest

from ingot.pipeline.sweep import speed
from ingot.pipeline.sweep.speed import SpeedError, SpeedResult, measure_speed, rotated

SMALL = dict(prompt_tokens=12, output_tokens=6, concurrency=3)


@pytest.fixture(autouse=True)
def no_settling(monkeypatch):
    monkeypatch.setattr(speed, "SETTLE_MAX_S", 0.0)


def _loaded(monkeypatch, value: float = 50.0) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (value, value, value))


def test_one_tiny_artifact_gives_positive_speeds_and_the_load_record(sweep_artifact):
    report = measure_speed({"g32": sweep_artifact}, rounds=2, **SMALL)
    result = report.results["g32"]
    assert result.tok_s_batch1 > 0 and result.tok_s_batch32 > 0 and result.ttft_ms_p50 > 0
    load = report.load
    assert load["threads"] == len(os.sched_getaffinity(0))
    assert load["before"] == load["samples"][0] and load["after"] == load["samples"][-1]
    assert len(load["samples"]) >= 2 + 2  # before, after each run, the verdict's
    assert load["quiet"] == (load["loaded"] is None)


def test_rounds_are_interleaved_rotated_and_reduced_to_medians(monkeypatch, tmp_path):
    calls = []
    speeds = iter([1.0, 10.0, 3.0, 30.0, 2.0, 20.0])

    def fake_worker(name, spec):
        calls.append(name)
        value = next(speeds)
        return {"tok_s_batch1": value, "tok_s_burst": 2 * value, "ttft_ms_p50": 1 / value}

    monkeypatch.setattr(speed, "_run_worker", fake_worker)
    monkeypatch.setattr(speed, "_check_lengths", lambda *args: None)
    report = measure_speed({"a": tmp_path, "b": tmp_path}, rounds=3, **SMALL)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert report.results["a"] == SpeedResult(2.0, 4.0, 1 / 2.0)  # a ran 1.0, 30.0, 2.0
    assert rotated(["x", "y", "z"], 4) == ["y", "z", "x"]


def test_a_loaded_host_is_refused_in_one_line_before_any_run(monkeypatch, sweep_artifact):
    _loaded(monkeypatch)
    monkeypatch.setattr(speed, "_run_worker", lambda *a: pytest.fail("timed on a loaded host"))
    with pytest.raises(SpeedError, match="refused before it started: host 1-min load") as error:
        measure_speed({"g32": sweep_artifact}, refuse_loaded=True, **SMALL)
    assert "\n" not in str(error.value)


def test_a_loaded_host_is_reported_not_hidden(monkeypatch, sweep_artifact):
    _loaded(monkeypatch)
    report = measure_speed({"g32": sweep_artifact}, rounds=1, **SMALL)
    assert report.load["quiet"] is False and "50.0" in report.load["loaded"]
    assert report.results["g32"].tok_s_batch1 > 0


def test_lengths_beyond_the_artifact_are_one_line(sweep_artifact):
    with pytest.raises(SpeedError, match="exceeds the artifact's max_seq_len 128"):
        measure_speed({"g32": sweep_artifact}, prompt_tokens=120, output_tokens=16)
