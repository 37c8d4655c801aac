"""The report writer: a benchmark's JSON (every raw number) and its short markdown (the tables)
as <out_dir>/<stem>.json and <stem>.md, benchmarks/results/ by default.

A report is committed, so it names no path of the machine that wrote it (paths.portable). The
writer adds what every report carries: the command that reproduces it (`command`, when the
benchmark ran as `python -m benchmarks...`), a REFUSED line at the top of the markdown when the
run broke the quiet-host rule (`report["refused"]`, load.py), and the exit status (1 when
refused). The benchmark supplies the rest: `machine` (machine.machine_info()), its load record
(LoadWatch.record()) and a `markdown(report)` that renders only the JSON's contents, so that
`--report-only` (`rerender`) writes the same markdown again from the JSON alone.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import portable, portable_report

__all__ = [
    "add_report_only",
    "publish",
    "render",
    "reproduce_command",
    "rerender",
    "write_report",
]

Markdown = Callable[[dict[str, Any]], str]


def reproduce_command(argv: list[str] | None = None) -> str | None:
    """The command line that ran this benchmark (`sys.argv` unless `argv`), portable; None
    unless the main module is a benchmark run with -m."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None or not spec.name.startswith("benchmarks."):
        return None
    args = sys.argv[1:] if argv is None else argv
    return portable(shlex.join([sys.executable, "-m", spec.name, *args]))


def render(report: dict[str, Any], markdown: Markdown) -> str:
    """The report's markdown: `markdown(report)`, under a REFUSED line where the run was
    refused, and over the command that reproduces it where the report has one."""
    text = markdown(report)
    if report.get("refused"):
        text = f"**REFUSED: {report['refused']}**\n\n{text}"
    if report.get("command"):
        text = text if text.endswith("\n") else text + "\n"
        text += f"\nReproduce: `{report['command']}`\n"
    return text


def write_report(
    report: dict[str, Any],
    out_dir: Path,
    stem: str,
    markdown: Markdown,
    roots: Mapping[str | Path, str] | None = None,
) -> tuple[Path, Path]:
    """Write `report`, made portable (`roots`: more path -> name rewrites, e.g. a peer's
    virtualenv), as out_dir/<stem>.json, keys in the order the benchmark built them, and its
    rendering (`render`) as out_dir/<stem>.md, rendered from what the JSON holds (tuples as
    lists, keys as strings), so that `rerender` writes the same markdown again."""
    report = json.loads(json.dumps(portable_report(report, roots)))
    command = reproduce_command()
    if command is not None:
        report.setdefault("command", command)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(render(report, markdown))
    return json_path, md_path


def publish(
    report: dict[str, Any],
    out_dir: Path,
    stem: str,
    markdown: Markdown,
    roots: Mapping[str | Path, str] | None = None,
) -> int:
    """Write the report files (`write_report`) and print the markdown; the exit status: 1,
    said on stderr, if the run was refused (`report["refused"]`), else 0."""
    json_path, md_path = write_report(report, out_dir, stem, markdown, roots)
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    if report.get("refused"):
        print(f"REFUSED: {report['refused']}", file=sys.stderr)
        return 1
    return 0


def rerender(out_dir: Path, stem: str, markdown: Markdown) -> int:
    """`--report-only`: out_dir/<stem>.md written again from out_dir/<stem>.json (after a
    change to the markdown's wording, say), nothing measured."""
    report = json.loads((out_dir / f"{stem}.json").read_text())
    md_path = out_dir / f"{stem}.md"
    md_path.write_text(render(report, markdown))
    print(md_path.read_text())
    return 0


def add_report_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write the markdown again from the report's JSON in the output folder; measure "
        "nothing",
    )
