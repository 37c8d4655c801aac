"""Real-size builds on this machine: random-weight bf16 checkpoints of the Llama-3.2-1B,
Llama-3.2-3B and Llama-3.1-8B shapes (written shard by shard, benchmarks/scale/models.py),
built with RTN W4 g128 and an fp16 KV cache, plus GPTQ (32 x 512 calibration tokens) on the 1B
shape. Per stage: wall time and peak RSS (benchmarks/scale/worker.py), against `ingot plan`'s
estimate; the artifact's size. Side by side on the same checkpoints: onnxruntime-genai's model
builder (int4, CPU), wall time and peak RSS, or the memory ceiling it hits. Then batch-1 decode
of both 8B artifacts. A run whose host load exceeded the thread count is refused.

    .venv/bin/python -m benchmarks.scale.scale [--shapes llama-3.2-1b,llama-3.2-3b,llama-3.1-8b]
        [--ortgenai-python PATH] [--threads N] [--out-dir benchmarks/results] [--report-only]

Reports: benchmarks/results/scale.json and scale.md. Needs ~45 GB of free disk for the 8B
shape (checkpoint, stage cache, artifact); each build's outputs are removed after it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, bench_cache_dir, data_dir, peer_python
from benchmarks.harness.report import add_report_only, publish, rerender, write_report
from benchmarks.scale.models import SHAPES, write_random_checkpoint

WORKER = "benchmarks.scale.worker"
INGOT = str(Path(sys.executable).with_name("ingot"))
BUILD_TIMEOUT_S = 3 * 3600
GIB = 2**30
DECODE_TOKENS = 32
PROMPT_LEN = 32


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.report_only:
        return rerender(args.out_dir, args.report_name, _markdown)
    load = LoadWatch(args.threads)
    report: dict[str, Any] = {"machine": machine_info(), "builds": [], "decode": {}}
    root = bench_cache_dir() / "scale"
    keep: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="ingot-scale-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        for shape in args.shapes:
            checkpoint = write_random_checkpoint(root / shape, shape)
            methods = ["rtn", "gptq"] if shape == args.gptq_shape else ["rtn"]
            for method in [] if args.skip_ingot else methods:
                report["builds"].append(_ingot_build(work, checkpoint, shape, method, args, keep))
                load.sample()
            if args.ortgenai_python is not None and shape in args.ortgenai_shapes:
                report["builds"].append(_ortgenai_build(work, checkpoint, shape, args, keep))
                load.sample()
            if shape in args.drop_checkpoints:  # its disk for the next shape's builds
                shutil.rmtree(checkpoint)
            # partial results survive a later failure
            write_report(report, args.out_dir, args.report_name, _markdown)
        if args.decode_shape in args.shapes:
            report["decode"] = _decode(work, keep, args)
    refusal = load.refusal()
    report["load_1min"] = {"before": load.samples[0], "after": load.samples[-1]}
    report["load"] = load.record()
    if refusal is not None:
        report["refused"] = refusal
    return publish(report, args.out_dir, args.report_name, _markdown)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), type=lambda s: s.split(","))
    parser.add_argument("--gptq-shape", default="llama-3.2-1b", help="'none' skips GPTQ")
    parser.add_argument(
        "--ortgenai-shapes",
        default=",".join(SHAPES),
        type=lambda s: s.split(","),
        help="shapes the peer builds too (default: all)",
    )
    parser.add_argument("--decode-shape", default="llama-3.1-8b")
    parser.add_argument(
        "--drop-checkpoints",
        default=[],
        type=lambda s: s.split(","),
        help="shapes whose checkpoint is removed once built (a disk-limited host; default none)",
    )
    parser.add_argument("--calib-text", type=Path, default=data_dir() / "pydoc-calib.txt")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--ortgenai-python",
        type=lambda s: None if s == "none" else Path(s),
        default=peer_python("onnxruntime-genai"),
        help="onnxruntime-genai's interpreter ('none' skips the peer; default: %(default)s)",
    )
    parser.add_argument("--peer-memory-limit-gib", type=float, default=21.0)
    parser.add_argument("--skip-ingot", action="store_true", help="only the peer's builds")
    parser.add_argument("--report-name", default="scale", help="<name>.json and <name>.md")
    parser.add_argument("--work-dir", type=Path, default=None, help="where builds are written")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


def _recipe(checkpoint: Path, method: str, calib_text: Path, threads: int) -> dict[str, Any]:
    entry = {"method": method, "bits": 4, "group_size": 128, "symmetric": True}
    recipe: dict[str, Any] = {
        "source": {"path": str(checkpoint)},
        "quantize": [entry],
        "kv_cache": {"dtype": "fp16", "block_size": 16},
        "export": {"max_seq_len": 2048},
        "targets": [{"engine": "onnxruntime", "device": "cpu", "intra_op_num_threads": threads}],
        "artifact": {"name": checkpoint.name},
    }
    if method == "gptq":
        recipe["calibration"] = {"dataset": str(calib_text), "samples": 32, "seq_len": 512}
    return recipe


def _ingot_build(work: Path, checkpoint: Path, shape: str, method: str, args, keep) -> dict:
    job = work / f"{shape}-{method}"
    job.mkdir()
    recipe = job / "recipe.yaml"
    recipe.write_text(json.dumps(_recipe(checkpoint, method, args.calib_text, args.threads)))
    row: dict[str, Any] = {"tool": "ingot", "shape": shape, "method": method}
    plan = subprocess.run(
        [INGOT, "plan", "--recipe", str(recipe), "--json"], capture_output=True, text=True
    )
    row["plan"] = json.loads(plan.stdout) if plan.returncode == 0 else {"error": plan.stderr}
    spec = {
        "kind": "build",
        "recipe": str(recipe),
        "out": str(job / "artifact"),
        "cache": str(job / "cache"),
    }
    _log(f"ingot {method} {shape}")
    try:
        row |= run_worker(WORKER, spec, job, BUILD_TIMEOUT_S)
        row["ok"] = True
    except WorkerFailed as e:
        row |= {"ok": False, "error": str(e)}
    shutil.rmtree(job / "cache", ignore_errors=True)
    if row["ok"] and method == "rtn" and shape == args.decode_shape:
        keep["ingot"] = job / "artifact"
    else:
        shutil.rmtree(job, ignore_errors=True)
    return row


def _ortgenai_build(work: Path, checkpoint: Path, shape: str, args, keep) -> dict:
    out = work / f"{shape}-ortgenai"
    command = [str(args.ortgenai_python), "-m", "onnxruntime_genai.models.builder"]
    command += ["-m", str(checkpoint), "-o", str(out), "-p", "int4", "-e", "cpu"]
    command += ["-c", str(work / "ortgenai-cache")]
    _log(f"onnxruntime-genai {shape}")
    row: dict[str, Any] = {"tool": "onnxruntime-genai", "shape": shape, "method": "int4"}
    row |= _run_watched(command, args.peer_memory_limit_gib * GIB)
    shutil.rmtree(work / "ortgenai-cache", ignore_errors=True)
    if row["ok"] and (out / "genai_config.json").exists():
        row["artifact_bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        if shape == args.decode_shape:
            keep["onnxruntime-genai"] = out
            return row
    shutil.rmtree(out, ignore_errors=True)
    return row


def _run_watched(command: list[str], limit: float) -> dict[str, Any]:
    """Run `command`, sampling its process tree's resident memory; past `limit` bytes it is
    killed and reported as out of memory (the 24 GB runner would have killed it, with whatever
    else was running beside it)."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, over = 0, False
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    while proc.poll() is None:
        rss = _tree_rss(proc.pid)
        peak = max(peak, rss)
        if rss > limit:
            over = True
            proc.kill()
            break
        time.sleep(0.05)
    proc.wait()
    reader.join(5)
    row = {"seconds": time.perf_counter() - started, "peak_rss_bytes": peak}
    if over:
        return row | {"ok": False, "error": f"killed past {limit / GIB:.0f} GiB resident"}
    if proc.returncode != 0:
        return row | {"ok": False, "error": "".join(output[-10:])}
    return row | {"ok": True}


def _tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and its descendants (from /proc)."""
    total, pending = 0, [pid]
    while pending:
        p = pending.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(f"/proc/{p}/task/{p}/children") as f:
                pending += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _decode(work: Path, keep: dict[str, Path], args) -> dict[str, Any]:
    cfg = SHAPES[args.decode_shape]
    prompt = [cfg["bos_token_id"], *range(1000, 1000 + PROMPT_LEN - 1)]
    results: dict[str, Any] = {}
    if "ingot" in keep:
        spec = {"kind": "decode", "artifact": str(keep["ingot"]), "prompt_ids": prompt}
        _log("decode ingot")
        results["ingot"] = _try(WORKER, spec | {"tokens": DECODE_TOKENS}, work, None)
    if "onnxruntime-genai" in keep:
        spec = {"kind": "ortgenai-decode", "model_dir": str(keep["onnxruntime-genai"])}
        _log("decode onnxruntime-genai")
        spec |= {"prompt_ids": prompt, "tokens": DECODE_TOKENS}
        results["onnxruntime-genai"] = _try(WORKER, spec, work, args.ortgenai_python)
    return results


def _try(module: str, spec: dict, work: Path, python: Path | None) -> dict[str, Any]:
    try:
        return {"ok": True} | run_worker(module, spec, work, BUILD_TIMEOUT_S, python=python)
    except WorkerFailed as e:
        return {"ok": False, "error": str(e)}


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value / GIB:.2f}"


def _markdown(report: dict[str, Any]) -> str:
    lines = ["# Real-size builds (random bf16 weights, W4 g128, fp16 KV)", ""]
    load = report.get("load_1min")
    if load:
        lines.append(f"Host load (1 min): {load['before']:.1f} before, {load['after']:.1f} after.")
    lines += ["", "| shape | tool | method | wall s | peak RSS GiB | artifact GiB | note |"]
    lines.append("|---|---|---|---:|---:|---:|---|")
    for b in report["builds"]:
        peak = b.get("peak_rss_bytes") or _build_peak(b)
        note = "" if b.get("ok") else b.get("error", "")[:120].replace("\n", " ")
        lines.append(
            f"| {b['shape']} | {b['tool']} | {b['method']} | {b.get('seconds', 0):.0f} | "
            f"{_gib(peak)} | {_gib(b.get('artifact_bytes'))} | {note} |"
        )
    lines += ["", "Per stage (ingot): measured vs `ingot plan`", ""]
    lines.append("| shape | method | stage | wall s | plan s | peak GiB | plan GiB |")
    lines.append("|---|---|---|---:|---:|---:|---:|")
    for b in report["builds"]:
        if b["tool"] != "ingot" or not b.get("ok"):
            continue
        planned = {s["stage"]: s for s in b.get("plan", {}).get("stages", [])}
        for stage, m in b["stages"].items():
            p = planned.get(stage, {})
            plan_s = f"{p['seconds']:.0f}" if "seconds" in p else "—"
            lines.append(
                f"| {b['shape']} | {b['method']} | {stage} | {m['seconds']:.0f} | {plan_s} | "
                f"{_gib(m['peak_rss_bytes'])} | {_gib(p.get('peak_bytes'))} |"
            )
    if report.get("decode"):
        lines += ["", "Batch-1 decode, 8B shape (32-token prompt, 32 tokens)", ""]
        lines += ["| tool | tok/s | load s | peak RSS GiB |", "|---|---:|---:|---:|"]
        for tool, d in report["decode"].items():
            if d.get("ok"):
                lines.append(
                    f"| {tool} | {d['decode_tok_s']:.2f} | {d['load_seconds']:.0f} | "
                    f"{_gib(d['max_rss_bytes'])} |"
                )
            else:
                lines.append(f"| {tool} | failed: {d.get('error', '')[:100]} | | |")
    return "\n".join(lines) + "\n"


def _build_peak(build: dict[str, Any]) -> int | None:
    """An ingot build's peak: the largest stage peak (ru_maxrss after a build is only its last
    stage's, since the build resets the high-water mark per stage), or the recorded maximum."""
    peaks = [m.get("peak_rss_bytes") or 0 for m in build.get("stages", {}).values()]
    return max(peaks + [build.get("max_rss_bytes") or 0]) or None


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
