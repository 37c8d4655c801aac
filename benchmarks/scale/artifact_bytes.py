"""Artifact bytes of real-size builds, by file role (issue 28): what a pod pulls for the
onnxruntime engine (its engine files and the common files) and what the whole artifact holds,
against onnxruntime-genai's model folder for the same shape.

The artifacts are built beforehand (RTN int4 g32 symmetric on every linear, lm_head included;
benchmarks/scale/models.py's random checkpoints) and named on the command line; the peer's
bytes are those its builder wrote for the same checkpoints (int4, CPU: blocks of 32),
recorded by benchmarks/scale/scale.py in scale.json, where it finished.

    .venv/bin/python -m benchmarks.scale.artifact_bytes --artifact llama-3.2-1b=DIR ...
        [--keep-rows JSON] [--peer-report benchmarks/results/scale.json]
        [--out-dir benchmarks/results] [--report-only]

Reports: benchmarks/results/artifact_bytes.json and artifact_bytes.md. Nothing is timed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS
from benchmarks.harness.report import add_report_only, publish, rerender
from ingot.artifacts import read_manifest

STEM = "artifact_bytes"
GIB = 2**30
TARGET = 1.05  # issue 28: at most 1.05x onnxruntime-genai's output
COMMON = {"config.json", "tokenizer.json", "chat_template.jinja", "ingot.lock", "manifest.json"}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    peer = _peer_bytes(args.peer_report)
    rows = json.loads(args.keep_rows.read_text())["rows"] if args.keep_rows else []
    for spec in args.artifact:
        label, _, path = spec.partition("=")
        manifest = json.loads((Path(path) / "manifest.json").read_text())
        shape = label.split()[0]  # "llama-3.2-1b (note)": the peer's row is the shape's
        rows.append(
            {
                "shape": label,
                "roles": role_bytes(Path(path)),
                "quantize": manifest["recipe"]["quantize"],
                "onnxruntime_genai_bytes": peer.get(shape),
            }
        )
    report = {"rows": rows, "peer_report": str(args.peer_report), "machine": machine_info()}
    return publish(report, args.out_dir, STEM, _markdown)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--artifact",
        action="append",
        default=[],
        metavar="SHAPE=DIR",
        help="an artifact of a benchmarks/scale shape; 'SHAPE (note)=DIR' labels the row",
    )
    parser.add_argument(
        "--keep-rows",
        type=Path,
        metavar="JSON",
        help="carry the rows of an earlier report over (artifacts measured, then deleted)",
    )
    parser.add_argument("--peer-report", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


def role_bytes(artifact: Path) -> dict[str, int]:
    """{role: bytes} of the artifact's files, by the roles its manifest gives them (manifest.json
    and an unlisted model.sig count as common)."""
    sizes: dict[str, int] = {}
    for entry in read_manifest(artifact).files:
        sizes[entry.role] = sizes.get(entry.role, 0) + entry.size
    unlisted = [artifact / "manifest.json", artifact / "model.sig"]
    sizes["common"] = sizes.get("common", 0) + sum(f.stat().st_size for f in unlisted if f.exists())
    return sizes


def _peer_bytes(report: Path) -> dict[str, int]:
    """{shape: bytes} of onnxruntime-genai's finished builds in a scale.py report."""
    if not report.is_file():
        return {}
    builds = json.loads(report.read_text()).get("builds", [])
    return {
        b["shape"]: b["artifact_bytes"]
        for b in builds
        if b.get("tool") == "onnxruntime-genai" and b.get("artifact_bytes")
    }


def _markdown(r: dict[str, Any]) -> str:
    lines = [
        "# Artifact bytes by role (RTN int4 g32 symmetric, lm_head included)",
        "",
        "A pod running the onnxruntime engine pulls `engine:onnxruntime-cpu` + `common`; the "
        f"peer column is onnxruntime-genai's folder for the same checkpoint ({r['peer_report']}"
        f"). Target: the pod's pull <= {TARGET}x the peer's.",
        "",
        "| shape | engine GiB | portable GiB | common MiB | other GiB | total GiB "
        "| onnxruntime-genai GiB | pod pull / peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        roles = row["roles"]
        engine = sum(v for k, v in roles.items() if k.startswith("engine:"))
        portable, common = roles.get("portable", 0), roles.get("common", 0)
        other = sum(roles.values()) - engine - portable - common
        peer = row["onnxruntime_genai_bytes"]
        ratio = f"{(engine + common) / peer:.2f}x" if peer else "—"
        peer_text = f"{peer / GIB:.2f}" if peer else "— (builder did not finish)"
        lines.append(
            f"| {row['shape']} | {engine / GIB:.2f} | {portable / GIB:.2f} "
            f"| {common / 2**20:.1f} | {other / GIB:.2f} | {sum(roles.values()) / GIB:.2f} "
            f"| {peer_text} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
