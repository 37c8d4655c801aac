"""Which of ingot's departures from llm-compressor's GPTQ costs generalization: ingot's GPTQ
with one choice changed at a time, scored in-distribution and out of domain.

    python -m benchmarks.quantize.gptq_ablation          # W4 g32 and per channel, 3 seeds
    python -m benchmarks.quantize.gptq_ablation --seeds 0 --settings w4g32 \\
        --variants default,one-pass

- The same model, calibration windows (128 x 512 tokens of pydoc-calib.txt, ingot's sampler,
  seeds 0, 1, 2) and the same two perplexity texts as benchmarks/quantize/quantize.py
  (held-out pydoc-eval.txt; legal prose out of domain), with its helpers (scoring.py).
- Each variant is a quantize entry (a recipe's GPTQ fields, all given explicitly), quantized by
  the build's layer-sequential path (`quantize_layers`) in this process, one run at a time.
- References: fp32, ingot RTN (symmetric) and llm-compressor's GPTQ (its defaults: act order
  static, min-max group scales from the weights before GPTQ, one pass per layer, dampening
  0.01, block 128), the latter through the quantize benchmark's rows (rows.py), in
  llm-compressor's own virtualenv.

Writes benchmarks/results/gptq_ablation-<model>.json and .md (one report per checkpoint:
pydoc-16m by default, --model ../shared/models/pydoc-tiny the second); every finished run is kept
in --work and reused with --reuse. --report-only writes the .md again from the .json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.quantize.rows import LLMC, code_digest, run_row
from benchmarks.quantize.rows import SETTINGS as ROW_SETTINGS
from benchmarks.quantize.scoring import (
    OOD_FILES,
    calibration_tokens,
    eval_windows,
    evaluation,
    ood_windows,
    perplexity_scores,
)

# ingot's GPTQ defaults (the recipe's, which this ablation left unchanged), spelled out so
# that the rows keep their meaning whatever the defaults become.
BASE_FIELDS = {
    "actorder": True,
    "static_groups": True,
    "dampening_frac": 0.01,
    "block_size": 128,
    "true_sequential": True,
    "group_scales": "best",
}
# name -> (what changes against the base, recipe fields over the base's).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "default": (
        "ingot's GPTQ defaults: true-sequential, act order with static groups, "
        "per-row choice of min-max or error-minimizing group scales, dampening 0.01, block 128",
        {},
    ),
    "one-pass": (
        "every group of a layer observed once on the layer as loaded (llm-compressor's order)",
        {"true_sequential": False},
    ),
    "minmax": (
        "min-max group scales only (no per-row choice of the error-minimizing range)",
        {"group_scales": "minmax"},
    ),
    "mse": ("error-minimizing group scales for every row (no choice)", {"group_scales": "mse"}),
    "no-actorder": ("columns in their own order (static groups)", {"actorder": False}),
    "dynamic-groups": (
        "no act order, each group's scales from the error-updated weights when GPTQ reaches it "
        "(the paper's algorithm)",
        {"actorder": False, "static_groups": False},
    ),
    "damp-0.1": ("dampening 0.1 of the mean diagonal", {"dampening_frac": 0.1}),
    "damp-0.001": ("dampening 0.001", {"dampening_frac": 0.001}),
    "block-32": ("lazy batches of 32 columns", {"block_size": 32}),
    "llmc-like": (
        "one pass and min-max scales: llm-compressor's algorithm",
        {"true_sequential": False, "group_scales": "minmax"},
    ),
}
SETTINGS = {"w4g32": (4, 32), "w4pc": (4, -1)}
# A row's scores: perplexity and KL from fp32, in-distribution and out of domain.
SCORES = ("perplexity", "perplexity_ood", "kl", "kl_ood")


def _config(name: str) -> dict[str, Any]:
    """A variant's recipe fields, the base's included."""
    return {**BASE_FIELDS, **VARIANTS[name][1]}


def _runs(setting: str, names: list[str]) -> list[str]:
    """The variants that differ on ``setting``: per channel, `group_scales` changes nothing (one
    group per row keeps min-max), so a variant that differs only there is left out."""
    if SETTINGS[setting][1] != -1:
        return names
    seen, kept = set(), []
    for name in names:
        key = json.dumps({**_config(name), "group_scales": None}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            kept.append(name)
    return kept


def _entry(bits: int, group_size: int, fields: dict[str, Any]) -> Any:
    from ingot.pipeline.recipe.quantize import quantize_entry

    spec = {"method": "gptq", "bits": bits, "group_size": group_size, "symmetric": True}
    return quantize_entry({**spec, "targets": ["re:.*"], "ignore": ["lm_head"], **fields})


def _quantize(model: Path, tokens: Path, entry: Any, out: Path) -> float:
    """quantize_layers of ``entry`` into ``out``; its seconds."""
    from ingot.calibration.dataset import CalibrationSet
    from ingot.pipeline.model.load import CheckpointReader
    from ingot.pipeline.quantize.driver import quantize_layers

    windows = np.load(tokens)
    calibration = CalibrationSet(windows, list(range(len(windows))), "ablation")
    work = out.parent / (out.name + "-work")
    shutil.rmtree(work, ignore_errors=True)  # finished layers there would be resumed
    out.mkdir(parents=True, exist_ok=True)
    try:
        started = time.perf_counter()
        quantize_layers(CheckpointReader(model), [entry], out, work, calibration)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _row(name: str, setting: str, seed: int, ctx: dict[str, Any]) -> dict[str, Any]:
    model, work = ctx["model"], ctx["work"]
    tag = f"ablation-{name}-{setting}-{model.name}-s{seed}"
    saved, out = work / f"{tag}.row.json", work / tag  # out: the IR, kept to score again
    row = None
    if ctx["reuse"] and saved.exists() and name not in ctx["redo"]:
        row = json.loads(saved.read_text())
        if set(SCORES) <= row.keys():
            print(f"[reused] {name} {setting} seed {seed}: {_brief(row)}", flush=True)
            return row
        if not (out / "ir_config.json").exists():
            row = None
    if row is None:
        print(f"[{time.strftime('%H:%M:%S')}] {name} {setting} seed {seed} ...", flush=True)
        bits, group_size = SETTINGS[setting]
        entry = _entry(bits, group_size, _config(name))
        row = {"variant": name, "setting": setting, "seed": seed}
        row["quantize_seconds"] = _quantize(model, ctx["tokens"][seed], entry, out)
        row["code"] = code_digest()
    else:
        print(f"[scored again] {name} {setting} seed {seed} ...", flush=True)
    row |= perplexity_scores("ir", out, ctx["windows"], ctx["reference"])
    print(f"    -> {_brief(row)}", flush=True)
    saved.write_text(json.dumps(row, indent=2) + "\n")
    return row


def _reference(label, tool, method, setting, seed, ctx) -> dict[str, Any]:
    """A row of the quantize benchmark (RTN or llm-compressor GPTQ) on the same windows."""
    ROW_SETTINGS.setdefault(setting, SETTINGS[setting])  # a row runs a setting it knows
    run_ctx = {**ctx["bench"], "tokens": ctx["tokens"][seed], "seed": seed}
    row = run_row(label, tool, method, True, setting, ctx["model"], run_ctx)
    return {"variant": label, "setting": setting, "seed": seed, **row}


def _brief(row: dict[str, Any]) -> str:
    return (
        f"ppl {row['perplexity']:.4f}, ood {row['perplexity_ood']:.4f}, KL (1e-3) "
        f"{row['kl'] * 1e3:.3f} / {row['kl_ood'] * 1e3:.3f}, {row['quantize_seconds']:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    stem = f"gptq_ablation-{args.model.name}"
    if args.report_only:
        return rerender(args.out_dir, stem, _markdown)
    # torch and ingot's loader only for a measurement, not for --help or --report-only.
    import torch

    from ingot.pipeline.model.load import load_model

    torch.set_num_threads(args.threads)
    watch = LoadWatch(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    windows, eval_digest = eval_windows(args.model, args.eval_text, None)
    ood_set, ood = ood_windows(args.model, args.ood_text, None)
    tokens = {
        seed: calibration_tokens(args.work, args.samples, args.model, args.calib_text, seed)
        for seed in seeds
    }
    both = {"in": windows, "ood": ood_set}
    ctx = {
        "model": args.model,
        "work": args.work,
        "tokens": tokens,
        "windows": both,
        "reuse": args.reuse,
        "redo": set(filter(None, args.redo.split(","))),
        "bench": {
            "work": args.work,
            "windows": both,
            "threads": args.threads,
            "llmc_python": args.llmc_python,
            "reuse": True,  # reference rows are the quantize benchmark's own
            "redo": set(),
            "reference": None,
        },
    }
    started = time.perf_counter()
    fp32 = perplexity_scores("dense", args.model, both)
    ctx["reference"] = ctx["bench"]["reference"] = load_model(args.model).eval()
    settings = args.settings.split(",")
    rows = _measure(args, settings, seeds, ctx, watch)
    rows = _cached(rows, args.work, args.model, settings)
    report = {
        "benchmark": "gptq_ablation",
        "machine": machine_info(),
        "model": str(args.model),
        "calibration": {"dataset": args.calib_text.name, "samples": args.samples, "seeds": seeds},
        "evaluation": evaluation(args.eval_text, eval_digest, windows),
        "evaluation_ood": ood,
        "fp32": fp32,
        "variants": {name: {"changes": VARIANTS[name][0]} for name in VARIANTS},
        "rows": [_slim(r) for r in rows],
        "summary": _summary(rows, fp32),
        "seconds": time.perf_counter() - started,
        "refused": watch.refusal(),
        "load": watch.record(),
    }
    return publish(report, args.out_dir, stem, _markdown)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=models_dir() / "pydoc-16m", metavar="DIR")
    parser.add_argument("--calib-text", type=Path, default=data_dir() / "pydoc-calib.txt")
    parser.add_argument("--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt")
    parser.add_argument(
        "--ood-text",
        type=lambda v: [Path(f) for f in v.split(",")],
        default=list(OOD_FILES),
        metavar="FILE[,FILE...]",
    )
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--skip-llmc", action="store_true")
    parser.add_argument("--llmc-python", type=Path, default=peer_python(LLMC))
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "ingot-bench-quantize"
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS, metavar="DIR")
    parser.add_argument("--reuse", action="store_true", help="reuse finished runs in --work")
    parser.add_argument("--redo", default="", help="with --reuse: variants to run again")
    add_report_only(parser)
    return parser.parse_args(argv)


def _measure(
    args: argparse.Namespace,
    settings: list[str],
    seeds: list[int],
    ctx: dict[str, Any],
    watch: LoadWatch,
) -> list[dict[str, Any]]:
    """Per setting: ingot RTN (it uses no data), then per seed llm-compressor's GPTQ and every
    variant that differs there; the load sampled after each."""
    rows = []
    for setting in settings:
        rows.append(_reference("ingot RTN (sym)", "ingot", "rtn", setting, 0, ctx))
        watch.sample()
        for seed in seeds:
            if not args.skip_llmc:
                rows.append(
                    _reference("llm-compressor GPTQ (sym)", "llmc", "gptq", setting, seed, ctx)
                )
                watch.sample()
            for name in _runs(setting, args.variants.split(",")):
                rows.append(_row(name, setting, seed, ctx))
                watch.sample()
    return rows


def _cached(rows, work: Path, model: Path, settings: list[str]) -> list[dict[str, Any]]:
    """``rows`` and every other finished run in ``work`` for this model and these settings
    (earlier invocations with other --seeds / --variants), in variant order."""
    found = {(r["variant"], r["setting"], r["seed"]): r for r in rows}
    for path in sorted(work.glob(f"ablation-*-{model.name}-s*.row.json")):
        row = json.loads(path.read_text())
        if row["variant"] in VARIANTS and row["setting"] in settings:
            found.setdefault((row["variant"], row["setting"], row["seed"]), row)
    for setting in settings:  # llm-compressor's rows of other seeds
        for seed in range(10):
            tag = f"llmc-gptq-sym-{setting}-{model.name}" + (f"-s{seed}" if seed else "")
            path = work / f"{tag}.row.json"
            key = ("llm-compressor GPTQ (sym)", setting, seed)
            if path.exists() and key not in found:
                found[key] = {"variant": key[0], "seed": seed, **json.loads(path.read_text())}
    order = ["ingot RTN (sym)", "llm-compressor GPTQ (sym)", *VARIANTS]
    return sorted(
        found.values(),
        key=lambda r: (settings.index(r["setting"]), order.index(r["variant"]), r["seed"]),
    )


def _slim(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("variant", "setting", "seed", "quantize_seconds", "code")
    slim = {k: row[k] for k in (*keep, *SCORES) if k in row}
    if row["variant"] in VARIANTS:
        slim["fields"] = _config(row["variant"])
    return slim


def _summary(rows: list[dict[str, Any]], fp32: dict[str, float]) -> list[dict[str, Any]]:
    """Per (variant, setting): each score's mean over the seeds and the values by seed; the
    perplexities' means also as deltas against fp32."""
    out = []
    keys = dict.fromkeys((r["variant"], r["setting"]) for r in rows)
    for variant, setting in keys:
        mine = [r for r in rows if (r["variant"], r["setting"]) == (variant, setting)]
        entry: dict[str, Any] = {"variant": variant, "setting": setting}
        entry["seeds"] = [r["seed"] for r in mine]
        for key in SCORES:
            values = [r.get(key) for r in mine]
            if None in values:
                continue
            entry[key] = statistics.fmean(values)
            entry[f"{key}_by_seed"] = values
            if key in fp32:
                entry[f"{key}_delta"] = entry[key] - fp32[key]
        out.append(entry)
    return out


def _markdown(report: dict[str, Any]) -> str:
    m, ev, ood = report["machine"], report["evaluation"], report["evaluation_ood"]
    fp32, cal = report["fp32"], report["calibration"]
    seeds = ", ".join(str(s) for s in cal["seeds"])
    lines = [
        "# GPTQ ablation: which departure from llm-compressor's algorithm costs generalization",
        "",
        f"{m['cpu_model']}, {m['usable_cores']} cores, {m['date']}; torch "
        f"{m['versions'].get('torch')}. Model `{report['model']}`; calibration "
        f"{cal['samples']} x 512 tokens of `{cal['dataset']}`, seeds {seeds} (each seed other "
        f"windows; the same windows for every row). Perplexity: {ev['windows']} windows of 256 "
        f"tokens of `{ev['dataset']}` (in-distribution) and {ood['windows']} of the "
        "out-of-domain legal prose ("
        + ", ".join(f"`{f['path']}`" for f in ood["files"])
        + f"). fp32: {fp32['perplexity']:.4f} in-distribution, {fp32['perplexity_ood']:.4f} out "
        "of domain. Δ ppl: the mean perplexity over the seeds minus fp32's; KL: the mean "
        "KL(fp32 || quantized) per predicted token, 1e-3 nats (how far the predictions moved "
        "from fp32's, either way); by seed below.",
        "",
        "| variant | setting | seeds | pydoc-eval Δ ppl | pydoc-eval KL | out-of-domain Δ ppl | "
        "out-of-domain KL | what changes |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    changes = report["variants"]
    for s in report["summary"]:
        what = changes.get(s["variant"], {}).get("changes", "reference")
        cells = [
            f"{s['perplexity_delta']:+.4f}" if "perplexity_delta" in s else "-",
            f"{s['kl'] * 1e3:.3f}" if "kl" in s else "-",
            f"{s['perplexity_ood_delta']:+.4f}" if "perplexity_ood_delta" in s else "-",
            f"{s['kl_ood'] * 1e3:.3f}" if "kl_ood" in s else "-",
        ]
        seeds = ",".join(str(x) for x in s["seeds"])
        lines.append(
            f"| {s['variant']} | {s['setting']} | {seeds} | {' | '.join(cells)} | {what} |"
        )
    lines += [
        "",
        "By seed (perplexity; KL in 1e-3 nats):",
        "",
        "| variant | setting | pydoc-eval ppl | out-of-domain ppl | pydoc-eval KL "
        "| out-of-domain KL |",
        "|---|---|---|---|---|---|",
    ]
    for s in report["summary"]:
        cells = []
        for key in SCORES:
            scale = 1e3 if key.startswith("kl") else 1
            values = s.get(f"{key}_by_seed")
            cells.append("-" if values is None else ", ".join(f"{v * scale:.3f}" for v in values))
        lines.append(f"| {s['variant']} | {s['setting']} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
