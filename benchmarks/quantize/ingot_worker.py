"""ingot's side of the quantize benchmark (rows.py), one quantization per process: quantize a
checkpoint with ingot's RTN, GPTQ or AWQ on the calibration windows the benchmark drew, save the
IR and record the time of the quantization call; its peak RSS is measured by rows.py's wrapper.

    python -m benchmarks.quantize.ingot_worker --model DIR --tokens calib.npy --method gptq \\
        --bits 4 --group-size 128 --out DIR --result result.json [--asymmetric] [--threads N]

The flags are llm-compressor's side's too (llmc.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.quantize.rows import code_digest

__all__ = ["quantize_entry_of", "run"]


def quantize_entry_of(method: str, bits: int, group_size: int, symmetric: bool) -> Any:
    """The row's quantize entry as a recipe holds it, with the recipe's defaults (GPTQ: act
    order with static groups, true-sequential, ...)."""
    # ingot's recipe models only when a worker quantizes (not for --help).
    from ingot.pipeline.quantize.method import QUANT_METHODS
    from ingot.pipeline.recipe.quantize import quantize_entry

    spec: dict[str, Any] = {
        "method": method.removesuffix("-1p"),
        "bits": bits,
        "group_size": group_size,
        "symmetric": symmetric,
        "targets": ["re:.*"],
        "ignore": ["lm_head"],
    }
    if method == "gptq-1p":  # every group observed in one pass, llm-compressor's order
        spec["true_sequential"] = False
    if bits in (4, 8):
        return quantize_entry(spec)
    # Recipes allow bits 4 | 8 only; the quantizers take any width, so W3 skips validation.
    return QUANT_METHODS.get(spec["method"]).entry.model_construct(**spec)


def run(args: argparse.Namespace) -> None:
    """Quantize with ingot and save the IR to args.out; timing to args.result."""
    # torch and ingot's quantizers only when a worker quantizes (not for --help).
    import torch

    from ingot.calibration.dataset import CalibrationSet
    from ingot.pipeline.model.load import CheckpointReader, load_model
    from ingot.pipeline.quantize.apply import quantize_model
    from ingot.pipeline.quantize.checkpoint import save_ir
    from ingot.pipeline.quantize.driver import quantize_layers

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    entry = quantize_entry_of(args.method, args.bits, args.group_size, not args.asymmetric)
    result: dict[str, Any] = {"tool": "ingot", "code": code_digest()}
    try:
        if args.method == "rtn":
            model = load_model(args.model)
            started = time.perf_counter()
            quantize_model(model, [entry])
            result["quantize_seconds"] = time.perf_counter() - started
            save_ir(model, out)
        else:
            tokens = np.load(args.tokens)
            calibration = CalibrationSet(tokens, list(range(len(tokens))), "benchmark")
            work = out.parent / (out.name + "-work")
            shutil.rmtree(work, ignore_errors=True)  # finished layers there would be resumed
            work.mkdir()
            started = time.perf_counter()
            quantize_layers(CheckpointReader(Path(args.model)), [entry], out, work, calibration)
            result["quantize_seconds"] = time.perf_counter() - started
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - the benchmark records every failure as such
        result.update(ok=False, error=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
    Path(args.result).write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--model", "--tokens", "--method", "--out", "--result"):
        parser.add_argument(flag, required=flag != "--tokens")
    parser.add_argument("--bits", type=int, required=True)
    parser.add_argument("--group-size", type=int, required=True)
    parser.add_argument("--asymmetric", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
