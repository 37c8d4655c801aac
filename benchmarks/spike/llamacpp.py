"""Issue 27's llama.cpp route: ingot's weights as the GGUF its `gguf` interop format writes
(Q4_0 blocks holding the same int4 g32 symmetric codes), run by llama.cpp through
llama-cpp-python's batch API, against ingot's ONNX Runtime engine on the same artifact, in the
same run.

Reproduce (llama-cpp-python 0.3.36 in ingot's virtualenv or benchmarks/.venvs/llama-cpp:
`benchmarks/peers/setup.sh llama-cpp`; each part merges into
benchmarks/results/spike_llamacpp.json, so a long run can be split):

    .venv/bin/python -m benchmarks.spike.llamacpp \
        [--models pydoc-16m llama-1b-shape] [--parts check batch1 batched long]
        [--engines ingot llama.cpp llama.cpp-q8kv onnxruntime-ggml] [--rounds 3]
        [--llama-cpp-python PY] [--ort-ggml-python PY] [--threads 2] [--out-dir DIR]
        [--models-dir DIR] [--eval-text FILE] [--report-only]

Parts: `check` (llamacpp_kv.py: prefix sharing by seq_cp, speculation rollback by seq_rm,
preemption by saving and restoring a sequence's state, q8_0 KV, the hidden row beside the
logits; untimed) and cases.py's timed `batch1`, `batched`, `long`. Engines, each in its own
process (llamacpp_worker.py): `ingot` (the artifact's ONNX Runtime engine through ingot's
Generator: MatMulNBits, int8 activations, fp32 KV), `llama.cpp` (f16 KV, llama.cpp's
defaults), `llama.cpp-q8kv` (q8_0 K and V), `onnxruntime-ggml` (ingot's engine with the
onnxruntime-ggml provider first, in that package's virtualenv: ort_ggml.py; only with
--ort-ggml-python).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.decode.artifact import find_gguf
from benchmarks.decode.models import MODELS, BenchModel
from benchmarks.harness.machine import _version, machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python, peer_version
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.spike.cases import (
    decode_spec,
    measure_parts,
    previous_report,
    run_case,
    run_job,
)
from benchmarks.spike.llamacpp_report import markdown

STEM = "spike_llamacpp"
WORKER = "benchmarks.spike.llamacpp_worker"
PARTS = ("check", "batch1", "batched", "long")
ENGINES = {  # name -> the worker's engine and its load settings
    "ingot": ("ingot", {}),
    "llama.cpp": ("llama.cpp", {}),
    "llama.cpp-q8kv": ("llama.cpp", {"kv_type": "q8_0"}),
    "onnxruntime-ggml": ("onnxruntime-ggml", {}),
}
DEFAULT_ENGINES = ["ingot", "llama.cpp", "llama.cpp-q8kv"]


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, markdown)
    report = previous_report(
        args.out_dir, STEM, {k: {"worker_engine": e, **s} for k, (e, s) in ENGINES.items()}
    )
    report["machine"] = machine_info()
    report["versions"] = _versions(args)
    measure_parts(
        report,
        args,
        ["gguf"],
        lambda model, artifact, tmp: _check(model, artifact, args, tmp),
        lambda model, artifact, part, tmp, watch: _case(model, artifact, part, args, tmp, watch),
    )
    return publish(report, args.out_dir, STEM, markdown)


def _versions(args: argparse.Namespace) -> dict[str, Any]:
    llama = args.llama_cpp_python or Path(sys.executable)
    out = {
        "ingot venv": {"onnxruntime": _version("onnxruntime")},
        "llama.cpp python": {"llama-cpp-python": peer_version(llama, "llama-cpp-python")},
    }
    if args.ort_ggml_python:
        names = ("onnxruntime-ggml", "onnxruntime")
        out["onnxruntime-ggml venv"] = {d: peer_version(args.ort_ggml_python, d) for d in names}
    return out


def _case(
    model: BenchModel, artifact: str, part: str, args: argparse.Namespace, tmp: Path, watch
) -> dict[str, Any]:
    engines = [e for e in args.engines if e != "onnxruntime-ggml" or args.ort_ggml_python]

    def job(engine: str, prompts: list[list[int]], tokens: int, ctx: int) -> dict[str, Any]:
        kind, settings = ENGINES[engine]
        load = {"batch": len(prompts), "ctx_per_seq": ctx, "threads": args.threads}
        load |= {"batched_tokens": sum(map(len, prompts)), **settings}
        python = None
        if kind == "llama.cpp":
            load["gguf"] = str(find_gguf(artifact))
            python = args.llama_cpp_python
        else:
            load["artifact"] = artifact
            python = args.ort_ggml_python if kind == "onnxruntime-ggml" else None
        result = run_job(WORKER, decode_spec(kind, load, prompts, tokens), tmp, python)
        watch.sample()
        return result

    return run_case(model, artifact, part, engines, args.rounds, job)


def _check(model: BenchModel, artifact: str, args: argparse.Namespace, tmp: Path) -> dict:
    spec = {
        "kind": "kv_check",
        "gguf": str(find_gguf(artifact)),
        "threads": args.threads,
        "prompt": list(model.prompt_ids),
        "other": model.prompts(1, len(model.prompt_ids))[0],
    }
    return run_job(WORKER, spec, tmp, args.llama_cpp_python)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=DEFAULT_ENGINES)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--llama-cpp-python",
        type=Path,
        default=_llama_cpp_python(),
        help="an interpreter with llama-cpp-python (default: %(default)s)",
    )
    parser.add_argument(
        "--ort-ggml-python",
        type=Path,
        help="an interpreter with onnxruntime-ggml and this repository (ort_ggml.py)",
    )
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


def _llama_cpp_python() -> Path | None:
    """The llama-cpp peer's virtualenv when it exists, else None: this interpreter."""
    python = peer_python("llama-cpp")
    return python if peer_version(python, "llama-cpp-python") else None


if __name__ == "__main__":
    raise SystemExit(main())
