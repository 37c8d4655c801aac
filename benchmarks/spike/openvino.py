"""Issue 27's OpenVINO route: ingot's model, ingot's weights and ingot's scheduler on OpenVINO's
CPU plugin (PagedAttention over ingot's block tables, int4 weight-compressed MatMuls), against
ingot's ONNX Runtime engine on the same artifact, in the same run.

Reproduce (needs benchmarks/.venvs/openvino: `benchmarks/peers/setup.sh openvino`; each part
merges into benchmarks/results/spike_openvino.json, so a long run can be split):

    .venv/bin/python -m benchmarks.spike.openvino \
        [--models pydoc-16m llama-1b-shape] [--parts check batch1 batched long]
        [--engines ingot openvino-f32 openvino] [--rounds 3] [--threads 2] [--out-dir DIR]
        [--models-dir DIR] [--eval-text FILE] [--report-only]

Parts: `check` (ov_check_job.py: logits against the exact portable graph and ingot's engine,
greedy agreement, route A), `batch1` (one 32-token prompt, 128 new tokens), `batched` (32
prompts of 32 tokens, 64 new tokens each, decoding together), `long` (one prompt of 4096 - 128
tokens, 128 new: decode at ~4k of context and its TTFT; pydoc-16m's context is 1024, so its
prompt is 896). Engines, each ingot's Generator in its own process (openvino_worker.py):
`ingot` (the artifact's ONNX Runtime engine: MatMulNBits, int8 activations, fp32 KV),
`openvino-f32` (f32 activations with int8 dynamic quantization in the int4 FullyConnected, f32
KV: ingot's KV), `openvino` (the plugin's defaults on this CPU, OpenVINO GenAI's: bf16
activations, u8 KV). Each round runs every engine once (load, warm-up, one timed run), in
turn, the order rotated; medians over rounds, ratios paired within a round.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.decode.models import MODELS, BenchModel
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python, peer_version
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.spike.cases import (
    decode_spec,
    measure_parts,
    previous_report,
    run_case,
    run_job,
)
from benchmarks.spike.openvino_report import markdown

STEM = "spike_openvino"
WORKER = "benchmarks.spike.openvino_worker"
PARTS = ("check", "batch1", "batched", "long")
ENGINES = {  # name -> the worker's engine and its OpenVINO settings
    "ingot": {},
    "openvino-f32": {"precision": "f32", "kv": "f32", "dyn_quant": 32},
    "openvino": {"precision": "bf16", "kv": "u8", "dyn_quant": 32},
}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, markdown)
    report = previous_report(args.out_dir, STEM, ENGINES)
    report["machine"] = machine_info()
    report["versions"] = _versions()
    measure_parts(
        report,
        args,
        (),
        lambda model, artifact, tmp: _check(model, artifact, args, tmp),
        lambda model, artifact, part, tmp, watch: _case(model, artifact, part, args, tmp, watch),
    )
    return publish(report, args.out_dir, STEM, markdown)


def _versions() -> dict[str, Any]:
    python = peer_python("openvino")
    out = {d: peer_version(python, d) for d in ("openvino", "onnxruntime", "numpy")}
    from benchmarks.harness.machine import _version

    return {"openvino venv": out, "ingot venv": {"onnxruntime": _version("onnxruntime")}}


def _case(
    model: BenchModel, artifact: str, part: str, args: argparse.Namespace, tmp: Path, watch
) -> dict[str, Any]:
    def job(engine: str, prompts: list[list[int]], tokens: int, ctx: int) -> dict[str, Any]:
        settings = ENGINES[engine]
        load = {"artifact": artifact, "batch": len(prompts), "ctx_per_seq": ctx}
        load["batched_tokens"] = sum(map(len, prompts))
        if settings:
            load |= {"threads": args.threads, **settings}
        spec = decode_spec("openvino" if settings else "ingot", load, prompts, tokens)
        python = peer_python("openvino") if settings else None
        result = run_job(WORKER, spec, tmp, python)
        watch.sample()
        return result

    return run_case(model, artifact, part, list(args.engines), args.rounds, job)


def _check(model: BenchModel, artifact: str, args: argparse.Namespace, tmp: Path) -> dict:
    spec = {
        "kind": "check",
        "artifact": artifact,
        "threads": args.threads,
        "greedy_prompt": list(model.prompt_ids),
        "greedy_tokens": 32,
        "configs": {k: v for k, v in ENGINES.items() if v},
    }
    return run_job(WORKER, spec, tmp, peer_python("openvino"))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--models-dir", type=Path, default=models_dir(), help="holds pydoc-16m (%(default)s)"
    )
    parser.add_argument(
        "--eval-text",
        type=Path,
        default=data_dir() / "pydoc-eval.txt",
        help="pydoc-16m's batched and long prompts (%(default)s)",
    )
    add_report_only(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
