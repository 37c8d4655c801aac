"""A quantized KV cache: perplexity, bytes per token and sequences per KV budget of fp32, fp16,
int8 and fp8 (E4M3FN) KV pools, each through the engine that ships.

Reproduce (half an hour on 2 cores shared with other work, most of it the scheduler runs; no
timing is reported, so other work on the host changes nothing but the duration; writes
benchmarks/results/kv_cache.json and kv_cache.md):

    .venv/bin/python -m benchmarks.quantize.kv_cache

Options: [--models-dir DIR] [--calib-text FILE] [--eval-text FILE] [--samples 128]
[--max-windows N] [--budget-mib 64] [--seq-len 512] [--no-run] [--out-dir DIR] [--report-only]

- Model: ../shared/models/pydoc-16m, weights float (no quantize entry: the only rounding is
  the KV cache's), export.max_seq_len = --seq-len, blocks of 16, ONNX Runtime CPU at level
  `extended`. One artifact per kv_cache.dtype, built by `ingot.build` from recipes that differ
  in nothing else, into the benchmark cache (<bench-cache>/kv_cache).
- Calibration (int8, fp8): the recipe's `calibration` section, the windows
  benchmarks/quantize/quantize.py uses: 128 windows of 512 tokens of ../shared/data/pydoc-calib.txt
  drawn by ingot's sampler with seed 0. The per-head K/V scales are calibrated on them in the
  export stage; the manifest records them.
- Perplexity: ../shared/data/pydoc-eval.txt (held out of training) as consecutive windows of
  256 tokens, quantize.py's evaluation windows (scoring.py), each scored through the engine as
  the evaluate stage does (`pipeline/evaluate/engine.py`: the runtime's KVPool, build_inputs and
  EngineSession; one prefill call per window, whose tokens attend to their own K/V as the pool
  stores them: rounded to the pool's dtype). Deltas are relative to the fp32 pool's
  perplexity; targets: int8 <= +0.5%, fp8 <= +1%.
- Memory: KV bytes per token (every layer, K and V) from the loaded pool; sequences of
  --seq-len tokens a `--kv-cache-memory` of --budget-mib holds (the pool LoadedModel.load
  sizes from that budget, as `ingot serve --kv-cache-memory` does, prefix caching off).
- Scheduler (unless --no-run): the capacity is checked by running it. `capacity` requests
  whose prompt + output is exactly --seq-len tokens (64-token prompts of the eval text, greedy,
  EOS ignored) run with no preemption; `capacity + 1` need one (the scheduler admits them all,
  then preempts when the pool runs out). max_num_seqs is above both, so only the KV pool
  limits them. Reported: the most sequences running at once, preemptions, and whether each
  request still produced all of its tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, bench_cache_dir, data_dir, models_dir
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.quantize.scoring import eval_windows, evaluation  # windows of 256

STEM = "kv_cache"
DTYPES = ("fp32", "fp16", "int8", "fp8")
TARGETS = {"int8": 0.5, "fp8": 1.0}  # max perplexity increase over fp32's, percent
BLOCK_SIZE = 16
PROMPT_TOKENS = 64


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    # No timing is reported: the load only explains the duration, and never refuses the run.
    watch = LoadWatch(len(os.sched_getaffinity(0)), timed=False)
    started = time.perf_counter()
    model = args.models_dir / "pydoc-16m"
    windows, eval_digest = eval_windows(model, args.eval_text, args.max_windows)
    rows = []
    for dtype in DTYPES:
        artifact = _build(dtype, model, args)
        watch.sample()
        rows.append(_measure(dtype, artifact, windows, args))
        watch.sample()
        print(_row_line(rows[-1]), flush=True)
    report = {
        "benchmark": "kv_cache",
        "machine": machine_info(),
        "load": watch.record(),
        "model": "../shared/models/pydoc-16m",
        "weights": "float (no quantize entry)",
        "calibration": {
            "dataset": args.calib_text.name,
            "samples": args.samples,
            "seq_len": 512,
            "seed": 0,
        },
        "evaluation": evaluation(args.eval_text, eval_digest, windows),
        "budget_bytes": args.budget_mib << 20,
        "seq_len": args.seq_len,
        "block_size": BLOCK_SIZE,
        "rows": rows,
        "targets": _targets(rows),
        "seconds": round(time.perf_counter() - started, 1),
        "refused": watch.refusal(),
    }
    status = publish(report, args.out_dir, STEM, _markdown)
    return status or (0 if all(t["met"] for t in report["targets"]) else 1)


def _build(dtype: str, model: Path, args: argparse.Namespace) -> Path:
    """The artifact of pydoc-16m with a ``dtype`` KV cache (stage cache: reruns are quick)."""
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    root = bench_cache_dir() / "kv_cache"
    root.mkdir(parents=True, exist_ok=True)
    recipe = {
        "source": {"path": str(model)},
        "calibration": {
            "dataset": str(args.calib_text),
            "samples": args.samples,
            "seq_len": 512,
            "seed": 0,
        },
        "quantize": [],
        "kv_cache": {"dtype": dtype, "block_size": BLOCK_SIZE},
        "export": {"max_seq_len": args.seq_len},
        "targets": [{"engine": "onnxruntime", "optimization_level": "extended"}],
        "artifact": {"name": f"pydoc-16m-kv-{dtype}"},
    }
    path = root / f"{dtype}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return build(path, root / "out" / dtype, cache=StageCache(root / "cache")).artifact


def _measure(dtype: str, artifact: Path, windows: np.ndarray, args: argparse.Namespace) -> dict:
    from ingot.artifacts import read_manifest
    from ingot.pipeline.evaluate.engine import engine_perplexity
    from ingot.runtime import LoadedModel
    from ingot.runtime.loader import EngineFiles

    manifest = read_manifest(artifact)
    engine = manifest.engines[0]
    files = EngineFiles(manifest.graph, engine, artifact / engine.path)
    ppl = engine_perplexity(files, windows)
    budget = args.budget_mib << 20
    loaded = LoadedModel.load(artifact, kv_cache_bytes=budget, enable_prefix_caching=False)
    pool = loaded.pool
    per_token = pool.nbytes // (pool.num_blocks * pool.block_size)
    capacity = pool.num_blocks // -(-args.seq_len // pool.block_size)
    check = engine.build["check"]
    row: dict[str, Any] = {
        "kv_dtype": dtype,
        "perplexity": ppl,
        "kv_bytes_per_token": per_token,
        "pool_blocks": pool.num_blocks,
        "pool_bytes": pool.nbytes,
        "max_sequences": capacity,
        "export_check": {k: check[k] for k in ("kv_dtype", "greedy_match", "max_rel_logit_diff")},
    }
    scales = manifest.graph.kv_scales
    if scales is not None:
        k, v = np.array(scales.k), np.array(scales.v)
        row["kv_scales"] = {
            "k_range": [float(k.min()), float(k.max())],
            "v_range": [float(v.min()), float(v.max())],
        }
    if args.run:
        row["scheduler"] = {
            n: _run_scheduler(artifact, budget, n, args.seq_len, windows)
            for n in (capacity, capacity + 1)
        }
    return row


def _run_scheduler(
    artifact: Path, budget: int, requests: int, seq_len: int, windows: np.ndarray
) -> dict[str, Any]:
    """``requests`` sequences of exactly ``seq_len`` tokens through one Generator on a pool of
    ``budget`` bytes: the most running at once, the preemptions, complete outputs."""
    from ingot.runtime import LoadedModel, SamplingParams

    loaded = LoadedModel.load(
        artifact,
        kv_cache_bytes=budget,
        max_num_seqs=requests + 8,  # only the pool limits them
        enable_prefix_caching=False,
    )
    generator = loaded.generator()
    params = SamplingParams(max_tokens=seq_len - PROMPT_TOKENS, temperature=0.0, ignore_eos=True)
    flat = windows.reshape(-1)
    ids = [
        generator.add(flat[i * PROMPT_TOKENS : (i + 1) * PROMPT_TOKENS].tolist(), params)
        for i in range(requests)
    ]
    most = 0
    while generator.has_unfinished():
        generator.step()
        most = max(most, generator.stats().num_running)
    completions = [generator.pop_completion(i) for i in ids]
    return {
        "requests": requests,
        "max_running": most,
        "preemptions": generator.stats().num_preemptions,
        "all_complete": all(len(c.token_ids) == params.max_tokens for c in completions),
    }


def _targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = next(r for r in rows if r["kv_dtype"] == "fp32")
    out = []
    for row in rows:
        row["delta_pct"] = 100 * (row["perplexity"] / base["perplexity"] - 1)
        row["bytes_vs_fp16"] = row["kv_bytes_per_token"] / next(
            r["kv_bytes_per_token"] for r in rows if r["kv_dtype"] == "fp16"
        )
        if row["kv_dtype"] in TARGETS:
            limit = TARGETS[row["kv_dtype"]]
            out.append(
                {
                    "target": f"{row['kv_dtype']} KV perplexity <= fp32 + {limit}%",
                    "measured": f"{row['delta_pct']:+.3f}%",
                    "met": row["delta_pct"] <= limit,
                }
            )
    return out


def _row_line(row: dict[str, Any]) -> str:
    return (
        f"{row['kv_dtype']}: perplexity {row['perplexity']:.4f}, "
        f"{row['kv_bytes_per_token']} bytes/token, {row['max_sequences']} sequences"
    )


def _markdown(report: dict[str, Any]) -> str:
    ev, cal = report["evaluation"], report["calibration"]
    budget, seq_len = report["budget_bytes"] >> 20, report["seq_len"]
    lines = [
        "# KV cache dtypes: perplexity, bytes per token, sequences per budget",
        "",
        f"Model `{report['model']}`, {report['weights']}, ONNX Runtime CPU (level extended), "
        f"blocks of {report['block_size']} tokens. int8 / fp8 scales: per layer, per KV head, "
        f"K (after RoPE) and V, amax / 127 or / 448 over {cal['samples']} x {cal['seq_len']} "
        f"calibration tokens of `{cal['dataset']}` (seed {cal['seed']}). Perplexity through "
        f"the engine on {ev['windows']} windows of {ev['seq_len']} tokens of `{ev['dataset']}`.",
        "",
        f"| KV dtype | perplexity | vs fp32 | bytes / token | vs fp16 | {seq_len}-token "
        f"sequences in {budget} MiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['kv_dtype']} | {r['perplexity']:.4f} | {r['delta_pct']:+.3f}% | "
            f"{r['kv_bytes_per_token']} | {r['bytes_vs_fp16']:.2f}x | {r['max_sequences']} |"
        )
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'NO'} |")
    runs = [r for r in report["rows"] if "scheduler" in r]
    if runs:
        lines += [
            "",
            f"Scheduler, `--kv-cache-memory {budget}MiB`, requests of exactly {seq_len} tokens "
            f"({PROMPT_TOKENS}-token prompts, greedy, EOS ignored), prefix caching off:",
            "",
            "| KV dtype | requests | most running at once | preemptions | all complete |",
            "|---|---|---|---|---|",
        ]
        for r in runs:
            for run in r["scheduler"].values():
                lines.append(
                    f"| {r['kv_dtype']} | {run['requests']} | {run['max_running']} | "
                    f"{run['preemptions']} | {'yes' if run['all_complete'] else 'NO'} |"
                )
    samples = report["load"]["load_1min_samples"]
    lines += [
        "",
        f"No timings: the host's 1-min load ({min(samples):.1f} to {max(samples):.1f} on "
        f"{report['load']['threads']} cores) changes only how long the run took "
        f"({report['seconds']:.0f} s).",
        "",
    ]
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-dir", type=Path, default=models_dir())
    parser.add_argument("--calib-text", type=Path, default=data_dir() / "pydoc-calib.txt")
    parser.add_argument("--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt")
    parser.add_argument("--samples", type=int, default=128, help="calibration windows of 512")
    parser.add_argument("--max-windows", type=int, default=None, help="evaluation windows")
    parser.add_argument("--budget-mib", type=int, default=64, help="--kv-cache-memory, MiB")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    parser.add_argument("--no-run", dest="run", action="store_false", help="skip the scheduler")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
