"""harness.report: the JSON + markdown writer, the REFUSED line, the reproducing command, and
--report-only writing the same markdown again."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.paths import REPO
from benchmarks.harness.report import (
    add_report_only,
    publish,
    render,
    reproduce_command,
    rerender,
    write_report,
)


def _markdown(report: dict[str, Any]) -> str:
    rows = "\n".join(f"| {name} | {value} |" for name, value in report["rows"].items())
    return f"# Toy\n\n| case | value |\n|---|---|\n{rows}\nshape {report['shape'][0]}\n"


def _report(**extra: Any) -> dict[str, Any]:
    # Keys in an order a sort would change; a tuple, which JSON holds as a list.
    rows = {"zeta": 1, "alpha": 2}
    return {"rows": rows, "shape": (3, 4), "model": str(REPO / "benchmarks" / "x"), **extra}


def test_a_report_is_written_portable_in_the_order_built(tmp_path: Path) -> None:
    json_path, md_path = write_report(_report(), tmp_path, "toy", _markdown)
    assert (json_path, md_path) == (tmp_path / "toy.json", tmp_path / "toy.md")
    written = json.loads(json_path.read_text())
    assert list(written["rows"]) == ["zeta", "alpha"]
    assert written["model"] == "benchmarks/x"  # no path of this machine
    assert written["shape"] == [3, 4] and "command" not in written  # not run with -m here
    assert md_path.read_text() == _markdown(written)


def test_a_peer_root_is_rewritten_by_its_name(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    report = _report(trace=f'File "{venv}/lib/x.py", line 1')
    json_path, _ = write_report(report, tmp_path, "toy", _markdown, {venv: "<peer-venv>"})
    assert json.loads(json_path.read_text())["trace"] == 'File "<peer-venv>/lib/x.py", line 1'


def test_publish_prints_the_markdown_and_exits_0_for_a_quiet_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert publish(_report(refused=None), tmp_path, "toy", _markdown) == 0
    out = capsys.readouterr()
    assert out.out.startswith("# Toy") and "REFUSED" not in out.out + out.err


def test_a_refused_run_is_marked_refused_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "host 1-min load reached 5.0 with 2 benchmark threads"
    assert publish(_report(refused=reason), tmp_path, "toy", _markdown) == 1
    assert (tmp_path / "toy.md").read_text().startswith(f"**REFUSED: {reason}**\n\n# Toy")
    assert f"REFUSED: {reason}" in capsys.readouterr().err


def test_the_markdown_ends_with_the_command_that_reproduces_it() -> None:
    report = {"rows": {"a": 1}, "shape": [1], "command": ".venv/bin/python -m benchmarks.x.y"}
    assert render(report, _markdown).endswith(
        "shape 1\n\nReproduce: `.venv/bin/python -m benchmarks.x.y`\n"
    )


def test_the_command_is_the_benchmark_module_run_with_its_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert reproduce_command() is None  # pytest is the main module here
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name="benchmarks.decode.toy")  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "executable", str(REPO / ".venv" / "bin" / "python"))
    out = REPO / "benchmarks" / "results"
    command = reproduce_command(["--runs", "3", "--out-dir", str(out), "--name", "a b"])
    assert command == (
        ".venv/bin/python -m benchmarks.decode.toy --runs 3 --out-dir benchmarks/results "
        "--name 'a b'"
    )


def test_report_only_writes_the_same_markdown_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _report(refused="loaded", command=".venv/bin/python -m benchmarks.x.y --runs 3")
    _, md_path = write_report(report, tmp_path, "toy", _markdown)
    first = md_path.read_text()
    md_path.write_text("stale wording\n")
    assert rerender(tmp_path, "toy", _markdown) == 0
    assert md_path.read_text() == first
    assert first in capsys.readouterr().out


def test_every_benchmark_takes_report_only() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_report_only(parser)
    assert parser.parse_args(["--report-only"]).report_only
    assert not parser.parse_args([]).report_only
