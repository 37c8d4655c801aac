"""quantize.json and quantize.md: the rows, the seed spread, the memory by depth, the targets
and their verdicts."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.quantize.scoring import DOMAINS, KL

__all__ = ["SEED_SCORES", "find_row", "markdown", "notes", "targets"]

SEED_SCORES = {  # a row's key -> its line in the seed table
    "perplexity": "pydoc ppl",
    "perplexity_ood": "ood ppl",
    "kl": "pydoc KL",
    "kl_ood": "ood KL",
}


def notes(rows: list[dict[str, Any]]) -> list[str]:
    notes = [
        "quantize s: the quantization call only. ingot GPTQ / AWQ: `quantize_layers`, the "
        "build's layer-sequential path (reads each layer from disk, writes the IR); ingot RTN: "
        "`quantize_model` in memory; llm-compressor: `oneshot` on the loaded model (not "
        "loading, not saving).",
        "peak RSS: the whole quantizing process (imports, model, calibration activations), "
        "from getrusage(RUSAGE_CHILDREN) of a wrapper that runs only that process.",
        "GPTQ on both sides: symmetric, act order with static groups, block 128, dampening "
        "0.01 (llm-compressor's defaults). ingot GPTQ is the recipe's default, true-sequential "
        "inside each layer (q,k,v -> o -> gate,up -> down, as AutoGPTQ); 'one pass' observes "
        "every group of a layer as loaded, as llm-compressor does. AWQ is compared with RTN "
        "at the same (asymmetric) scheme.",
    ]
    codes = sorted({r["code"] for r in rows if r.get("code")})
    if codes:
        notes.append(f"ingot quantization code measured (sha256 prefix): {', '.join(codes)}.")
    for r in rows:
        if r["tool"] == "llmc" and r.get("method") == "awq" and not r.get("ok"):
            notes.append(
                f"llm-compressor AWQ does not run on this CPU-only host: `{r.get('error')}` "
                "(AWQModifier pins its cached activations to accelerator memory)."
            )
    return notes


def find_row(rows, label: str, setting: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["label"] == label and r["setting"] == setting), None)


def targets(rows, depth, settings, spread=()) -> list[dict[str, Any]]:
    """Each target with its verdict: true, false, or null when a row it needs failed."""

    def ppl(label, setting, key="perplexity"):
        row = find_row(rows, label, setting)
        return row.get(key) if row else None

    def secs(label, setting):
        row = find_row(rows, label, setting)
        return row.get("quantize_seconds") if row and row.get("ok") else None

    def verdict(a, b, ok):
        return None if a is None or b is None else bool(ok(a, b))

    targets = []
    for s in settings:
        gptq, llmc = ppl("ingot GPTQ (sym)", s), ppl("llm-compressor GPTQ (sym)", s)
        targets.append(
            {
                "target": f"ingot GPTQ ppl <= llm-compressor GPTQ ppl ({s})",
                "values": [gptq, llmc],
                "met": verdict(gptq, llmc, lambda a, b: a <= b),
            }
        )
        gptq, llmc = (
            ppl(label, s, "perplexity_ood")
            for label in ("ingot GPTQ (sym)", "llm-compressor GPTQ (sym)")
        )
        targets.append(
            {
                "target": f"ingot GPTQ ppl <= llm-compressor GPTQ ppl ({s}, out-of-domain)",
                "values": [gptq, llmc],
                "met": verdict(gptq, llmc, lambda a, b: a <= b),
            }
        )
        awq, rtn = ppl("ingot AWQ (asym)", s), ppl("ingot RTN (asym)", s)
        targets.append(
            {
                "target": f"ingot AWQ ppl <= ingot RTN ppl, both asymmetric ({s})",
                "values": [awq, rtn],
                "met": verdict(awq, rtn, lambda a, b: a <= b),
            }
        )
        ti, tl = secs("ingot GPTQ (sym)", s), secs("llm-compressor GPTQ (sym)", s)
        targets.append(
            {
                "target": f"ingot GPTQ calibration time <= 0.7x llm-compressor GPTQ ({s})",
                "values": [ti, tl],
                "met": verdict(ti, tl, lambda a, b: a <= 0.7 * b),
            }
        )
    targets += _seed_targets(spread)
    by_model = {m: statistics.median(peaks) for m, peaks in _peaks_by_model(depth).items()}
    for base in [b for b in ("pydoc-16m", "random-8L") if b in by_model]:
        shallow, deep = by_model.get(base), by_model.get("random-16L")
        targets.append(
            {
                "target": f"ingot GPTQ median peak RSS (MiB) grows < 10% from {base} to random-16L",
                "values": [shallow, deep],
                "met": verdict(shallow, deep, lambda a, b: b < 1.10 * a),
            }
        )
    return targets


def _seed_targets(spread) -> list[dict[str, Any]]:
    """The GPTQ targets again over every calibration seed: mean perplexity, median time."""
    targets = []
    by = {(r["label"], r["setting"]): r for r in spread}
    for setting in dict.fromkeys(r["setting"] for r in spread):
        ingot, llmc = (
            by.get(("ingot GPTQ (sym)", setting)),
            by.get(("llm-compressor GPTQ (sym)", setting)),
        )
        if not (ingot and llmc):
            continue
        secs = [_median(r.get("quantize_seconds_by_seed", {}).values()) for r in (ingot, llmc)]
        n = len(ingot["perplexity_by_seed"])
        for key, what in SEED_SCORES.items():
            ppl = [_mean(r.get(f"{key}_by_seed", {}).values()) for r in (ingot, llmc)]
            targets.append(
                {
                    "target": f"ingot GPTQ mean {what} over {n} seeds <= llm-compressor GPTQ's "
                    f"({setting})",
                    "values": ppl,
                    "met": None if None in ppl else ppl[0] <= ppl[1],
                }
            )
        targets.append(
            {
                "target": f"ingot GPTQ median time over {n} seeds <= 0.7x llm-compressor GPTQ's "
                f"({setting})",
                "values": secs,
                "met": None if None in secs else secs[0] <= 0.7 * secs[1],
            }
        )
    return targets


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _median(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _peaks_by_model(depth) -> dict[str, list[float]]:
    peaks: dict[str, list[float]] = {}
    for r in depth:
        if r.get("ok"):
            peaks.setdefault(r["model"], []).append(r["peak_rss_bytes"] / 2**20)
    return peaks


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    ev, cal, ood = report["evaluation"], report["calibration"], report["evaluation_ood"]
    base = next(r for r in report["rows"] if r["tool"] == "-")
    files = ", ".join(f"`{Path(f['path']).name}` ({f['sha256'][:12]})" for f in ood["files"])
    lines = [
        "# Quantization benchmark",
        "",
        f"{m['cpu_model']}, {m['usable_cores']} cores, {m['ram_bytes'] / 2**30:.0f} GiB, "
        f"{m['date']}; torch {m['versions'].get('torch')}; 1-min load average "
        f"{report['load_average']['start'][0]:.1f} at the start, "
        f"{report['load_average']['end'][0]:.1f} at the end (other work on the host).",
        f"Model `{report['model']}`; calibration {cal['samples']} x {cal['seq_len']} tokens of "
        f"`{cal['dataset']}` (the same windows for both tools); perplexity on {ev['windows']} "
        f"windows of {ev['seq_len']} tokens of `{ev['dataset']}` (held-out Python "
        f"documentation: in-distribution) and on {ood['windows']} windows of {ood['seq_len']} "
        f"tokens of out-of-domain {ood['dataset']}: {files} from "
        f"`{Path(ood['files'][0]['path']).parent}` (sha256 prefixes), joined by blank lines "
        "(fp32, ingot's harness). Δ: perplexity minus fp32's on the same text; KL: mean "
        "KL(fp32 || quantized) per predicted token, in 1e-3 nats (how far the predictions moved "
        "from the float model's, either way: out of domain, quantization noise can lower the "
        "perplexity of an overconfident float model).",
        "W3 runs through the quantizers' Python API (recipes allow bits 4 | 8).",
        "",
        "| method | setting | pydoc-eval ppl | Δ | KL | out-of-domain ppl | Δ | KL "
        "| quantize s | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(_md_row(r, base))
    if report["depth"]:
        lines += ["", "Peak RSS of ingot GPTQ W4 g128 by depth (same width 384):", ""]
        lines += ["| model | layers | quantize s (each run) | peak RSS MiB (each run) | median |"]
        lines += ["|---|---:|---:|---:|---:|"]
        peaks = _peaks_by_model(report["depth"])
        for model in dict.fromkeys(r["model"] for r in report["depth"]):
            runs = [r for r in report["depth"] if r["model"] == model]
            layers = {"pydoc-16m": 8}.get(model) or int(model.split("-")[1][:-1])
            secs = ", ".join(
                f"{r['quantize_seconds']:.0f}" if r.get("ok") else "FAILED" for r in runs
            )
            rss = ", ".join(f"{p:.0f}" for p in peaks.get(model, []))
            median = f"{statistics.median(peaks[model]):.0f}" if model in peaks else "-"
            lines.append(f"| {model} | {layers} | {secs} | {rss} | {median} |")
    if report.get("seed_spread"):
        seeds = sorted({k for r in report["seed_spread"] for k in r["perplexity_by_seed"]}, key=int)
        title = (
            "GPTQ by calibration seed: perplexity on pydoc-eval (quantize s) and out of domain, "
            "KL (1e-3 nats) on each; seed 0 is the table above, each other seed draws other "
            "windows of the calibration text:"
        )
        lines += ["", title, ""]
        lines += [
            "| method | setting | text | " + " | ".join(f"seed {k}" for k in seeds) + " | mean |"
        ]
        lines += ["|---|---|---|" + "---:|" * (len(seeds) + 1)]
        for r in report["seed_spread"]:
            secs = [r.get("quantize_seconds_by_seed", {}).get(k) for k in seeds]
            for key, text in SEED_SCORES.items():
                scale = 1e3 if key.startswith("kl") else 1  # KL in 1e-3 nats
                values = [r.get(f"{key}_by_seed", {}).get(k) for k in seeds]
                values = [None if v is None else v * scale for v in values]
                mean = "-" if _mean(values) is None else f"{_mean(values):.4f}"
                times = secs if key == "perplexity" else [None] * len(seeds)
                cells = " | ".join(
                    _ppl_and_seconds(v, t) for v, t in zip(values, times, strict=True)
                )
                lines.append(f"| {r['label']} | {r['setting']} | {text} | {cells} | {mean} |")
    lines += ["", *(f"- {n}" for n in report.get("notes", []))]
    lines += ["", "| target | values | met |", "|---|---|---|"]
    for t in report["targets"]:
        values = ", ".join("-" if v is None else f"{v:.4g}" for v in t["values"])
        met = {True: "yes", False: "**no**", None: "n/a (a run failed)"}[t["met"]]
        lines.append(f"| {t['target']} | {values} | {met} |")
    return "\n".join(lines) + "\n"


def _ppl_and_seconds(ppl: float | None, seconds: float | None) -> str:
    if ppl is None:
        return "-"
    return f"{ppl:.4f}" + ("" if seconds is None else f" ({seconds:.0f})")


def _md_row(r: dict[str, Any], base: dict[str, Any]) -> str:
    cells = []
    for domain, key in DOMAINS.items():
        value, kl = r.get(key), r.get(KL[domain])
        cells.append("-" if value is None else f"{value:.4f}")
        delta = None if value is None or r is base else value - base[key]
        cells.append("-" if delta is None else f"{delta:+.4f}")
        cells.append("-" if kl is None else f"{kl * 1e3:.2f}")
    if r["tool"] == "-":
        return f"| {r['label']} | - | {' | '.join(cells)} | - | - |"
    if not r.get("ok"):
        error = str(r.get("error", "")).replace("|", "/")[:160]
        return f"| {r['label']} | {r['setting']} | FAILED: {error} | | | | | | | |"
    rss = r["peak_rss_bytes"] / 2**20
    return (
        f"| {r['label']} | {r['setting']} | {' | '.join(cells)} | "
        f"{r['quantize_seconds']:.1f} | {rss:.0f} |"
    )
