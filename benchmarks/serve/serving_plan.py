"""The serving plan against the server it plans: `ingot plan ARTIFACT --serve --memory M` for
each engine of an artifact, then `ingot serve` with the options the plan prints, its KV cache
filled, and its peak resident memory (VmHWM) against the plan's resident total.

    .venv/bin/python -m benchmarks.serve.serving_plan   # writes benchmarks/results/serving_plan.*

Options: [--models-dir DIR] [--eval-text FILE] [--out-dir DIR] [--report-only].

Cases: the demo (recipes/demo-openvino.yaml: both engines) with --memory 1GiB, as many
sequences as fit; the 1B shape (the decode benchmarks' RTN int4 g32 artifact with both engines,
benchmarks/decode/artifact.py) with --memory 4GiB and --max-num-seqs 4 (its prefill on two
cores is slow: four sequences fill the cache the plan sizes for them). Per engine, in a fresh
server: as many requests as the plan's sequences, all at once, each a distinct random prompt
of max_seq_len - 8 tokens and 8 greedy tokens (so every sequence ends at max_seq_len and the
cache is full), then the server's VmHWM. Target (issue 28): the plan within +-15% of the
measured peak. Nothing here is timed: the host's load is recorded, never refused.

The engines' overhead coefficients (runtime/engines/{onnxruntime,openvino}/__init__.py,
`RESIDENT`) were fitted to this benchmark's `ready_rss_bytes` (after loading: base + weights)
and `peak_rss_bytes - ready_rss_bytes` (the activations of full prefill chunks) on both models.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.decode.artifact import WORKER as BUILD_WORKER
from benchmarks.decode.artifact import DecodeArtifact, build_spec
from benchmarks.decode.models import prepare_model
from benchmarks.harness.launch import run_worker
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import REPO, RESULTS, data_dir, models_dir
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.serve.client import run_requests
from benchmarks.serve.server import ServerProcess, free_port

STEM = "serving_plan"
INGOT = str(Path(sys.executable).parent / "ingot")
ENGINES = ("onnxruntime", "openvino")
CASES = (("demo", "1GiB", None), ("llama-1b-shape", "4GiB", 4))  # model, --memory, --max-num-seqs
OUTPUT_TOKENS = 8
TARGET = 0.15
START_TIMEOUT_S = 600
_MIB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, markdown)
    watch = LoadWatch(2, timed=False)
    report: dict[str, Any] = {"machine": machine_info(), "cases": []}
    report["settings"] = {"output_tokens": OUTPUT_TOKENS, "target": TARGET}
    with tempfile.TemporaryDirectory(prefix="ingot-serving-plan-") as tmp_dir:
        tmp = Path(tmp_dir)
        for model, memory, max_num_seqs in CASES:
            artifact = _build(model, tmp, args)
            for engine in ENGINES:
                case = {"model": model, "memory": memory, "engine": engine}
                plan = _plan(artifact, memory, engine, max_num_seqs)
                case["plan"] = plan
                case["measured"] = _serve_full(artifact, plan, tmp / f"{model}-{engine}.log")
                report["cases"].append(case)
                watch.sample()
    report["load"] = watch.record()
    return publish(report, args.out_dir, STEM, markdown)


def _build(model: str, tmp: Path, args: argparse.Namespace) -> Path:
    """The artifact with both engines: the demo built by `ingot build`, the 1B shape by the
    decode benchmarks' worker (into the benchmark cache, reused)."""
    if model == "demo":
        out = tmp / "demo-openvino"
        command = [INGOT, "build", "--recipe", str(REPO / "recipes" / "demo-openvino.yaml")]
        command += ["--out", str(out), "--cache-dir", str(tmp / "cache")]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return out
    bench_model = prepare_model(model, args.models_dir, args.eval_text)
    spec = build_spec(bench_model, tmp, 2, [], DecodeArtifact(block_size=32, openvino=True))
    built = run_worker(BUILD_WORKER, spec, tmp, 3600)
    if not built.get("ok"):
        raise SystemExit(f"the ingot build failed: {built.get('error')}")
    return Path(built["artifact"])


def _plan(artifact: Path, memory: str, engine: str, max_num_seqs: int | None) -> dict[str, Any]:
    command = [INGOT, "plan", str(artifact), "--serve", "--memory", memory, "--engine", engine]
    command += ["--json"] + (["--max-num-seqs", str(max_num_seqs)] if max_num_seqs else [])
    return json.loads(subprocess.run(command, check=True, capture_output=True).stdout)


def _serve_full(artifact: Path, plan: dict[str, Any], log: Path) -> dict[str, Any]:
    """`ingot serve` as the plan says, its cache filled; its memory before and after."""
    port = free_port()
    sequences = plan["sequences"]
    command = [INGOT, "serve", str(artifact), "--port", str(port), *plan["serve_args"]]
    command += ["--max-queue", str(sequences)]
    server = ServerProcess(command, log)
    base_url = f"http://127.0.0.1:{port}"
    server.start(base_url, START_TIMEOUT_S)
    try:
        ready = _status(server.process.pid)
        manifest = json.loads((artifact / "manifest.json").read_text())
        vocab = manifest["model"]["vocab_size"]
        rng = np.random.default_rng(0)
        length = plan["max_seq_len"] - OUTPUT_TOKENS
        prompts = [rng.integers(16, vocab, length).tolist() for _ in range(sequences)]
        timings = run_requests(base_url, prompts, OUTPUT_TOKENS, [0.0] * sequences)
        full = _status(server.process.pid)
    finally:
        server.stop()
    kv_lines = [line for line in log.read_text().splitlines() if "KV cache:" in line]
    return {
        "ready_rss_bytes": ready["VmRSS"],
        "peak_rss_bytes": full["VmHWM"],
        "rss_full_bytes": full["VmRSS"],
        "rss_file_full_bytes": full["RssFile"],
        "requests": len(timings),
        "tokens_generated": sum(t.output_tokens for t in timings),
        "kv_log": kv_lines[0].split("KV cache: ", 1)[1] if kv_lines else None,
    }


def _status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


# ----------------------------------------------------------------------------- the report


def markdown(r: dict[str, Any]) -> str:
    s = r["settings"]
    lines = [
        "# The serving plan against `ingot serve` with its KV cache full",
        "",
        f"Generated by `benchmarks/serve/serving_plan.py` on {r['machine']['date']}. Per case: "
        "`ingot plan ARTIFACT --serve --memory M --engine E --json`, then `ingot serve` with "
        f"the plan's options, as many requests as the plan's sequences at once (prompts of "
        f"max_seq_len - {s['output_tokens']} random tokens, {s['output_tokens']} greedy "
        "tokens: the cache full), the server's peak resident set (VmHWM) against the plan's "
        f"resident total. Target: within +-{s['target']:.0%}.",
        "",
        "| model | --memory | engine | weights (files) MiB | overhead MiB | KV MiB | sequences "
        "| plan MiB | ready RSS | peak RSS | peak / plan | target | request / limit |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for c in r["cases"]:
        p, m = c["plan"], c["measured"]
        ratio = m["peak_rss_bytes"] / p["resident"]
        met = "met" if abs(ratio - 1) <= s["target"] else "**missed**"
        lines.append(
            f"| {c['model']} | {c['memory']} | {p['engine']} | {p['weights'] / _MIB:.0f} "
            f"({p['weight_files'] / _MIB:.0f}) | {p['overhead'] / _MIB:.0f} | "
            f"{p['kv_resident'] / _MIB:.0f} | {p['sequences']} x {p['max_seq_len']} | "
            f"{p['resident'] / _MIB:.0f} | {m['ready_rss_bytes'] / _MIB:.0f} | "
            f"{m['peak_rss_bytes'] / _MIB:.0f} | {ratio:.3f} | +-{s['target']:.0%} {met} | "
            f"{p['memory_request'] >> 20}Mi / {p['memory_limit'] >> 20}Mi |"
        )
    lines += ["", "The engines' overhead models (from the plans):", ""]
    models = {c["plan"]["kind"]: c["plan"]["overhead_model"] for c in r["cases"]}
    lines += [f"- {kind}: {model}" for kind, model in models.items()]
    lines += ["", "The servers' KV cache lines:", ""]
    lines += [f"- {c['model']} {c['engine']}: {c['measured']['kv_log']}" for c in r["cases"]]
    samples = r["load"]["load_1min_samples"]
    lines += ["", f"Host load (untimed, recorded): max {max(samples):.1f}."]
    return "\n".join(lines) + "\n"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, default=models_dir(), metavar="DIR")
    parser.add_argument("--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, metavar="DIR")
    add_report_only(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
