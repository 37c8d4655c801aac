"""Weight quantization quality, speed and memory: ingot's RTN / GPTQ / AWQ against
llm-compressor's RTN / GPTQ, side by side, on the same calibration windows and the same
perplexity windows.

    python -m benchmarks.quantize.quantize            # full run (about an hour on 2 cores)
    python -m benchmarks.quantize.quantize --samples 8 --max-windows 16 --settings w4g128
    python -m benchmarks.quantize.quantize --reuse --redo ingot-gptq,ingot-awq  # some rows again

- Model: ../shared/models/pydoc-16m (8 layers, width 384; --model). Calibration: 128 windows of
  512 tokens drawn from ../shared/data/pydoc-calib.txt (--calib-text) by ingot's own calibration
  sampler (seed 0); llm-compressor gets the very same token windows (a .npy file). Perplexity
  on two texts, each as consecutive 256-token windows scored by ingot's evaluate stage code on
  ingot's fp32 model for every row: ../shared/data/pydoc-eval.txt (--eval-text), Python
  documentation held out of training (in-distribution), and an out-of-domain text
  (--ood-text): legal prose, the licence texts Debian ships in /usr/share/common-licenses,
  which neither pydoc model saw (fp32 perplexity ~3.5x the in-domain one); each file's sha256
  is in the report. Paths are relative to the repository root; every process runs torch on
  --threads threads.
- Settings: W4 g32, W4 g128, W4 per-channel, W3 g128. ingot's recipe allows bits 4 | 8, so W3
  runs through the Python API of the quantizers (which take any bit width), not a recipe.
- Each quantization runs in its own process (rows.py: ingot_worker.py, llmc.py); its peak RSS
  is `getrusage(RUSAGE_CHILDREN)` of a small wrapper process that runs only it. "quantize s" is
  the time of the quantization call itself: ingot's `quantize_layers` (layer-sequential from
  disk, writing the IR) or `quantize_model` (RTN, in memory); llm-compressor's `oneshot` (model
  already loaded, not saving). llm-compressor runs in its own virtualenv (--llmc-python,
  default benchmarks/.venvs/llmcompressor/bin/python, made by `benchmarks/peers/setup.sh
  llmcompressor`) through benchmarks/quantize/llmc.py; its compressed-tensors checkpoint is
  loaded back through transformers (decompressed) and scored by ingot's harness.
- Memory vs depth: ingot GPTQ W4 g128 on pydoc-16m (8 layers) and on a random model of its
  width with 16 layers (--depth-control adds a random 8-layer one): the peak should grow by
  less than 10% when the model is made twice as deep, since one layer plus the activations is
  resident at a time. Each depth job runs --depth-repeats times (3) and the medians are
  compared: the same job's peak varies by about +-5% from run to run (glibc's allocator).

- Host load: sampled after every row (harness.load.LoadWatch); a run whose load exceeded
  --threads is written REFUSED and exits 1.

Writes benchmarks/results/quantize.json and quantize.md (--report-only: the .md again from the
.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python, portable
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.quantize.report import SEED_SCORES, find_row, markdown, notes, targets
from benchmarks.quantize.rows import LLMC, METHODS, SETTINGS, run_row
from benchmarks.quantize.scoring import (
    OOD_FILES,
    calibration_tokens,
    eval_windows,
    evaluation,
    ood_windows,
    perplexity_scores,
)

STEM = "quantize"


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, markdown)
    return run(args)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        dest="model_dir",
        type=Path,
        default=models_dir() / "pydoc-16m",
        metavar="DIR",
        help="the checkpoint quantized (default: %(default)s)",
    )
    parser.add_argument(
        "--calib-text",
        type=Path,
        default=data_dir() / "pydoc-calib.txt",
        metavar="FILE",
        help="calibration text (default: %(default)s)",
    )
    parser.add_argument(
        "--eval-text",
        type=Path,
        default=data_dir() / "pydoc-eval.txt",
        metavar="FILE",
        help="perplexity text, held out of training (default: %(default)s)",
    )
    parser.add_argument(
        "--ood-text",
        type=lambda v: [Path(f) for f in v.split(",")],
        default=list(OOD_FILES),
        metavar="FILE[,FILE...]",
        help="out-of-domain perplexity text, files joined by blank lines (default: "
        "licences from /usr/share/common-licenses)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="torch threads of every process (default: the usable cores, %(default)s)",
    )
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--max-windows", type=int, default=None)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "ingot-bench-quantize",
        metavar="DIR",
        help="intermediate checkpoints and finished rows (default: %(default)s)",
    )
    parser.add_argument(
        "--llmc-python",
        type=Path,
        default=peer_python(LLMC),
        metavar="PATH",
        help=f"interpreter with {LLMC} installed (default: %(default)s)",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS, metavar="DIR")
    parser.add_argument("--skip-llmc", action="store_true")
    parser.add_argument("--skip-depth", action="store_true")
    parser.add_argument(
        "--seeds", default="1,2", help="extra calibration seeds for the GPTQ rows ('' for none)"
    )
    parser.add_argument("--depth-control", action="store_true", help="also a random 8-layer model")
    parser.add_argument("--depth-repeats", type=int, default=3)
    parser.add_argument("--reuse", action="store_true", help="reuse finished rows found in --work")
    parser.add_argument(
        "--redo", default="", help="with --reuse: rows to run again, e.g. ingot-gptq,ingot-awq"
    )
    add_report_only(parser)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    # torch and ingot's loader only for a measurement, not for --help or --report-only.
    import torch

    from ingot.pipeline.model.load import load_model

    torch.set_num_threads(args.threads)  # the perplexity scoring in this process
    model = args.model_dir
    watch = LoadWatch(args.threads)
    load_at_start = list(os.getloadavg())
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    windows, eval_digest = eval_windows(model, args.eval_text, args.max_windows)
    ood_set, ood = ood_windows(model, args.ood_text, args.max_windows)
    ctx = {
        "work": work,
        "tokens": calibration_tokens(work, args.samples, model, args.calib_text),
        "windows": {"in": windows, "ood": ood_set},
        "threads": args.threads,
        "llmc_python": args.llmc_python,
        "reuse": args.reuse,
        "redo": set(filter(None, args.redo.split(","))),
        "reference": load_model(model).eval(),  # the fp32 model every row's KL is from
        "watch": watch,
    }
    started = time.perf_counter()
    settings = args.settings.split(",")
    rows = _rows(args, settings, ctx)
    spread = [] if args.skip_llmc else _seed_spread(args, settings, rows, ctx)
    depth = [] if args.skip_depth else _depth(args, work, ctx)
    refused = watch.refusal()
    report = {
        "benchmark": "quantize",
        "machine": machine_info(),
        # Other work on the host slows every row alike only roughly; the load says how busy.
        "load_average": {"start": load_at_start, "end": list(os.getloadavg())},
        "model": portable(str(model)),
        "threads": args.threads,
        "calibration": {
            "dataset": args.calib_text.name,
            "samples": args.samples,
            "seq_len": 512,
            "seed": 0,
        },
        "evaluation": evaluation(args.eval_text, eval_digest, windows),
        "evaluation_ood": ood,
        "rows": rows,
        "seed_spread": spread,
        "depth": depth,
        "targets": targets(rows, depth, settings, spread),
        "notes": notes(rows),
        "seconds": time.perf_counter() - started,
        "load": watch.record(),
        "refused": refused,
    }
    # No path of this machine: llm-compressor's tracebacks point into its virtualenv.
    venv = args.llmc_python.parent.parent
    roots = {venv: f"<{LLMC}-venv>"} if (venv / "pyvenv.cfg").is_file() else {}
    return publish(report, args.out_dir, STEM, markdown, roots)


def _rows(args: argparse.Namespace, settings: list[str], ctx: dict[str, Any]) -> list[dict]:
    """The fp32 baseline, then every method at every setting (llm-compressor's AWQ once, at
    the first: recorded for the report, it needs an accelerator)."""
    model = args.model_dir
    baseline = perplexity_scores("dense", model, ctx["windows"])
    rows = [{"label": "fp32 baseline", "tool": "-", "setting": "-", **baseline}]
    for setting in settings:
        for label, tool, method, symmetric in METHODS:
            if tool == "llmc" and args.skip_llmc:
                continue
            rows.append(run_row(label, tool, method, symmetric, setting, model, ctx))
            ctx["watch"].sample()
    if not args.skip_llmc:
        rows.append(
            run_row("llm-compressor AWQ (asym)", "llmc", "awq", False, settings[0], model, ctx)
        )
        ctx["watch"].sample()
    return rows


def _depth(args: argparse.Namespace, work: Path, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """ingot GPTQ W4 g128's peak RSS on pydoc-16m and on random models of its width, deeper
    (and, with --depth-control, as deep), --depth-repeats times each."""
    model = args.model_dir
    memory_ctx = {**ctx, "windows": None}  # memory only; random models have no quality
    models = [model, _random_model(work, 16, model)]
    if args.depth_control:  # a random model as deep as pydoc-16m: weights do not matter
        models.insert(1, _random_model(work, 8, model))
    depth = []
    for depth_model in models:
        for repeat in range(args.depth_repeats):
            ctx_r = {**memory_ctx, "repeat": repeat}
            row = run_row("ingot GPTQ (sym)", "ingot", "gptq", True, "w4g128", depth_model, ctx_r)
            depth.append({**row, "repeat": repeat})
            ctx["watch"].sample()
    return depth


def _seed_spread(args, settings, rows, ctx) -> list[dict[str, Any]]:
    """The GPTQ rows again on windows drawn with other calibration seeds: how far perplexity
    moves with the calibration sample alone, the yardstick for the differences above."""
    seeds = [int(x) for x in args.seeds.split(",") if x]
    spread = []
    gptq = [m for m in METHODS if m[2].startswith("gptq")]
    for setting in settings:
        for label, tool, method, symmetric in gptq:
            by_seed = {"0": find_row(rows, label, setting) or {}}
            for seed in seeds:
                tokens = calibration_tokens(
                    ctx["work"], args.samples, args.model_dir, args.calib_text, seed
                )
                seed_ctx = {**ctx, "tokens": tokens, "seed": seed}
                row = run_row(label, tool, method, symmetric, setting, args.model_dir, seed_ctx)
                by_seed[str(seed)] = row
                ctx["watch"].sample()
            spread.append(
                {"label": label, "setting": setting}
                | {
                    f"{key}_by_seed": {seed: row.get(key) for seed, row in by_seed.items()}
                    for key in (*SEED_SCORES, "quantize_seconds")
                }
            )
    return spread


def _random_model(work: Path, layers: int, base: Path) -> Path:
    """`base`'s config and tokenizer (pydoc-16m's) with `layers` random layers (transformers'
    init)."""
    import torch
    import transformers

    path = work / f"random-{layers}L"
    if (path / "config.json").exists():
        return path
    config = json.loads((base / "config.json").read_text())
    config["num_hidden_layers"] = layers
    torch.manual_seed(layers)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(base / name, path / name)
    return path


if __name__ == "__main__":
    sys.exit(main())
