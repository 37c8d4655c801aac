"""What the fast defaults cost in perplexity: MatMulNBits with int8 activations
(`matmul_accuracy_level: 4`) and a quantized lm_head, measured on the engine that ships.

    .venv/bin/python -m benchmarks.quantize.fast_defaults [--models pydoc-16m,pydoc-tiny]
        [--threads N] [--max-windows N] [--out-dir benchmarks/results] [--report-only]

- Models: ../shared/models/pydoc-16m (8 layers, width 384, untied lm_head) and pydoc-tiny
  (4 layers, width 256, tied embeddings; the demo model). Text: ../shared/data/pydoc-eval.txt,
  the documentation files held out of both models' training, cut into consecutive windows of
  256 tokens (all of them unless --max-windows).
- Each configuration is an `ingot build` of a recipe with an `evaluate` section (the build's
  own evaluate stage): "original" is the float checkpoint and "IR" the quantized IR, both in
  PyTorch fp32; "engine" is the built ONNX Runtime engine run as the runtime runs it (one window
  per call through the runtime's pool, inputs and session), so int8 activations count.
  The configurations: the float model; RTN int4 g32 symmetric on the decoder layers with
  lm_head fp32, at accuracy level 0 and 4; then at level 4 with lm_head RTN int8 per channel
  symmetric, and with lm_head RTN int4 g32 symmetric. Every level-4 engine also passed the
  build's exact check (the same graph at level 0 against the IR).
- Host load (harness.load.LoadWatch) is sampled around every build: perplexity does not depend on
  timing, but a loaded run is refused all the same, as every benchmark here refuses one (the
  report carries a REFUSED line and the script exits 1).

Writes benchmarks/results/fast_defaults.json and fast_defaults.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.decode.graphs import artifact_graphs
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir
from benchmarks.harness.report import add_report_only, publish, rerender

LAYERS_INT4 = {
    "method": "rtn",
    "bits": 4,
    "group_size": 32,
    "symmetric": True,
    "targets": ["re:layers\\..*"],
}
LM_HEAD = {
    "int8 per channel": {"method": "rtn", "bits": 8, "group_size": -1, "symmetric": True},
    "int4 g32": {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True},
}
# (row label, decoder layers quantized, lm_head scheme or None, MatMulNBits accuracy level)
CONFIGS = [
    ("float", False, None, 0),
    ("int4 g32 layers, lm_head fp32, level 0", True, None, 0),
    ("int4 g32 layers, lm_head fp32, level 4", True, None, 4),
    ("int4 g32 layers, lm_head int8 per channel, level 4", True, "int8 per channel", 4),
    ("int4 g32 layers, lm_head int4 g32, level 4", True, "int4 g32", 4),
]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.report_only:
        return rerender(args.out_dir, args.report_name, _markdown)
    import torch  # only for a measurement: the builds' evaluate stage runs on its threads

    torch.set_num_threads(args.threads)
    watch = LoadWatch(args.threads)
    report: dict[str, Any] = {
        "machine": machine_info(),
        "settings": {
            "eval_text": str(args.eval_text),
            "seq_len": args.seq_len,
            "max_windows": args.max_windows,
            "threads": args.threads,
        },
        "rows": [],
    }
    with tempfile.TemporaryDirectory(prefix="ingot-fast-defaults-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        for model in args.models:
            for config in CONFIGS:
                row = _build(work, models_dir() / model, config, args)
                row["load_1min_after"] = round(watch.sample(), 2)
                report["rows"].append(row)
                _log(
                    f"{model}: {row['config']}: original {row['original']:.4f}, IR "
                    f"{row['quantized']:.4f}, engine {row['engine']:.4f} "
                    f"({row['seconds']:.0f} s, load {row['load_1min_after']})"
                )
    refused = watch.refusal()
    report["host_load"] = watch.record()
    report["refused"] = refused
    return publish(report, args.out_dir, args.report_name, _markdown)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="pydoc-16m,pydoc-tiny", type=lambda s: s.split(","),
        help="checkpoints under ../shared/models (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-windows", type=int, default=None, help="default: every window")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--report-name", default="fast_defaults")
    parser.add_argument("--work-dir", type=Path, default=None, help="where builds are written")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


def _recipe(checkpoint: Path, config: tuple, args: argparse.Namespace) -> dict[str, Any]:
    _, layers, lm_head, level = config
    quantize = [LAYERS_INT4] if layers else []
    if lm_head is not None:
        quantize.append({**LM_HEAD[lm_head], "targets": ["lm_head"], "ignore": []})
    perplexity = {"dataset": str(args.eval_text), "seq_len": args.seq_len}
    if args.max_windows is not None:
        perplexity["max_windows"] = args.max_windows
    return {
        "source": {"path": str(checkpoint)},
        "quantize": quantize,
        "kv_cache": {"dtype": "fp32", "block_size": 16},
        "export": {"max_seq_len": 1024},
        "targets": [
            {
                "engine": "onnxruntime",
                "device": "cpu",
                "optimization_level": "extended",
                "intra_op_num_threads": args.threads,
                "matmul_accuracy_level": level,
            }
        ],
        "evaluate": {"perplexity": perplexity},
        "artifact": {"name": checkpoint.name},
    }


def _build(work: Path, checkpoint: Path, config: tuple, args: argparse.Namespace) -> dict:
    from ingot.artifacts import verify_artifact
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    label, _, lm_head, level = config
    job = work / f"{checkpoint.name}-{len(list(work.glob('*.json')))}"
    recipe = job.with_suffix(".json")  # a recipe file is YAML, and JSON is YAML
    recipe.write_text(json.dumps(_recipe(checkpoint, config, args)))
    started = time.perf_counter()
    result = build(recipe, job, cache=StageCache(work / "cache"))
    seconds = time.perf_counter() - started
    manifest = verify_artifact(result.artifact)
    ppl = json.loads((result.artifact / "eval" / "report.json").read_text())["perplexity"]
    check = manifest.engines[0].build["check"]
    ops = artifact_graphs(result.artifact)["onnxruntime_optimized"]
    return {
        "model": checkpoint.name,
        "config": label,
        "lm_head": lm_head or "fp32",
        "matmul_accuracy_level": level,
        **{k: ppl[k] for k in ("windows", "seq_len", "tokens_scored", "original", "quantized")},
        **{k: ppl[k] for k in ("delta", "engine", "engine_delta", "engine_relative_delta")},
        "check_accuracy": check["accuracy"],
        "exact_check_max_rel_logit_diff": check.get("exact_check", check)["max_rel_logit_diff"],
        "engine_max_rel_logit_diff": check["max_rel_logit_diff"],
        "matmulnbits": ops["op_types"].get("MatMulNBits", 0),
        "weight_bytes_per_step": ops["weight_bytes_per_step"],
        "seconds": round(seconds, 1),
    }


def _markdown(report: dict[str, Any]) -> str:
    settings, machine = report["settings"], report["machine"]
    lines = ["# Fast defaults: perplexity of the engine that ships", ""]
    rows = report["rows"]
    windows = f"{rows[0]['windows']} windows of {settings['seq_len']} tokens" if rows else ""
    lines += [
        f"Text: `{settings['eval_text']}` (held out of training), {windows}, consecutive, "
        "each scored on its seq_len - 1 next-token predictions. original and IR: PyTorch fp32; "
        "engine: the built ONNX Runtime engine through the runtime's pool, inputs and session "
        "(`ingot build` with an `evaluate` section; MatMulNBits accuracy level 4 = int8 "
        "activations). RTN symmetric everywhere; fp32 KV cache.",
        "",
        f"Host: {machine['cpu_model']}, {machine['usable_cores']} cores, "
        f"{settings['threads']} threads; onnxruntime {machine['versions']['onnxruntime']}, "
        f"torch {machine['versions']['torch']}; {machine['date']}. Host load (1 min): "
        + ", ".join(f"{v:.1f}" for v in report["host_load"]["load_1min_samples"])
        + ".",
        "",
        "| model | configuration | original | IR | IR delta | engine | engine delta | "
        "MatMulNBits | weight MiB / step | build s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['config']} | {r['original']:.4f} | {r['quantized']:.4f} | "
            f"{r['delta']:+.4f} | {r['engine']:.4f} | {r['engine_delta']:+.4f} "
            f"({100 * r['engine_relative_delta']:+.2f}%) | {r['matmulnbits']} | "
            f"{r['weight_bytes_per_step'] / 2**20:.2f} | {r['seconds']:.0f} |"
        )
    lines += [
        "",
        "IR delta: the weights' cost (quantized IR - original); engine delta: what the artifact "
        "serves (engine - original), the number `evaluate.perplexity.max_delta` gates. At level "
        "0 the engine computes the IR's numbers (the two perplexities agree to 5e-6); the "
        "level-4 rows' engine - IR is the int8 activations' cost. Weight MiB / step: "
        "initializer bytes a decode step reads in the optimized engine (benchmarks/"
        "decode/graphs.py); a tied float lm_head reads the embedding table.",
        "",
        *_costs(rows),
    ]
    return "\n".join(lines)


def _costs(rows: list[dict[str, Any]]) -> list[str]:
    """Each fast choice's own cost: the engine's perplexity with it minus without it."""
    engine = {(r["model"], r["config"]): r["engine"] for r in rows}
    steps = [  # (what, with it, without it)
        ("int8 activations", CONFIGS[2][0], CONFIGS[1][0]),
        ("lm_head int8 per channel", CONFIGS[3][0], CONFIGS[2][0]),
        ("lm_head int4 g32", CONFIGS[4][0], CONFIGS[2][0]),
    ]
    lines = ["| model | " + " | ".join(what for what, _, _ in steps) + " |"]
    lines.append("|---|" + "---:|" * len(steps))
    for model in dict.fromkeys(r["model"] for r in rows):
        cells = [
            f"{engine[model, on] - engine[model, off]:+.4f}"
            if (model, on) in engine and (model, off) in engine
            else "—"
            for _, on, off in steps
        ]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    intro = "Each fast choice's own cost in engine perplexity (with it minus without it):"
    return [intro, "", *lines, ""]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
