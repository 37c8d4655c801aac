"""Quality of SmoothQuant W8A8 and FP8: ingot against llm-compressor on the same model, the
same calibration windows and the same perplexity windows (benchmarks/quantize/quantize.py's).

    .venv/bin/python -m benchmarks.quantize.w8a8_quality          # full run (~40 min on 2 cores)
    .venv/bin/python -m benchmarks.quantize.w8a8_quality --quick  # smoke: 8 windows, to a temp dir

- Model ../shared/models/pydoc-16m; calibration: 128 windows of 512 tokens of
  ../shared/data/pydoc-calib.txt drawn by ingot's sampler (seed 0), the very windows
  benchmarks/quantize/quantize.py uses, handed to llm-compressor as a .npy file. Perplexity on
  the two texts of benchmarks/quantize/quantize.py (scoring.py): held-out Python documentation
  (in-domain) and the Debian licence texts (out-of-domain), 256-token windows, ingot's formula
  on both sides.
- ingot rows: the PyTorch IR after `quantize_model` (its forward rounds activations exactly as
  the exported graph does: pipeline/model/input_quant.py), lm_head float like llm-compressor's
  `ignore: [lm_head]`.
- llm-compressor rows (its virtualenv, benchmarks/quantize/w8a8_llmc.py): SmoothQuantModifier(0.5) +
  GPTQModifier(W8A8) or + QuantizationModifier(W8A8) (RTN), and QuantizationModifier
  (FP8_DYNAMIC), scored in memory as oneshot leaves the model, activations quantized per token
  by compressed-tensors' forward.
- Targets (issue 13): W8A8 <= +1% perplexity over fp32, FP8 weights <= +0.5%.
- Host load sampled after each row (harness.load.LoadWatch); a run whose load
  exceeded --threads (the quantize s column is a timing) is written REFUSED and exits 1.

Writes benchmarks/results/w8a8_quality.json and w8a8_quality.md (--report-only: the .md again
from the .json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.launch import module_command, module_env
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.quantize.scoring import OOD_FILES, calibration_tokens, eval_windows, ood_windows

STEM = "w8a8_quality"

LAYERS = {"targets": ["re:layers\\..*"], "ignore": []}
# row -> ingot quantize entry (None: the float model)
INGOT_ROWS: dict[str, dict[str, Any] | None] = {
    "fp32": None,
    "w8a8 (smoothquant, gptq, per token)": {"method": "smoothquant", **LAYERS},
    "w8a8 (smoothquant, rtn, per token)": {"method": "smoothquant", "weights": "rtn", **LAYERS},
    "w8a8 (smoothquant, gptq, static)": {
        "method": "smoothquant",
        "activations": "static",
        **LAYERS,
    },
    "w8a8 (no smoothing, gptq, per token)": {"method": "smoothquant", "alpha": None, **LAYERS},
    "fp8 (channel, per token)": {"method": "fp8", **LAYERS},
    "fp8 (tensor, static)": {
        "method": "fp8",
        "weights": "tensor",
        "activations": "static",
        **LAYERS,
    },
    "fp8 weights only (channel)": {"method": "fp8", "activations": "none", **LAYERS},
}
LLMC_ROWS = {
    "w8a8 (smoothquant, gptq, per token)": "w8a8",
    "w8a8 (smoothquant, rtn, per token)": "w8a8-rtn",
    "fp8 (channel, per token)": "fp8-dynamic",
}
TARGETS = {"w8a8": 1.0, "fp8 weights": 0.5}  # max perplexity increase over fp32, percent
TEXTS = ("in", "ood")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    watch = LoadWatch(args.threads)
    import torch  # only for a measurement: the ingot rows quantize and score in this process

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="ingot-w8a8q-") as tmp:
        work = Path(tmp)
        calib = calibration_tokens(work, args.samples, args.model, args.calib_text)
        windows, texts = _windows(args)
        np.savez(work / "windows.npz", **{k: w.numpy() for k, w in windows.items()})
        rows = []
        for name, entry in _selected(args):
            rows.append(_ingot_row(args, name, entry, calib, windows))
            watch.sample()
        if not args.skip_llmc:
            for name, scheme in LLMC_ROWS.items():
                if args.llmc_rows is not None and scheme not in args.llmc_rows:
                    continue
                rows.append(_llmc_row(args, name, scheme, calib, work))
                watch.sample()
    report = {
        "machine": machine_info(),
        "load": watch.record(),
        "settings": {
            "model": str(args.model),
            "samples": args.samples,
            "seq_len": 512,
            "max_windows": args.max_windows,
            "rows": args.rows,
            "llmc_rows": args.llmc_rows,
            "threads": args.threads,
        },
        "texts": texts,
        "rows": rows,
        "refused": watch.refusal(),
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _selected(args) -> list[tuple[str, dict[str, Any] | None]]:
    return [(n, e) for n, e in INGOT_ROWS.items() if args.rows is None or n in args.rows]


def _windows(args):
    inside, sha = eval_windows(args.model, args.eval_text, args.max_windows)
    outside, ood = ood_windows(args.model, list(OOD_FILES), args.max_windows)
    texts = {"in": {"path": str(args.eval_text), "sha256": sha, "windows": int(inside.shape[0])}}
    return {"in": inside, "ood": outside}, texts | {"ood": ood}


def _ingot_row(args, name: str, entry, calib: Path, windows) -> dict[str, Any]:
    import torch

    from ingot.calibration.dataset import CalibrationSet
    from ingot.pipeline.evaluate import perplexity
    from ingot.pipeline.model.load import load_model
    from ingot.pipeline.quantize.apply import quantize_model
    from ingot.pipeline.recipe.quantize import quantize_entry

    _log(f"ingot {name}")
    model = load_model(args.model)
    row: dict[str, Any] = {"tool": "ingot", "row": name, "entry": entry}
    started = time.perf_counter()
    if entry is not None:
        tokens = np.load(calib)
        calibration = CalibrationSet(tokens, list(range(len(tokens))), "sha256:bench")
        quantize_model(model, [quantize_entry(entry)], calibration)
    row["quantize_seconds"] = time.perf_counter() - started
    with torch.no_grad():
        row["perplexity"] = {t: perplexity(model, windows[t]) for t in TEXTS}
    return row


def _llmc_row(args, name: str, scheme: str, calib: Path, work: Path) -> dict[str, Any]:
    _log(f"llm-compressor {name}")
    result = work / f"llmc-{scheme}.json"
    command = [
        *module_command("benchmarks.quantize.w8a8_llmc", args.llmc_python),
        "--model",
        str(args.model),
        "--tokens",
        str(calib),
        "--windows",
        str(work / "windows.npz"),
        "--scheme",
        scheme,
        "--result",
        str(result),
        "--threads",
        str(args.threads),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=7200, env=module_env())
    row: dict[str, Any] = {"tool": "llm-compressor", "row": name, "scheme": scheme}
    if not result.exists():
        return row | {"ok": False, "error": proc.stderr[-2000:]}
    return row | json.loads(result.read_text())


def _markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    base = next(r for r in report["rows"] if r["row"] == "fp32")["perplexity"]
    lines = [
        "# SmoothQuant W8A8 and FP8: perplexity, ingot vs llm-compressor",
        "",
        f"pydoc-16m, {s['samples']} x {s['seq_len']} calibration windows (ingot's sampler, "
        f"seed 0, the same for both tools), 256-token perplexity windows: in-domain "
        f"{report['texts']['in']['windows']} (pydoc-eval.txt), out-of-domain "
        f"{report['texts']['ood']['windows']} (licence texts). lm_head float. "
        "`python -m benchmarks.quantize.w8a8_quality`",
        "",
        "| tool | scheme | ppl in-domain | Δ% | ppl out-of-domain | Δ% | quantize s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        if "perplexity" not in r:
            lines.append(f"| {r['tool']} | {r['row']} | error: {r.get('error', '?')[:80]} |||||")
            continue
        p = r["perplexity"]
        cells = []
        for t in TEXTS:
            cells += [f"{p[t]:.3f}", f"{100 * (p[t] / base[t] - 1):+.2f}"]
        lines.append(
            f"| {r['tool']} | {r['row']} | {' | '.join(cells)} | {r['quantize_seconds']:.0f} |"
        )
    lines += ["", "Targets: " + ", ".join(f"{k} <= +{v}%" for k, v in TARGETS.items()) + "."]
    return "\n".join(lines) + "\n"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=models_dir() / "pydoc-16m")
    parser.add_argument("--calib-text", type=Path, default=data_dir() / "pydoc-calib.txt")
    parser.add_argument("--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt")
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--max-windows", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default=None, help="semicolon-separated ingot rows (default all)")
    parser.add_argument("--skip-llmc", action="store_true")
    parser.add_argument(
        "--llmc-rows", default=None, help=f"comma-separated of {', '.join(LLMC_ROWS.values())}"
    )
    parser.add_argument("--llmc-python", type=Path, default=peer_python("llmcompressor"))
    parser.add_argument("--quick", action="store_true", help="smoke run, to a temp dir")
    parser.add_argument("--out-dir", type=Path, default=None)
    add_report_only(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.max_windows = 8, 8
    if args.out_dir is None:
        args.out_dir = Path(tempfile.gettempdir()) / "ingot-w8a8q" if args.quick else RESULTS
    # Row names hold commas, so --rows is split on semicolons.
    for flag, sep, known in (("rows", ";", INGOT_ROWS), ("llmc_rows", ",", LLMC_ROWS.values())):
        if getattr(args, flag) is None:
            continue
        values = getattr(args, flag).split(sep)
        unknown = sorted(set(values) - set(known))
        if unknown:
            parser.error(f"--{flag.replace('_', '-')}: unknown {unknown} (known: {list(known)})")
        setattr(args, flag, values)
    return args


def _log(message: str) -> None:
    print(f"[w8a8-quality] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
