"""llm-compressor's side of benchmarks/quantize/w8a8_quality.py, run in its own virtualenv (it
imports llmcompressor, never ingot): SmoothQuant + GPTQ W8A8 or FP8_DYNAMIC on the exact calibration
windows ingot uses, then perplexity on the given windows with the model as llm-compressor left
it in memory: compressed-tensors' forward quantizes each Linear's input activations as the
scheme says (per token, dynamic), which a decompressed dense copy would not.

    benchmarks/.venvs/llmcompressor/bin/python -m benchmarks.quantize.w8a8_llmc --model DIR \\
        --tokens calib.npy --windows windows.npz --scheme w8a8 --result result.json

`windows.npz` holds one [W, L] int64 array per text; the perplexity is ingot's formula
(pipeline/evaluate/perplexity.py): exp of the mean next-token NLL over every window's L - 1
targets, summed in float64, batches of 8.
"""

from __future__ import annotations

import argparse
import math

from benchmarks.quantize.llmc import run_oneshot, write_result  # the quantize benchmark's

SCHEMES = ("w8a8", "w8a8-rtn", "fp8-dynamic")


def _recipe(scheme: str) -> list:
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.smoothquant import SmoothQuantModifier

    if scheme == "fp8-dynamic":
        return [QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"])]
    smooth = SmoothQuantModifier(smoothing_strength=0.5)
    if scheme == "w8a8-rtn":
        return [smooth, QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])]
    return [smooth, GPTQModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])]


def _perplexity(model, windows, batch_size: int = 8) -> float:
    """ingot's formula (pipeline/evaluate/perplexity.py) restated: this runs in llm-compressor's
    virtualenv, where ingot is not installed."""
    import torch

    total, scored = 0.0, 0
    with torch.no_grad():
        for batch in torch.from_numpy(windows).split(batch_size):
            logits = model(batch).logits
            targets = batch[:, 1:]
            nll = torch.nn.functional.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                targets.reshape(-1),
                reduction="sum",
            )
            total += float(nll.double())
            scored += targets.numel()
    return math.exp(total / scored)


def _input_schemes(model) -> dict[str, int]:
    """How many Linear modules quantize their input activations, by kind (a check that the
    fake quantization is live, not only the weights')."""
    counts: dict[str, int] = {}
    for module in model.modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None or scheme.input_activations is None:
            continue
        a = scheme.input_activations
        key = f"{a.type}{a.num_bits} {a.strategy} dynamic={a.dynamic}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True, help=".npy [N, T] int64 calibration windows")
    p.add_argument("--windows", required=True, help=".npz of [W, L] int64 perplexity windows")
    p.add_argument("--scheme", required=True, choices=SCHEMES)
    p.add_argument("--result", required=True)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    result: dict = {"tool": "llm-compressor", "scheme": args.scheme}

    def work() -> None:
        import numpy as np

        model = run_oneshot(args.model, args.tokens, _recipe(args.scheme), args.threads, result)
        result["input_activations"] = _input_schemes(model)
        windows = np.load(args.windows)
        result["perplexity"] = {name: _perplexity(model, windows[name]) for name in windows.files}

    write_result(args.result, result, work)


if __name__ == "__main__":
    main()
