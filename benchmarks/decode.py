"""Batch-1 greedy decode speed of ingot against transformers and the PyTorch IR, on one host.

    python benchmarks/decode.py [--models pydoc-16m,llama-1b-shape] [--tokens 128] [--quick]

For each model: transformers generate (fp32), the ingot IR in torch (fp32) and ingot artifacts
on ONNX Runtime (RTN int4 g32 and int8 per-channel). Each engine runs in its own process: a
short warm-up, then 3 runs of a fixed 32-token prompt with EOS ignored; decode tokens/s (time
to first token excluded and reported apart) is the median. The memory bandwidth measured in the
same run turns the bytes each decode step must read into a bandwidth-bound tokens/s.
Writes benchmarks/results/decode.json and decode.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ingot.pipeline.model.config import ModelConfig

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # sibling helper modules; benchmarks/ is not a package

from bench_models import MODELS, BenchModel, bench_cache_dir, prepare_model  # noqa: E402
from decode_report import write_reports  # noqa: E402
from machine import machine_info, measure_bandwidth  # noqa: E402
from traffic import (  # noqa: E402
    FLOAT32,
    WeightFormat,
    decode_bytes_per_token,
    mean_decode_context,
)

THREADS = 2
RUNS = 3
WARMUP_TOKENS = 16  # enough to page in every weight and warm the allocators
MAX_SEQ_LEN = 512
KV_BLOCK_SIZE = 16
DECODE_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 1500

# ingot ONNX Runtime variants: name -> (layer weights, lm_head weights). lm_head stays float.
ORT_VARIANTS = {
    "int4-g32": (WeightFormat(bits=4, group_size=32), FLOAT32),
    "int8-pc": (WeightFormat(bits=8, group_size=-1), FLOAT32),
}
FLOAT_ENGINES = ("transformers-fp32", "ir-fp32")
REFERENCE_ENGINE = "ir-fp32"  # the other engines' greedy tokens are compared against it


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    models = ["pydoc-16m"] if args.quick else args.models.split(",")
    tokens = 32 if args.quick else args.tokens
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        sys.exit(f"--models: unknown {unknown} (known: {', '.join(MODELS)})")

    started = time.perf_counter()
    machine = machine_info()
    bandwidth = [measure_bandwidth(THREADS)]
    cases = []
    with tempfile.TemporaryDirectory(prefix="ingot-bench-") as tmp:
        for name in models:
            _log(f"model {name}: preparing")
            model = prepare_model(name)
            cases += bench_model(model, tokens, Path(tmp))
    bandwidth.append(measure_bandwidth(THREADS))

    report = _report(machine, bandwidth, cases, tokens, args, time.perf_counter() - started)
    json_path, md_path = write_reports(report, args.out_dir)
    _log(f"wrote {json_path} and {md_path} ({report['wall_s']:.0f} s)")
    print(md_path.read_text())
    return 0


def bench_model(model: BenchModel, tokens: int, tmp: Path) -> list[dict[str, Any]]:
    cfg = ModelConfig.from_dir(model.path)
    context = mean_decode_context(len(model.prompt_ids), tokens)
    cases = []
    for engine in FLOAT_ENGINES:
        load = {"path": str(model.path), "threads": THREADS}
        result = _decode(model, engine, load, tokens, tmp)
        traffic = decode_bytes_per_token(cfg, FLOAT32, FLOAT32, context, kv_bytes=4)
        cases.append(_case(model, engine, None, result, traffic))
    for variant, (layers, lm_head) in ORT_VARIANTS.items():
        built = _build(model, variant, layers, lm_head, tmp)
        if built["ok"]:
            load = {"artifact": built["artifact"]}
            result = _decode(model, "ingot-ort", load, tokens, tmp)
        else:
            result = {"ok": False, "error": f"build failed: {built['error']}"}
        traffic = decode_bytes_per_token(cfg, layers, lm_head, context, kv_bytes=4)
        case = _case(model, "ingot-ort", variant, result, traffic)
        case["build"] = built
        case["graph"] = _graph_summary(built.get("artifact"))
        cases.append(case)
    _compare_tokens(cases)
    return cases


def _decode(model: BenchModel, engine: str, load: dict, tokens: int, tmp: Path) -> dict:
    _log(f"model {model.name}: decoding with {engine} {load}")
    spec = {
        "kind": "decode",
        "engine": engine,
        "load": load,
        "prompt_ids": list(model.prompt_ids),
        "tokens": tokens,
        "warmup_tokens": min(WARMUP_TOKENS, tokens),
        "runs": RUNS,
    }
    return _run_worker(spec, tmp, DECODE_TIMEOUT_S)


def _build(
    model: BenchModel, variant: str, layers: WeightFormat, lm_head: WeightFormat, tmp: Path
) -> dict:
    """Build (or fetch from the benchmark's stage cache) the artifact of one variant."""
    _log(f"model {model.name}: building ingot artifact {variant}")
    recipe = tmp / f"{model.name}-{variant}.yaml"
    recipe.write_text(json.dumps(_recipe(model, variant, layers, lm_head), indent=2))
    spec = {
        "kind": "build",
        "recipe": str(recipe),
        "out": str(bench_cache_dir() / "artifacts" / f"{model.name}-{variant}"),
        "cache": str(bench_cache_dir() / "stage-cache"),
    }
    result = _run_worker(spec, tmp, BUILD_TIMEOUT_S)
    result["recipe"] = json.loads(recipe.read_text())
    return result


def _recipe(model: BenchModel, variant: str, layers: WeightFormat, lm_head: WeightFormat) -> dict:
    quantize = [_quantize_entry(layers, ["re:layers\\..*"])]
    if lm_head.bits is not None:
        quantize.append(_quantize_entry(lm_head, ["lm_head"]))
    else:
        quantize[0]["ignore"] = ["lm_head"]
    return {  # JSON is YAML: the recipe loader reads it as is
        "source": {"path": str(model.path)},
        "quantize": quantize,
        "kv_cache": {"dtype": "fp32", "block_size": KV_BLOCK_SIZE},
        "export": {"max_seq_len": MAX_SEQ_LEN},
        "targets": [
            {
                "engine": "onnxruntime",
                "device": "cpu",
                "optimization_level": "all",
                "intra_op_num_threads": THREADS,
            }
        ],
        "artifact": {"name": f"bench-{model.name}-{variant}", "version": "0.0.0"},
    }


def _quantize_entry(fmt: WeightFormat, targets: list[str]) -> dict:
    return {
        "method": "rtn",
        "bits": fmt.bits,
        "group_size": fmt.group_size,
        "symmetric": fmt.symmetric,
        "targets": targets,
    }


def _run_worker(spec: dict, tmp: Path, timeout_s: float) -> dict:
    """Run one spec in a fresh process; a crash or timeout becomes an error record."""
    spec_file, result_file = tmp / "spec.json", tmp / "result.json"
    spec_file.write_text(json.dumps(spec))
    result_file.unlink(missing_ok=True)
    command = [sys.executable, str(HERE / "decode_engines.py"), str(spec_file), str(result_file)]
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:  # subprocess.run kills the worker it started
        return {"ok": False, "error": f"timed out after {timeout_s} s"}
    if proc.returncode != 0 or not result_file.exists():
        stderr = proc.stderr.strip().splitlines()[-8:]
        return {"ok": False, "error": f"worker exited {proc.returncode}: " + "\n".join(stderr)}
    result = json.loads(result_file.read_text())
    result["wall_s"] = time.perf_counter() - started
    return result


def _case(
    model: BenchModel, engine: str, variant: str | None, result: dict, traffic: dict
) -> dict[str, Any]:
    return {
        "model": model.name,
        "engine": engine,
        "variant": variant,
        "prompt_tokens": len(model.prompt_ids),
        "bytes_per_token": traffic,
        **result,
    }


def _compare_tokens(cases: list[dict[str, Any]]) -> None:
    """Greedy agreement with the fp32 IR: how many leading tokens are identical."""
    reference = next((c for c in cases if c["engine"] == REFERENCE_ENGINE and c["ok"]), None)
    for case in cases:
        if reference is None or not case["ok"]:
            case["tokens_match_ir"] = None
            continue
        same = 0
        for a, b in zip(case["tokens"], reference["tokens"], strict=False):
            if a != b:
                break
            same += 1
        case["tokens_match_ir"] = {"leading_identical": same, "of": len(reference["tokens"])}


def _graph_summary(artifact: str | None) -> dict[str, Any] | None:
    """Op types of the exported graph and of the graph ORT optimized at build time."""
    if artifact is None:
        return None
    import onnx

    root = Path(artifact)
    summary = {}
    for name, path in (
        ("exported", root / "model.onnx"),
        ("onnxruntime_optimized", root / "engines" / "onnxruntime-cpu" / "model.onnx"),
    ):
        if not path.is_file():
            summary[name] = None
            continue
        graph = onnx.load(str(path), load_external_data=False).graph
        dtypes = Counter(onnx.TensorProto.DataType.Name(t.data_type) for t in graph.initializer)
        summary[name] = {
            "op_types": dict(sorted(Counter(n.op_type for n in graph.node).items())),
            "initializer_dtypes": dict(sorted(dtypes.items())),
        }
    return summary


def _report(
    machine: dict, bandwidth: list[dict], cases: list[dict], tokens: int, args, wall_s: float
) -> dict[str, Any]:
    best = max(bandwidth, key=lambda b: b["bytes_per_s"])
    for case in cases:
        bound = best["bytes_per_s"] / case["bytes_per_token"]["total"]
        case["bound_tokens_per_s"] = bound
        case["achieved_over_bound"] = case["tokens_per_s"] / bound if case["ok"] else None
    return {
        "benchmark": "decode",
        "settings": {
            "batch": 1,
            "greedy": True,
            "ignore_eos": True,
            "new_tokens": tokens,
            "warmup_tokens": min(WARMUP_TOKENS, tokens),
            "runs": RUNS,
            "statistic": "median",
            "threads": THREADS,
            "export_max_seq_len": MAX_SEQ_LEN,
            "kv_block_size": KV_BLOCK_SIZE,
            "quick": args.quick,
        },
        "machine": machine,
        "bandwidth": {"runs": bandwidth, "bytes_per_s": best["bytes_per_s"]},
        "cases": cases,
        "wall_s": wall_s,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per run")
    parser.add_argument("--quick", action="store_true", help="pydoc-16m only, 32 tokens")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    return parser.parse_args(argv)


def _log(message: str) -> None:
    print(f"[decode] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
