"""Serving with each engine (issue 27's HTTP row): `ingot serve` on its ONNX Runtime engine
and on its OpenVINO engine, `vllm serve`, llama.cpp's `llama-server` with 32 parallel slots and
OpenVINO GenAI's continuous batching, 32 concurrent streams of new prompts, in rounds.

Reproduce (on a quiet host: a run whose load exceeds --threads is refused, exit 1):

    benchmarks/peers/setup.sh vllm openvino-genai     # the peers' virtualenvs, once
    benchmarks/peers/llama-server.sh                  # llama.cpp's server, built once
    .venv/bin/python -m benchmarks.serve.http_engines # writes benchmarks/results/serve_engines.*

Options: [--requests 32] [--output-len 64] [--rounds 3] [--threads 2] [--settle-s 10]
[--settle-max-s 120] [--models-dir DIR] [--eval-text FILE] [--vllm-python PATH]
[--ovgenai-python PATH] [--llama-server PATH] [--out-dir DIR] [--report-only].

Weights: the serve benchmark's (serve.py): RTN int4 g32 symmetric on every linear, lm_head
included, built by ingot once for both of its engines (one artifact, targets ONNX Runtime and
OpenVINO, KV fp32 in the 32-token blocks OpenVINO's CPU plugin runs) and written by the same
build as GGUF (`interop: [gguf]`: Q4_0, the same codes and scales) for llama.cpp; vLLM serves
serve.py's compressed-tensors export (lm_head float: vLLM loads no quantized lm_head from it);
OpenVINO GenAI runs optimum-intel's own int4 g32 symmetric export of the checkpoint with the
plugin's defaults (bf16 inference, u8 KV, int8 dynamic quantization), as the decode benchmark
does. OpenVINO GenAI ships no HTTP server (OpenVINO Model Server is not on PyPI), so its row is
its in-process ContinuousBatchingPipeline with every request added at once: no HTTP, no
tokenizer, no client, a ceiling the HTTP servers are compared against.

Each round runs every system in turn (the order rotated per round, rounds.head_to_head), a
fresh server each time, serving the burst twice: prompts it has not seen (the issue's row),
then the same again (prefix caches: ingot's and vLLM's block caches, llama.cpp's per-slot
prompt cache). The ratios are each ingot engine's over each peer's in the same round, medians
over rounds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.decode.decode import kv_bytes_per_token
from benchmarks.decode.models import BenchModel, prepare_model
from benchmarks.decode.peers import OPENVINO_GENAI, export_openvino_genai
from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch, SettledWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import REPO, RESULTS, data_dir, models_dir, peer_python
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.serve.builds import (
    VLLM,
    VLLM_DISTRIBUTION,
    bench_recipe,
    build_ingot,
    build_vllm_export,
    log,
)
from benchmarks.serve.http_report import STEM, markdown, strip_timings
from benchmarks.serve.rounds import OURS, PHASES, head_to_head, paired_bursts
from benchmarks.serve.serve import ingot_server, server_burst, vllm_server
from benchmarks.serve.server import ServerProcess, free_port, llama_server_command
from benchmarks.serve.workload import make_prompts

MODEL = "pydoc-16m"  # serve.py's; its 256 MiB KV cache holds the burst without preempting
OPENVINO_OURS = "ingot serve --engine openvino"
LLAMA_SERVER = "llama.cpp server"
OVGENAI = "OpenVINO GenAI (in process)"
VLLM_SERVE = "vllm serve"
PEERS = (VLLM_SERVE, LLAMA_SERVER, OVGENAI)
BLOCK_SIZE = 32  # OpenVINO's CPU plugin runs 32-token blocks; both engines share the pool layout
PROMPT_LENS = (64, 256)
DEFAULT_THREADS = 2
WORKER_TIMEOUT_S = 900


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, markdown)
    started = time.perf_counter()
    loads = SettledWatch(LoadWatch(args.threads), args.settle_s, args.settle_max_s)
    report: dict[str, Any] = {"machine": machine_info(), "config": _config(args)}
    with tempfile.TemporaryDirectory(prefix="ingot-serve-engines-") as tmp_dir:
        tmp = Path(tmp_dir)
        bursts, report["builds"] = _systems(args, tmp)
        report["head_to_head"] = head_to_head(bursts, args.rounds, loads.around, log)
        report["head_to_head"]["openvino_ratios"] = _ratios_of(
            OPENVINO_OURS, report["head_to_head"]["runs"]
        )
    refusal = loads.finish()
    report["load"] = loads.watch.record()
    if refusal is not None:
        report["refused"] = refusal
    report["wall_s"] = time.perf_counter() - started
    log(f"done in {report['wall_s']:.0f} s")
    return publish(strip_timings(report), args.out_dir, STEM, markdown)


def _systems(
    args: argparse.Namespace, tmp: Path
) -> tuple[dict[str, Callable[[], dict[str, Any]]], dict[str, Any]]:
    """Every system's burst (serve.server_burst: the burst twice, new then repeated prompts)
    and the builds' records; a peer whose build or binary is missing is left out, its reason
    recorded."""
    model = prepare_model(MODEL, args.models_dir, args.eval_text)
    args.model = model.path  # serve.py's builds and servers read args.model
    prompts = make_prompts(
        model.path / "tokenizer.json", args.eval_text, args.requests, *PROMPT_LENS
    )
    builds: dict[str, Any] = {}
    log("building the ingot artifact (ONNX Runtime and OpenVINO targets, GGUF for llama.cpp)")
    builds["ingot"], artifact = build_ingot(tmp, "artifact", _ingot_recipe(args))
    if artifact is None:
        raise SystemExit(f"the ingot build failed: {builds['ingot']['error']}")
    bursts: dict[str, Callable[[], dict[str, Any]]] = {
        OURS: lambda: server_burst(
            *ingot_server(artifact, args, tmp, "onnxruntime"), prompts, args
        ),
        OPENVINO_OURS: lambda: server_burst(
            *ingot_server(artifact, args, tmp, "openvino"), prompts, args
        ),
    }
    builds["vllm"], vllm_dir = build_vllm_export(tmp, args)
    if vllm_dir is not None:
        bursts[VLLM_SERVE] = lambda: server_burst(
            *vllm_server(vllm_dir, args, tmp)[:2], prompts, args
        )
    gguf = sorted((artifact / "interop" / "gguf").glob("*.gguf"))
    builds["llama_server"] = _llama_server_record(args.llama_server, gguf)
    if builds["llama_server"]["ok"]:
        bursts[LLAMA_SERVER] = lambda: server_burst(
            *_llama_server(args, gguf[0], tmp), prompts, args
        )
    builds["openvino_genai"], ov_dir = export_openvino_genai(
        model, args.ovgenai_python, WORKER_TIMEOUT_S
    )
    if ov_dir is not None:
        job = _ovgenai_job(model, ov_dir, prompts, args)
        # No prefix cache in the runner (prefill every prompt): both phases are one run.
        bursts[OVGENAI] = lambda: dict.fromkeys(PHASES, _worker(job, tmp, args.ovgenai_python))
    return bursts, builds


def _ingot_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """serve.py's recipe with both engines (ONNX Runtime first, as serve.py builds it) in
    OpenVINO's block size, and the GGUF export of the same weights."""
    recipe = bench_recipe(args)
    recipe["kv_cache"]["block_size"] = BLOCK_SIZE
    openvino = {"engine": "openvino", "device": "cpu", "inference_precision": "f32"}
    # int8 activations in the int4 matmuls, as ONNX Runtime's MatMulNBits accuracy level 4.
    openvino |= {"dynamic_quantization": True, "num_threads": args.threads}
    recipe["targets"].append(openvino)
    recipe["interop"] = ["gguf"]
    return recipe


def _llama_server_record(binary: Path, gguf: list[Path]) -> dict[str, Any]:
    if not binary.exists():
        return {"ok": False, "error": f"no {binary}: run benchmarks/peers/llama-server.sh"}
    if not gguf:
        return {"ok": False, "error": "the ingot build wrote no GGUF"}
    return {"ok": True, "binary": str(binary), "gguf": gguf[0].name}


def _llama_server(args: argparse.Namespace, gguf: Path, tmp: Path) -> tuple[ServerProcess, str]:
    """llama-server on a free port (not started): a slot per request, each slot holding the
    longest prompt and its output."""
    port = free_port()
    command, _ = llama_server_command(
        args.llama_server,
        gguf,
        port,
        threads=args.threads,
        slots=args.requests,
        ctx_per_slot=PROMPT_LENS[1] + args.output_len + 16,
    )
    return ServerProcess(command, tmp / "llama-server.log"), f"http://127.0.0.1:{port}"


def _ovgenai_job(model: BenchModel, model_dir: Path, prompts: list[list[int]], args) -> dict:
    return {
        "engine": "ovgenai-continuous",
        "model_dir": str(model_dir),
        "prompts": prompts,
        "output_len": args.output_len,
        "threads": args.threads,
        "kv_bytes_per_token": kv_bytes_per_token(model, OPENVINO_GENAI),  # its u8 KV
    }


def _worker(spec: dict[str, Any], tmp: Path, python: Path) -> dict[str, Any]:
    try:
        return run_worker("benchmarks.serve.engines", spec, tmp, WORKER_TIMEOUT_S, python)
    except WorkerFailed as e:
        return {"ok": False, "error": str(e)}


def _ratios_of(ours: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """`ours`'s paired ratios over every other system's bursts, per phase (head_to_head's
    `ratios` are OURS's)."""
    if ours not in runs:
        return {}
    return {
        phase: {
            name: paired_bursts([r[phase] for r in runs[ours]], [r[phase] for r in runs[name]])
            for name in runs
            if name != ours
        }
        for phase in PHASES
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--settle-max-s", type=float, default=120.0)
    parser.add_argument("--models-dir", type=Path, default=models_dir(), metavar="DIR")
    parser.add_argument(
        "--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt", metavar="FILE"
    )
    parser.add_argument("--vllm-python", type=Path, default=peer_python(VLLM), metavar="PATH")
    parser.add_argument(
        "--ovgenai-python", type=Path, default=peer_python(OPENVINO_GENAI), metavar="PATH"
    )
    parser.add_argument(
        "--llama-server",
        type=Path,
        default=REPO / "benchmarks" / ".venvs" / "llama-server" / "bin" / "llama-server",
        metavar="PATH",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS, metavar="DIR")
    add_report_only(parser)
    return parser.parse_args(argv)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": MODEL,
        "requests": args.requests,
        "output_len": args.output_len,
        "prompt_lens": PROMPT_LENS,
        "rounds": args.rounds,
        "threads": args.threads,
        "kv_block_size": BLOCK_SIZE,
        "vllm": VLLM_DISTRIBUTION,
        "quantization": "RTN int4 g32 symmetric, every linear incl. lm_head (vLLM: lm_head "
        "float); OpenVINO GenAI: optimum-intel int4 g32 symmetric",
    }


if __name__ == "__main__":
    sys.exit(main())
