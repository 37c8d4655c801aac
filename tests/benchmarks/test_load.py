"""harness.load: the quiet-host rule (sample, record, refuse) and its finer tools, on a host
load the test sets."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from benchmarks.harness import load
from benchmarks.harness.load import LoadWatch, OtherWork, SettledWatch, load_line, wait_idle


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The 1-min load averages the host reports next, in order (the last one repeats)."""
    values: list[float] = []

    def getloadavg() -> tuple[float, float, float]:
        value = values.pop(0) if len(values) > 1 else values[0]
        return value, value, value

    monkeypatch.setattr(os, "getloadavg", getloadavg)
    return values


def test_a_quiet_run_is_not_refused_one_more_runnable_process_allowed(loads: list[float]) -> None:
    loads[:] = [0.5, 2.9, 3.0]
    watch = LoadWatch(threads=2)
    watch.sample()
    assert watch.refusal() is None  # max 3.0 = threads + 1
    assert watch.record() == {"threads": 2, "load_1min_samples": [0.5, 2.9, 3.0]}


def test_a_run_whose_load_exceeded_its_threads_is_refused_by_its_worst_sample(
    loads: list[float],
) -> None:
    loads[:] = [0.4, 3.4, 1.0]
    watch = LoadWatch(threads=2)
    watch.sample()
    reason = watch.refusal()
    assert reason is not None and "reached 3.4 with 2 benchmark threads" in reason
    assert load_line(watch.record(), reason).endswith(f": REFUSED ({reason}).")


def test_an_untimed_benchmark_records_the_load_but_is_never_refused(loads: list[float]) -> None:
    loads[:] = [7.0]
    watch = LoadWatch(threads=2, timed=False)
    assert watch.refusal() is None
    assert watch.record()["load_1min_samples"] == [7.0, 7.0]


def test_the_load_line_reports_the_worst_sample(loads: list[float]) -> None:
    loads[:] = [0.2, 1.26]
    watch = LoadWatch(threads=2)
    watch.sample()
    assert load_line(watch.record(), None) == (
        "Host load (1-min load average, sampled between cases): max 1.3, 2 samples, "
        "2 benchmark threads: quiet enough."
    )


def test_sampling_samples_while_a_long_case_runs(loads: list[float]) -> None:
    loads[:] = [0.1]
    watch = LoadWatch(threads=1)
    with watch.sampling(every_s=0.001):
        while len(watch.samples) < 4:
            pass
    assert len(watch.samples) >= 4


def test_a_settled_run_records_the_load_before_and_after_it(loads: list[float]) -> None:
    loads[:] = [0.5, 1.0, 1.5, 2.5]  # the watch's first sample, the wait's check, ...
    settled = SettledWatch(LoadWatch(threads=2), settle_s=0, max_wait_s=0)
    result = settled.around(lambda: {"ok": True})
    assert result["ok"] and result["loadavg_1min_before"] == 1.5
    assert result["loadavg_1min_after"] == 2.5 and result["settled_s"] >= 0
    assert settled.finish() is None


def test_a_measurement_is_repeated_while_others_took_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (wall, host busy, own) seconds around each attempt: others used 1.5 cores, then 0.1.
    snapshots: Iterator[tuple[float, float, float]] = iter(
        [(0.0, 0.0, 0.0), (1.0, 2.0, 0.5), (1.0, 2.0, 0.5), (2.0, 3.0, 1.4)]
    )
    quiet = OtherWork(limit_cores=0.25, max_attempts=4)
    monkeypatch.setattr(quiet, "_snapshot", lambda: next(snapshots))
    attempts = []
    assert quiet.call(lambda: attempts.append(1) or len(attempts)) == 2
    summary = quiet.summary()
    assert summary["measurements"] == 1 and summary["repeated"] == 1
    assert summary["extra_attempts"] == 1 and summary["still_disturbed"] == 0
    assert summary["max_others_cores_kept"] == pytest.approx(0.1)


def test_a_measurement_still_disturbed_after_every_attempt_is_kept_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    busy = iter(range(100))
    quiet = OtherWork(limit_cores=0.25, max_attempts=2)
    monkeypatch.setattr(quiet, "_snapshot", lambda: (float(next(busy)), 10.0 * next(busy), 0.0))
    assert quiet.call(lambda: "kept") == "kept"
    assert quiet.summary()["still_disturbed"] == 1


def test_wait_idle_returns_at_once_on_an_idle_host(loads: list[float]) -> None:
    loads[:] = [0.3]
    logged: list[str] = []
    assert wait_idle(60, logged.append) < 1 and not logged


def test_the_module_reads_the_load_from_os(loads: list[float]) -> None:
    loads[:] = [1.25]
    assert load.LoadWatch(threads=1).samples == [1.25]
