"""llm-compressor's side of the quantize benchmark (rows.py), run in its own virtualenv (it
imports llmcompressor, never ingot): quantize a checkpoint with llm-compressor's RTN
(QuantizationModifier), GPTQ (GPTQModifier) or AWQ (AWQModifier) on the exact calibration
windows ingot uses, and save the fake-quantized weights densely (fp32) so ingot's harness
scores them on the same perplexity windows.

    benchmarks/.venvs/llmcompressor/bin/python -m benchmarks.quantize.llmc --model DIR \\
        --tokens calib.npy --method gptq --bits 4 --group-size 128 --out DIR \\
        --result result.json [--threads N]

with the repository on PYTHONPATH (harness.launch.module_env). The virtualenv comes from
`benchmarks/peers/setup.sh llmcompressor` (benchmarks/peers/llmcompressor.txt). The flags are
ingot's side's too (ingot_worker.py).
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path


def _scheme(bits: int, group_size: int, symmetric: bool) -> dict:
    weights = {
        "num_bits": bits,
        "type": "int",
        "symmetric": symmetric,
        "strategy": "group" if group_size > 0 else "channel",
        "group_size": group_size if group_size > 0 else None,
    }
    return {"group_0": {"targets": ["Linear"], "weights": weights}}


def _modifier(method: str, bits: int, group_size: int, symmetric: bool):
    groups = _scheme(bits, group_size, symmetric)
    if method == "rtn":
        from llmcompressor.modifiers.quantization import QuantizationModifier

        return QuantizationModifier(config_groups=groups, ignore=["lm_head"])
    if method == "gptq":
        from llmcompressor.modifiers.quantization import GPTQModifier

        # llm-compressor's defaults, which ingot's GPTQ defaults match: act order "static"
        # (= static groups), block 128, dampening 0.01.
        return GPTQModifier(config_groups=groups, ignore=["lm_head"], block_size=128)
    if method == "awq":
        from llmcompressor.modifiers.awq import AWQModifier

        return AWQModifier(config_groups=groups, ignore=["lm_head"])
    raise SystemExit(f"unknown method {method}")


def _decompress(compressed: Path, dense: Path) -> None:
    """Load the saved compressed-tensors checkpoint the way transformers serves it
    (decompressed on load) and write its weights as a plain fp32 checkpoint."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(compressed, dtype=torch.float32)
    with torch.no_grad():
        model(torch.tensor([[1, 2]]))  # the first forward decompresses every module
    dense.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k.endswith("weight")}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(dense / "model.safetensors"))
    config = json.loads((compressed / "config.json").read_text())
    config.pop("quantization_config", None)
    (dense / "config.json").write_text(json.dumps(config, indent=2))


def run_oneshot(model_dir: str, tokens_file: str, recipe, threads: int | None, result: dict):
    """llm-compressor's `oneshot` of ``recipe`` on the model loaded in fp32, calibrated on the
    token windows of ``tokens_file`` (.npy [N, T], in order); records the tool versions and
    ``quantize_seconds`` (oneshot alone) in ``result``; returns the model as oneshot left it."""
    from importlib.metadata import version

    import numpy as np
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    result["versions"] = {n: version(n) for n in ("llmcompressor", "compressed-tensors")}
    tokens = np.load(tokens_file)
    data = Dataset.from_dict(
        {"input_ids": tokens.tolist(), "attention_mask": np.ones_like(tokens).tolist()}
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    started = time.perf_counter()
    oneshot(
        model=model,
        dataset=data,
        recipe=recipe,
        num_calibration_samples=len(tokens),
        max_seq_length=tokens.shape[1],
        shuffle_calibration_samples=False,
    )
    result["quantize_seconds"] = time.perf_counter() - started
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True, help=".npy [N, T] int64 calibration windows")
    p.add_argument("--method", required=True, choices=("rtn", "gptq", "awq"))
    p.add_argument("--bits", type=int, required=True)
    p.add_argument("--group-size", type=int, required=True)
    p.add_argument("--asymmetric", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args()
    result: dict = {"tool": "llm-compressor"}

    def work() -> None:
        modifier = _modifier(args.method, args.bits, args.group_size, not args.asymmetric)
        model = run_oneshot(args.model, args.tokens, modifier, args.threads, result)
        compressed = Path(args.out) / "compressed"
        model.save_pretrained(compressed, save_compressed=True)
        _decompress(compressed, Path(args.out) / "dense")

    write_result(args.result, result, work)


def write_result(path: str, result: dict, work: Callable[[], None]) -> None:
    """Run `work` (which fills `result`), record its success or its failure (the benchmark
    reports every failure as such), then write `result` as JSON to `path`."""
    try:
        work()
        result["ok"] = True
    except Exception as e:  # noqa: BLE001
        result.update(ok=False, error=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
    Path(path).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
