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
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.decode.models import MODELS, PROMPT_LEN, BenchModel, prepare_model
from benchmarks.decode.rounds import merge_rounds
from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python, peer_version
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.harness.rounds import interleave
from benchmarks.spike.openvino_report import markdown, pair_with_ingot

STEM = "spike_openvino"
WORKER = "benchmarks.spike.openvino_worker"
PARTS = ("check", "batch1", "batched", "long")
ENGINES = {  # name -> the worker's engine and its OpenVINO settings
    "ingot": {},
    "openvino-f32": {"precision": "f32", "kv": "f32", "dyn_quant": 32},
    "openvino": {"precision": "bf16", "kv": "u8", "dyn_quant": 32},
}
CASES = {  # part -> (sequences, prompt tokens or None for the long one, new tokens)
    "batch1": (1, PROMPT_LEN, 128),
    "batched": (32, PROMPT_LEN, 64),
    "long": (1, None, 128),
}
LONG_CONTEXT = 4096
WARMUP_TOKENS = 4
TIMEOUT_S = 1800


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, markdown)
    report = _previous(args.out_dir)
    watch = LoadWatch(args.threads)
    report["machine"] = machine_info()
    report["versions"] = _versions()
    models = report.setdefault("models", {})
    with tempfile.TemporaryDirectory(prefix="spike-openvino-") as tmp:
        for name in args.models:
            model = prepare_model(name, args.models_dir, args.eval_text)
            entry = models.setdefault(name, {})
            _log(f"{name}: building the artifact")
            from benchmarks.spike.ov_artifacts import build_artifact

            built = build_artifact(model, Path(tmp), args.threads)
            entry["artifact"] = {k: built.get(k) for k in ("ok", "artifact", "error", "seconds")}
            if not built.get("ok"):
                continue
            for part in args.parts:
                _log(f"{name}: {part}")
                case_watch = LoadWatch(args.threads, timed=part != "check")  # untimed
                if part == "check":
                    entry["check"] = _check(model, built["artifact"], args, Path(tmp))
                else:
                    case = _case(model, built["artifact"], part, args, Path(tmp), case_watch)
                    entry.setdefault("cases", {})[part] = case
                case_watch.sample()
                entry.setdefault("loads", {})[part] = case_watch.record()
                entry.setdefault("refused", {})[part] = case_watch.refusal()
                watch.samples += case_watch.samples
    # Every part's samples, this run's and the kept ones': the report's load line covers it all.
    samples = [
        v
        for e in models.values()
        for r in e.get("loads", {}).values()
        for v in r["load_1min_samples"]
    ]
    report["load"] = watch.record() | {"load_1min_samples": samples}
    refused = [
        f"{m}/{p}: {why}"
        for m, e in models.items()
        for p, why in e.get("refused", {}).items()
        if why
    ]
    report["refused"] = "; ".join(refused) or None
    return publish(report, args.out_dir, STEM, markdown)


def _previous(out_dir: Path) -> dict[str, Any]:
    """The report so far: each run replaces the parts it measured and keeps the others."""
    path = out_dir / f"{STEM}.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report.pop("command", None)
    report["benchmark"] = STEM
    report["settings"] = {
        "long_context": LONG_CONTEXT,
        "warmup_tokens": WARMUP_TOKENS,
        "cases": {k: list(v) for k, v in CASES.items()},
        "engines": ENGINES,
    }
    return report


def _versions() -> dict[str, Any]:
    python = peer_python("openvino")
    out = {d: peer_version(python, d) for d in ("openvino", "onnxruntime", "numpy")}
    from benchmarks.harness.machine import _version

    return {"openvino venv": out, "ingot venv": {"onnxruntime": _version("onnxruntime")}}


def _long_prompt(model: BenchModel, artifact: str) -> list[int]:
    max_seq_len = json.loads((Path(artifact) / "manifest.json").read_text())["model"]
    context = min(LONG_CONTEXT, max_seq_len["max_seq_len"])
    return model.prompts(1, context - CASES["long"][2])[0]


def _case(
    model: BenchModel, artifact: str, part: str, args: argparse.Namespace, tmp: Path, watch
) -> dict[str, Any]:
    sequences, prompt_len, tokens = CASES[part]
    if prompt_len is None:
        prompts = [_long_prompt(model, artifact)]
    elif sequences == 1:
        prompts = [list(model.prompt_ids)]
    else:
        prompts = model.prompts(sequences, prompt_len)
    ctx = max(map(len, prompts)) + tokens + 1

    def run(engine: str, _: int) -> dict[str, Any]:
        settings = ENGINES[engine]
        load = {"artifact": artifact, "batch": len(prompts), "ctx_per_seq": ctx}
        load["batched_tokens"] = sum(map(len, prompts))
        if settings:
            load |= {"threads": args.threads, **settings}
        spec = {
            "kind": "decode",
            "engine": "openvino" if settings else "ingot",
            "load": load,
            "prompts": prompts,
            "tokens": tokens,
            "warmup_tokens": WARMUP_TOKENS,
            "runs": 1,
            "budget_s": TIMEOUT_S,
            "reduced_budget_s": TIMEOUT_S / 2,
        }
        python = peer_python("openvino") if settings else None
        result = _worker(spec, tmp, python)
        watch.sample()
        _log(f"  {engine}: {result.get('tokens_per_s') or result.get('error')}")
        return result

    rounds = interleave(list(args.engines), args.rounds, run)
    engines = {name: merge_rounds(r) for name, r in rounds.items()}
    pair_with_ingot(engines)
    prompt_lens = sorted({len(p) for p in prompts})
    return {"sequences": len(prompts), "prompt_tokens": prompt_lens, "new_tokens": tokens} | {
        "engines": engines
    }


def _check(model: BenchModel, artifact: str, args: argparse.Namespace, tmp: Path) -> dict:
    spec = {
        "kind": "check",
        "artifact": artifact,
        "threads": args.threads,
        "greedy_prompt": list(model.prompt_ids),
        "greedy_tokens": 32,
        "configs": {k: v for k, v in ENGINES.items() if v},
    }
    return _worker(spec, tmp, peer_python("openvino"))


def _worker(spec: dict, tmp: Path, python: Path | None) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        result = run_worker(WORKER, spec, tmp, TIMEOUT_S, python)
    except WorkerFailed as e:
        return {"ok": False, "error": str(e)}
    result["wall_s"] = time.perf_counter() - started
    result["load_1min_after"] = os.getloadavg()[0]
    return result


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


def _log(message: str) -> None:
    print(f"[spike_openvino] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
