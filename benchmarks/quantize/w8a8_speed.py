"""Speed of W8A8 and FP8 engines on ONNX Runtime's CPU against fp32 and int4, one host, one run.

Reproduce (alone on a quiet machine; about 15 minutes on 2 cores; writes
benchmarks/results/w8a8_speed.json and w8a8_speed.md):

    .venv/bin/python -m benchmarks.quantize.w8a8_speed [--models pydoc-16m,llama-1b-shape]
        [--runs 3] [--prefill-prompts 8] [--prefill-len 256] [--tokens 128] [--threads 2]
        [--wait-idle SECONDS] [--quick] [--report-only]

One artifact per variant (built through `ingot build` from a recipe written here; stage cache
and artifacts in the benchmark cache), the same engine settings for all (level `extended`,
MatMulNBits accuracy level 4, --threads threads):

- fp32: no quantization;
- int4: RTN int4 g32 symmetric decoder linears (MatMulNBits, int8 activations per block);
- w8a8: SmoothQuant (alpha 0.5, RTN int8 weights: the rounding does not change the speed)
  with int8 activations per token (MatMulInteger, u8s8);
- w8a8-static: the same with one calibrated int8 scale per tensor (MatMulIntegerToFloat);
- fp8: FP8 E4M3 per-channel weights and per-token FP8 activations (Q/DQ, float MatMul);
- fp8-weights: FP8 weights only.

Every quantized variant keeps lm_head at RTN int8 per channel (the demo recipes' choice), so
the decoder linears are what differs. Calibration (smoothquant): 32 windows of 512 tokens of
../shared/data/pydoc-calib.txt. Measured per variant, each in a fresh worker process
(benchmarks/decode/engines.py): prefill tok/s of --prefill-prompts prompts of --prefill-len
tokens at once (one step), and batch-1 greedy decode tok/s of --tokens new tokens (TTFT
apart), medians of --runs; the engine's size on disk and the kernels of its optimized graph.
The host's load is sampled between cases; a run above the thread count + 1 is written REFUSED
and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.decode.artifact import (
    KV_BLOCK_SIZE,
    WORKER,
    export_max_seq_len,
    ingot_code_fingerprint,
)
from benchmarks.decode.models import PROMPT_LEN, BenchModel, prepare_model
from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch, wait_idle
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, bench_cache_dir, data_dir, models_dir
from benchmarks.harness.report import add_report_only, publish, rerender

STEM = "w8a8_speed"
LM_HEAD_INT8 = {"method": "rtn", "bits": 8, "group_size": -1, "targets": ["lm_head"], "ignore": []}
LAYERS = ["re:layers\\..*"]
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "fp32": [],
    "int4": [{"method": "rtn", "bits": 4, "group_size": 32, "targets": LAYERS, "ignore": []}],
    "w8a8": [{"method": "smoothquant", "weights": "rtn", "targets": LAYERS, "ignore": []}],
    "w8a8-static": [
        {
            "method": "smoothquant",
            "weights": "rtn",
            "activations": "static",
            "targets": LAYERS,
            "ignore": [],
        }
    ],
    "fp8": [{"method": "fp8", "targets": LAYERS, "ignore": []}],
    "fp8-weights": [{"method": "fp8", "activations": "none", "targets": LAYERS, "ignore": []}],
}
KERNELS = ("MatMul", "MatMulNBits", "MatMulInteger", "MatMulIntegerToFloat", "DequantizeLinear")
CALIBRATION = {"samples": 32, "seq_len": 512, "seed": 0}
BUILD_TIMEOUT_S, RUN_TIMEOUT_S = 3600, 1800
QUICK = {"runs": 1, "tokens": 16, "prefill_prompts": 2, "prefill_len": 64}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    watch = LoadWatch(args.threads)
    idle_s = wait_idle(args.wait_idle, _log)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ingot-w8a8-") as tmp:
        for name in args.models:
            model = prepare_model(name, models_dir(), data_dir() / "pydoc-eval.txt")
            for variant in args.variants:
                rows.append(_variant(args, model, variant, Path(tmp), watch))
    refused = watch.refusal()
    report = {
        "machine": machine_info(),
        "load": watch.record() | {"idle_wait_s": idle_s},
        "refused": refused,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out_dir", "report_only")},
        "rows": rows,
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _variant(args, model: BenchModel, variant: str, tmp: Path, watch: LoadWatch) -> dict:
    row: dict[str, Any] = {"model": model.name, "variant": variant}
    _log(f"{model.name} {variant}: build")
    try:
        build = run_worker(WORKER, _build_spec(args, model, variant, tmp), tmp, BUILD_TIMEOUT_S)
    except WorkerFailed as e:
        return row | {"error": f"build: {e}"}
    if not build["ok"]:
        return row | {"error": f"build: {build['error']}"}
    artifact = build["artifact"]
    row |= {"build_s": build["seconds"]} | _engine_graph(Path(artifact))
    prompts = model.prompts(args.prefill_prompts, args.prefill_len)
    _log(f"{model.name} {variant}: prefill {len(prompts)} x {args.prefill_len}")
    prefill_spec = {
        "kind": "prefill",
        "artifact": artifact,
        "cases": [{"name": "batch", "prompts": prompts}],
        "runs": args.runs,
    }
    row["prefill"] = _worker(prefill_spec, tmp)
    row["load_after_prefill"] = watch.sample()
    _log(f"{model.name} {variant}: batch-1 decode of {args.tokens} tokens")
    decode_spec = {
        "kind": "decode",
        "engine": "ingot",
        "load": {"artifact": artifact, "batch": 1, "batched_tokens": PROMPT_LEN},
        "prompts": [list(model.prompt_ids)],
        "tokens": args.tokens,
        "warmup_tokens": min(8, args.tokens),
        "runs": args.runs,
        "budget_s": 300,
        "reduced_budget_s": 90,
    }
    row["decode"] = _worker(decode_spec, tmp)
    row["load_after_decode"] = watch.sample()
    return row


def _build_spec(args, model: BenchModel, variant: str, tmp: Path) -> dict[str, Any]:
    quantize = VARIANTS[variant] + ([LM_HEAD_INT8] if VARIANTS[variant] else [])
    recipe: dict[str, Any] = {
        "source": {"path": str(model.path)},
        "quantize": quantize,
        "kv_cache": {"dtype": "fp32", "block_size": KV_BLOCK_SIZE},
        "export": {"max_seq_len": export_max_seq_len(model)},
        "targets": [
            {
                "engine": "onnxruntime",
                "device": "cpu",
                "optimization_level": "extended",
                "intra_op_num_threads": args.threads,
                "matmul_accuracy_level": 4,
            }
        ],
        "artifact": {"name": f"{model.name}-{variant}"},
    }
    if any(q["method"] == "smoothquant" for q in quantize):
        text = data_dir() / "pydoc-calib.txt"
        recipe["calibration"] = {"dataset": str(text), **CALIBRATION}
    path = tmp / f"{model.name}-{variant}.yaml"
    path.write_text(json.dumps(recipe, indent=2))
    fingerprint = ingot_code_fingerprint()
    return {
        "kind": "build",
        "recipe": str(path),
        "out": str(bench_cache_dir() / "w8a8-artifacts" / f"{model.name}-{variant}"),
        "cache": str(bench_cache_dir() / "stage-cache" / fingerprint),
    }


def _engine_graph(artifact: Path) -> dict[str, Any]:
    """The engine's bytes on disk and which matmul kernels its optimized graph holds."""
    import onnx

    manifest = json.loads((artifact / "manifest.json").read_text())
    path = artifact / manifest["engines"][0]["path"]
    graph = onnx.load(path, load_external_data=False).graph
    ops = Counter(n.op_type for n in graph.node)
    size = sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file())
    return {"engine_bytes": size, "kernels": {k: ops[k] for k in KERNELS if ops[k]}}


def _worker(spec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    try:
        return run_worker(WORKER, spec, tmp, RUN_TIMEOUT_S)
    except WorkerFailed as e:
        return {"ok": False, "error": str(e)}


def _markdown(report: dict[str, Any]) -> str:
    lines = ["# W8A8 and FP8 speed on ONNX Runtime CPU", ""]
    s = report["settings"]
    m = report["machine"]
    lines += [
        f"{m.get('cpu_model', '?')}, {s['threads']} threads; load samples "
        f"{report['load']['load_1min_samples']}. Prefill: {s['prefill_prompts']} prompts x "
        f"{s['prefill_len']} tokens in one step; decode: batch 1, {s['tokens']} new tokens, "
        f"median of {s['runs']} runs. `python -m benchmarks.quantize.w8a8_speed`",
        "",
        "| model | variant | engine MiB | prefill tok/s | x fp32 | decode tok/s | x fp32 "
        "| kernels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base: dict[str, tuple[float | None, float | None]] = {}
    for r in report["rows"]:
        prefill, decode = _rate(r, "prefill"), _rate(r, "decode")
        if r["variant"] == "fp32":
            base[r["model"]] = (prefill, decode)
        bp, bd = base.get(r["model"], (None, None))
        if "error" in r:
            lines.append(f"| {r['model']} | {r['variant']} | error: {r['error'][:80]} |||||||")
            continue
        kernels = ", ".join(f"{k} {v}" for k, v in r["kernels"].items())
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['engine_bytes'] / 2**20:.1f} | {_f(prefill)} | "
            f"{_ratio(prefill, bp)} | {_f(decode)} | {_ratio(decode, bd)} | {kernels} |"
        )
    return "\n".join(lines) + "\n"


def _rate(row: dict[str, Any], part: str) -> float | None:
    result = row.get(part)
    if not result or not result.get("ok"):
        return None
    if part == "prefill":
        return result["cases"][0]["tokens_per_s"]
    return result.get("tokens_per_s")


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "—" if value is None or not base else f"{value / base:.2f}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="pydoc-16m", help="comma-separated bench models")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="batch-1 new tokens")
    parser.add_argument("--prefill-prompts", type=int, default=8)
    parser.add_argument("--prefill-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--wait-idle", type=float, default=0, metavar="SECONDS")
    parser.add_argument("--quick", action="store_true", help="smoke run, to a temp dir")
    parser.add_argument("--out-dir", type=Path, default=None)
    add_report_only(parser)
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.out_dir is None:
        args.out_dir = Path(tempfile.gettempdir()) / "ingot-w8a8" if args.quick else RESULTS
    args.models = args.models.split(",")
    args.variants = args.variants.split(",")
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown} (known: {', '.join(VARIANTS)})")
    return args


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
