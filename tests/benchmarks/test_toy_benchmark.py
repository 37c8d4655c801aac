"""The harness as a new benchmark uses it: the toy benchmark below is what a new module in a
group (benchmarks/<group>/<name>.py, run as `python -m benchmarks.<group>.<name>`) holds, and
nothing else is added or registered anywhere. It interleaves two cases in rounds, pairs their
ratio, keeps the quiet-host rule and publishes its report; the tests run it end to end."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.load import LoadWatch, load_line
from benchmarks.harness.machine import machine_info
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.harness.rounds import interleave, paired, ranged

# -- the toy benchmark: one module -------------------------------------------------------------

STEM = "toy"
CASES = ("sorted", "sum")
WORK = list(range(20_000, 0, -1))


def toy_main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, toy_markdown)
    watch = LoadWatch(threads=1)

    def run(case: str, _: int) -> float:
        started = time.perf_counter()
        sorted(WORK) if case == "sorted" else sum(WORK)
        return time.perf_counter() - started

    seconds = interleave(CASES, args.rounds, run, after_case=watch.sample)
    ratio = paired(seconds["sorted"], seconds["sum"])
    refused = watch.refusal()  # its last sample goes into the record below
    report = {
        "benchmark": STEM,
        "machine": machine_info(),
        "rounds_s": seconds,
        "ratio": {"median": ratio.median, "rounds": ratio.rounds},
        "load": watch.record(),
        "refused": refused,
    }
    return publish(report, args.out_dir, STEM, toy_markdown)


def toy_markdown(report: dict[str, Any]) -> str:
    r = report["ratio"]
    return "\n".join(
        [
            "# Toy: sorted against sum",
            "",
            f"sorted / sum: {ranged(r['median'], r['rounds'], 'x')}",
            "",
            load_line(report["load"], report["refused"]),
            "",
        ]
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Toy: sorted against sum.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, required=True)
    add_report_only(parser)
    return parser.parse_args(argv)


# -- the tests ---------------------------------------------------------------------------------


@pytest.fixture
def host_load(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    value = [0.5]
    monkeypatch.setattr(os, "getloadavg", lambda: (value[0],) * 3)
    return value


def test_the_toy_benchmark_publishes_a_report_and_renders_it_again(
    tmp_path: Path, host_load: list[float]
) -> None:
    assert toy_main(["--rounds", "3", "--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "toy.json").read_text())
    assert len(report["rounds_s"]["sorted"]) == len(report["ratio"]["rounds"]) == 3
    assert report["refused"] is None and len(report["load"]["load_1min_samples"]) == 8
    md = (tmp_path / "toy.md").read_text()
    assert md.startswith("# Toy: sorted against sum") and "quiet enough" in md
    assert toy_main(["--report-only", "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "toy.md").read_text() == md


def test_the_toy_benchmark_is_refused_on_a_loaded_host(
    tmp_path: Path, host_load: list[float]
) -> None:
    host_load[0] = 4.0
    assert toy_main(["--rounds", "1", "--out-dir", str(tmp_path)]) == 1
    assert (tmp_path / "toy.md").read_text().startswith("**REFUSED: host 1-min load reached 4.0")
