"""Resident memory at batch 1 against what the engine must hold (issue 27's memory row): the
weights the engine reads plus the KV pool the load allocates.

    .venv/bin/python -m benchmarks.decode.resident     # writes benchmarks/results/resident.*

Options: [--model llama-1b-shape|pydoc-16m] [--threads 2] [--tokens 128] [--models-dir DIR]
[--eval-text FILE] [--out-dir DIR] [--report-only].

The decode benchmarks' artifact with both engines (decode/artifact.py: RTN int4 g32 symmetric,
lm_head included, KV fp32 in the 32-token blocks OpenVINO runs; ONNX Runtime's target first),
loaded once per engine, each in a fresh process, with a pool for one sequence of the model's
full context; then a 32-token prompt and `--tokens` greedy tokens. Per engine:

- weights: the bytes of the files the engine reads (the record's graph and its external data:
  ONNX Runtime's optimized graph, or the portable graph OpenVINO rebuilds the decoder from);
  the embedding table is one of them (fp32 here: the recipe quantizes linears only);
- KV: the pool's arrays (K and V of every layer; OpenVINO's u8 form would count its scales);
- RSS after the load, after generating, and the peak (VmHWM), and RSS after glibc's
  malloc_trim once the load is done (what the process holds vs what its heap kept);
- KV bytes per token: the pool's bytes over its token slots, against the fp32 layout's
  layers x 2 x kv heads x head_dim x 4 (the dtype's size "today").

Target (issue 27): resident memory <= 1.15x (weights + KV). Nothing here is timed, so the
host's load is recorded but never refuses the run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.decode.artifact import OPENVINO, DecodeArtifact, build_spec
from benchmarks.decode.artifact import WORKER as BUILD_WORKER
from benchmarks.decode.models import prepare_model
from benchmarks.harness.launch import WorkerFailed, run_worker, worker_main
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info, memory_status
from benchmarks.harness.paths import RESULTS, data_dir, models_dir
from benchmarks.harness.report import add_report_only, publish, rerender

STEM = "resident"
WORKER = "benchmarks.decode.resident"  # this module, run as a worker per engine
ENGINES = ("onnxruntime", OPENVINO)
TARGET = 1.15  # resident <= 1.15x (weights + KV)
PROMPT_TOKENS = 32
TIMEOUT_S = 1800
_MIB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, markdown)
    watch = LoadWatch(args.threads, timed=False)
    model = prepare_model(args.model, args.models_dir, args.eval_text)
    report: dict[str, Any] = {"machine": machine_info(), "model": args.model}
    report["settings"] = {"threads": args.threads, "tokens": args.tokens, "prompt": PROMPT_TOKENS}
    with tempfile.TemporaryDirectory(prefix="ingot-resident-") as tmp_dir:
        tmp = Path(tmp_dir)
        shape = DecodeArtifact(block_size=32, openvino=True)
        spec = build_spec(model, tmp, args.threads, [], shape)
        built = run_worker(BUILD_WORKER, spec, tmp, TIMEOUT_S)
        if not built.get("ok"):
            raise SystemExit(f"the ingot build failed: {built.get('error')}")
        prompt = model.prompts(1, PROMPT_TOKENS)[0]
        report["engines"] = {}
        for engine in ENGINES:
            spec = {"artifact": built["artifact"], "engine": engine, "prompt": prompt}
            spec["tokens"] = args.tokens
            try:
                report["engines"][engine] = run_worker(WORKER, spec, tmp, TIMEOUT_S)
            except WorkerFailed as e:
                report["engines"][engine] = {"ok": False, "error": str(e)}
            watch.sample()
    report["load"] = watch.record()
    return publish(report, args.out_dir, STEM, markdown)


# ----------------------------------------------------------------------------- the worker


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One engine's load and generation in this (fresh) process, and its memory."""
    from ingot.artifacts import read_manifest
    from ingot.runtime import LoadedModel, SamplingParams
    from ingot.runtime.server.heap import give_back_freed_memory

    root = Path(spec["artifact"])
    manifest = read_manifest(root)
    config = manifest.model
    loaded = LoadedModel.load(
        root,
        engine=spec["engine"],
        kv_cache_bytes=_one_sequence_bytes(manifest),
        max_num_seqs=1,
    )
    out: dict[str, Any] = {"ok": True, "rss_loaded_bytes": _rss()}
    give_back_freed_memory()
    out["rss_loaded_trimmed_bytes"] = _rss()
    generator = loaded.generator()
    params = SamplingParams(max_tokens=spec["tokens"], temperature=0.0, ignore_eos=True)
    request = generator.add(spec["prompt"], params)
    while generator.has_unfinished():
        generator.step()
    out["generated"] = len(generator.pop_completion(request).token_ids)
    out["rss_generated_bytes"] = _rss()
    out["peak_rss_bytes"] = memory_status()["peak_rss_bytes"]
    engine = loaded.engine
    out["engine_name"] = engine.name
    out["weights_bytes"] = sum(f.size for f in manifest.files if f.path.startswith(engine.path))
    out["weight_files"] = [f.path for f in manifest.files if f.path.startswith(engine.path)]
    pool = loaded.pool
    out["kv_bytes"] = sum(a.nbytes for a in pool.k + pool.v)  # the scratch block included
    out["kv_tokens"] = pool.allocator.num_blocks * pool.block_size
    out["kv_bytes_per_token"] = out["kv_bytes"] / (out["kv_tokens"] + pool.block_size)
    elements = config.num_layers * 2 * config.num_kv_heads * config.head_dim
    out["fp32_kv_bytes_per_token"] = elements * 4
    out["int8_kv_bytes_per_token"] = elements  # ONNX Runtime's int8 pool: a byte per element
    if spec["engine"] == OPENVINO:
        out["u8_kv_bytes_per_token"] = _openvino_u8_bytes_per_token(manifest)
    return out


def _openvino_u8_bytes_per_token(manifest: Any) -> float:
    """KV bytes per token of OpenVINO's u8 form (its scales and zero points inside the blocks),
    from the engine's own layout: what an int8 recipe's pool holds on that engine."""
    from ingot.runtime.engines.openvino.layout import kv_layout

    layout = kv_layout(manifest.graph, "u8")
    k_block, v_block = layout.block_shapes
    per_block = sum(int(np.prod(shape)) for shape in (k_block, v_block))  # bytes: u8
    return layout.num_layers * per_block / layout.block_size


def _one_sequence_bytes(manifest: Any) -> int:
    """A pool for one sequence of the model's whole context, at fp32 (the recipe's dtype)."""
    m = manifest.model
    return m.max_seq_len * m.num_layers * 2 * m.num_kv_heads * m.head_dim * 4


def _rss() -> int:
    return memory_status()["rss_at_exit_bytes"]  # VmRSS: the current resident set


# ----------------------------------------------------------------------------- the report


def markdown(r: dict[str, Any]) -> str:
    s = r["settings"]
    lines = [
        "# Resident memory at batch 1: each ingot engine against its weights + KV",
        "",
        f"Generated by `benchmarks/decode/resident.py` on {r['machine']['date']}. Model "
        f"{r['model']} (RTN int4 g32 symmetric, lm_head included, embedding fp32; KV fp32, "
        f"blocks of 32), a pool for one full-length sequence, a {s['prompt']}-token prompt and "
        f"{s['tokens']} greedy tokens, {s['threads']} threads, each engine in a fresh process.",
        "",
        "| engine | weights MiB | KV MiB | RSS loaded | after malloc_trim | after generating | "
        "peak | peak / (weights + KV) | target | KV B/token (fp32 layout) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for engine, e in r["engines"].items():
        if not e.get("ok"):
            lines.append(f"| {engine} | failed: {e.get('error')} |||||||||")
            continue
        need = e["weights_bytes"] + e["kv_bytes"]
        ratio = e["peak_rss_bytes"] / need
        met = "met" if ratio <= TARGET else "**missed**"
        lines.append(
            f"| {engine} | {e['weights_bytes'] / _MIB:.0f} | {e['kv_bytes'] / _MIB:.0f} | "
            f"{e['rss_loaded_bytes'] / _MIB:.0f} | {e['rss_loaded_trimmed_bytes'] / _MIB:.0f} | "
            f"{e['rss_generated_bytes'] / _MIB:.0f} | {e['peak_rss_bytes'] / _MIB:.0f} | "
            f"{ratio:.2f} | <= {TARGET} {met} | {e['kv_bytes_per_token']:.0f} "
            f"({e['fp32_kv_bytes_per_token']}) |"
        )
    ov = r["engines"].get(OPENVINO, {})
    if ov.get("u8_kv_bytes_per_token"):
        lines += [
            "",
            f"KV bytes per token with `kv_cache.dtype: int8`: ONNX Runtime's int8 pool "
            f"{ov['int8_kv_bytes_per_token']} (a byte per element, per-head scales apart), "
            f"OpenVINO's u8 form {ov['u8_kv_bytes_per_token']:.0f} (each block's scales and "
            f"zero points inside it): "
            f"{ov['u8_kv_bytes_per_token'] / ov['int8_kv_bytes_per_token']:.2f}x.",
        ]
    lines += [
        "",
        "Weights: the files the engine reads ("
        + "; ".join(f"{k}: {', '.join(e.get('weight_files', []))}" for k, e in r["engines"].items())
        + ").",
    ]
    samples = (r.get("load") or {}).get("load_1min_samples") or []
    if samples:
        lines.append(f"Host load (untimed, recorded): max {max(samples):.1f}.")
    return "\n".join(lines) + "\n"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", choices=("llama-1b-shape", "pydoc-16m"), default="llama-1b-shape"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--models-dir", type=Path, default=models_dir(), metavar="DIR")
    parser.add_argument("--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, metavar="DIR")
    add_report_only(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1].endswith(".json"):
        worker_main(measure)
    else:
        sys.exit(main())
