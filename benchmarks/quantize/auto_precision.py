"""Per-layer precision search (`method: auto`) against uniform recipes at the same stored
bytes: does choosing a candidate per group of linears by measured sensitivity beat the best
uniform recipe?

    .venv/bin/python -m benchmarks.quantize.auto_precision [--models pydoc-16m,pydoc-tiny]
        [--samples 16] [--seq-len 256] [--max-windows N] [--threads N] [--report-only]

- Models: ../shared/models/pydoc-16m and pydoc-tiny. Calibration: --samples windows of
  --seq-len tokens of ../shared/data/pydoc-calib.txt (ingot's sampler, seed 0), the same for
  every row (GPTQ's Hessians and the search's sensitivities). Scores: ../shared/data/
  pydoc-eval.txt (held out of training), consecutive 256-token windows: the mean KL per
  token of the quantized IR's next-token distributions from the float model's
  (`evaluate.kl.kl_sum`) and the perplexity (`evaluate.perplexity`), both in PyTorch fp32.
- Candidates (every decoder-layer linear; lm_head stays float in every row): GPTQ W4 g64,
  W4 g32, W8 g32 (defaults: act order, static groups, true sequential). Stored bits per
  weight count the fp32 scales: 4.5, 5.0, 9.0.
- Rows: `method: auto` over the three candidates at --budgets (4.75, 5.0: W4 g32's own, 6.0),
  then each candidate as a uniform recipe. Every row is an `ingot build` (one stage cache per
  model: one calibration, one sensitivity measurement for every budget); artifact bytes are the
  artifact's files (the portable graph and the ORT engine each hold the weights), layer bytes
  the graph's decoder-layer weights (codes, scales, zero points). Each auto row is compared
  with the best uniform row storing no more bits per weight than its budget.
- Additivity: every row's predicted KL (the sum of its units' measured KLs, each alone; for a
  uniform row its candidate's column) beside its KL measured on the same calibration windows.
- Times nothing (builds and scores only): the host load is recorded, never refused.

Writes benchmarks/results/auto_precision.json and auto_precision.md.
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

from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir
from benchmarks.harness.report import add_report_only, publish, rerender

STEM = "auto_precision"
# Grouped scales only: ORT's MatMulNBits re-blocks a per-channel linear's scales to blocks of
# 32 in its engine copy, so per-channel codes cost g32's scales in the artifact's engine file
# while the budget counts the portable graph's (design.md section 8).
CANDIDATES = {
    "W4 g64": {"method": "gptq", "bits": 4, "group_size": 64},
    "W4 g32": {"method": "gptq", "bits": 4, "group_size": 32},
    "W8 g32": {"method": "gptq", "bits": 8, "group_size": 32},
}
BUDGETS = (4.75, 5.0, 6.0)  # stored bits per weight; 5.0 is W4 g32's own
LAYERS = "re:layers\\..*"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    import torch  # the scoring's threads (not for --report-only)

    torch.set_num_threads(args.threads)
    watch = LoadWatch(args.threads, timed=False)
    report: dict[str, Any] = {"machine": machine_info(), "settings": _settings(args), "rows": []}
    with tempfile.TemporaryDirectory(prefix="ingot-auto-", dir=args.work_dir) as tmp:
        for model in args.models:
            rows = _model_rows(Path(tmp), models_dir() / model, args)
            for row in rows:
                row["load_1min_after"] = round(watch.sample(), 2)
            report["rows"] += rows
    report["host_load"] = watch.record()
    report["refused"] = watch.refusal()
    return publish(report, args.out_dir, STEM, _markdown)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="pydoc-16m,pydoc-tiny", type=lambda s: s.split(","),
        help="checkpoints under ../shared/models (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--calib-text", type=Path, default=data_dir() / "pydoc-calib.txt")
    parser.add_argument("--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-windows", type=int, default=None, help="default: every window")
    parser.add_argument(
        "--budgets", default=BUDGETS, type=lambda s: tuple(float(b) for b in s.split(",")),
        help="auto's budgets, stored bits per weight (default: 4.75,5.0,6.0)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--work-dir", type=Path, default=None, help="where builds are written")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "calib_text": str(args.calib_text),
        "eval_text": str(args.eval_text),
        "samples": args.samples,
        "seq_len": args.seq_len,
        "max_windows": args.max_windows,
        "threads": args.threads,
        "candidates": CANDIDATES,
        "budgets": list(args.budgets),
    }


def _model_rows(work: Path, checkpoint: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The auto rows (first: their measurement is what every row's predicted KL reads), then
    the uniform rows, of one model."""
    # torch and the pipeline: the measuring half only (not --report-only)
    from benchmarks.quantize.auto_scoring import Scorer

    scorer = Scorer(checkpoint, args.eval_text, args.max_windows, list(CANDIDATES.values()))
    cache = work / f"cache-{checkpoint.name}"
    rows = []
    for budget in args.budgets:
        auto = {"method": "auto", "budget_bits": budget, "candidates": list(CANDIDATES.values())}
        rows.append(_row(work, cache, checkpoint, args, scorer, f"auto {budget:g} bits", [auto]))
        rows[-1]["budget_bits"] = budget
    for label, candidate in CANDIDATES.items():
        quantize = [{**candidate, "targets": [LAYERS]}]
        rows.append(_row(work, cache, checkpoint, args, scorer, f"uniform {label}", quantize))
    return rows


def _row(work, cache, checkpoint, args, scorer, label, quantize) -> dict[str, Any]:
    # the pipeline imports torch: the measuring half only (not --report-only)
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    recipe = {
        "source": {"path": str(checkpoint)},
        "calibration": {
            "dataset": str(args.calib_text),
            "samples": args.samples,
            "seq_len": args.seq_len,
        },
        "quantize": quantize,
        "kv_cache": {"dtype": "fp32", "block_size": 16},
        "export": {"max_seq_len": 1024},
        "artifact": {"name": checkpoint.name},
    }
    job = work / f"{checkpoint.name}-{len(list(work.glob('*.json')))}"
    path = job.with_suffix(".json")  # a recipe file is YAML, and JSON is YAML
    path.write_text(json.dumps(recipe))
    started = time.perf_counter()
    result = build(path, job, cache=StageCache(cache))
    seconds = time.perf_counter() - started
    row = {"model": checkpoint.name, "recipe": label, "seconds": round(seconds, 1)}
    row |= scorer.score(result, StageCache(cache))
    _log(f"{checkpoint.name}: {label}: {json.dumps({k: row[k] for k in _LOGGED})}")
    return row


_LOGGED = ("stored_bits", "artifact_bytes", "kl", "perplexity", "kl_calib", "seconds")


def _markdown(report: dict[str, Any]) -> str:
    settings, machine = report["settings"], report["machine"]
    rows = report["rows"]
    windows = rows[0]["windows"] if rows else 0
    lines = [
        "# Per-layer precision search (`method: auto`) against uniform recipes",
        "",
        f"Calibration: {settings['samples']} x {settings['seq_len']} tokens of "
        f"`{settings['calib_text']}` (every row). Scores: `{settings['eval_text']}` (held out), "
        f"{windows} windows of 256 tokens; KL: mean per token, KL(float || quantized IR), "
        "nats x 1e-3; perplexity of the IR (fp32). Candidates: GPTQ "
        + ", ".join(CANDIDATES)
        + " over every decoder-layer linear (lm_head float). Stored bits per weight count "
        "fp32 scales; an auto row's budget is its stored bits' bound.",
        "",
        f"Host: {machine['cpu_model']}, {settings['threads']} threads; torch "
        f"{machine['versions']['torch']}; {machine['date']}.",
        "",
        "| model | recipe | stored bits | layer bytes | artifact bytes | KL 1e-3 | perplexity "
        "| KL calib 1e-3 | predicted 1e-3 | mix | build s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['recipe']} | {r['stored_bits']:.3f} | {r['layer_bytes']:,} | "
            f"{r['artifact_bytes']:,} | {1e3 * r['kl']:.3f} | {r['perplexity']:.3f} | "
            f"{1e3 * r['kl_calib']:.3f} | {1e3 * r['predicted_kl_calib']:.3f} | "
            f"{r['mix']} | {r['seconds']:.0f} |"
        )
    lines += ["", *_verdicts(rows)]
    return "\n".join(lines) + "\n"


def _verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """Per auto row: the best uniform row (least KL) among those storing no more bits per
    weight than its budget, and the KL ratio."""
    lines = []
    for r in (r for r in rows if "budget_bits" in r):
        fitting = [
            u
            for u in rows
            if u["model"] == r["model"]
            and u["recipe"].startswith("uniform")
            and u["stored_bits"] <= r["budget_bits"] + 1e-9
        ]
        if not fitting:
            continue
        u = min(fitting, key=lambda u: u["kl"])
        better = "lower" if r["kl"] < u["kl"] else "NOT lower"
        lines.append(
            f"- {r['model']}, {r['recipe']}: {r['artifact_bytes']:,} artifact bytes against "
            f"{u['recipe']}'s {u['artifact_bytes']:,} (the best uniform recipe within the "
            f"budget): KL {1e3 * r['kl']:.3f} against {1e3 * u['kl']:.3f} "
            f"(x{r['kl'] / u['kl']:.2f}, {better}), perplexity {r['perplexity']:.3f} against "
            f"{u['perplexity']:.3f}."
        )
    return lines


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
