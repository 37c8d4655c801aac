"""eval/report.json and report.md, the manifest's summary of them, and the recipe's gate.

Three perplexities on the same windows: the original (float) model and the quantized IR, both
in torch, and the engine that ships (the artifact's first engine, run as the runtime runs it,
int8 activations included where it computes with them; report.md says how it computes as its
engine plug-in describes it). ``delta`` is the quantized IR's against the original,
``engine_delta`` the engine's; the gate judges the engine's, since that is what the artifact
serves. ``kl`` and ``engine_kl``: the IR's and the engine's mean per-token KL divergence from
the original's next-token distribution (kl.py), on the same predictions: how far quantization
moved the whole distribution, not only the observed token's probability. The `speculative`
block (mean accepted length) is speculative.py's; report.md gets a section per block
(markdown.py).
"""

from __future__ import annotations

from typing import Any

from ingot.common.errors import IngotError

__all__ = ["EvalGateError", "check_perplexity_gate", "perplexity_report", "perplexity_summary"]

_DIGITS = 6  # reported precision; the build decides pass / fail on these same numbers


class EvalGateError(IngotError, ValueError):
    """The quantized model fails a quality gate of the recipe's `evaluate` section."""


def perplexity_report(
    *,
    dataset: str,
    dataset_sha256: str,
    seq_len: int,
    windows: int,
    original: float,
    quantized: float,
    engine: float,
    kl: float,
    engine_kl: float,
    engine_name: str,
    matmul_accuracy_level: int,
    float_heads: tuple[list[str], float] | None = None,
) -> dict[str, Any]:
    """The `perplexity` block; ``kl`` and ``engine_kl`` are the quantized IR's and the
    engine's mean per-token KL(original || model) in nats, on the same predictions;
    ``float_heads``: (the quantized ones of embed_tokens / lm_head, the IR's perplexity with
    them float), the block's `embedding_lm_head`: their share of the IR's delta."""
    original, quantized, engine = (round(v, _DIGITS) for v in (original, quantized, engine))
    block = {
        "dataset": dataset,
        "dataset_sha256": dataset_sha256,
        "seq_len": seq_len,
        "windows": windows,
        "tokens_scored": windows * (seq_len - 1),
        "original": original,
        "quantized": quantized,
        "delta": round(quantized - original, _DIGITS),
        "relative_delta": round((quantized - original) / original, _DIGITS),
        "engine": engine,
        "engine_delta": round(engine - original, _DIGITS),
        "engine_relative_delta": round((engine - original) / original, _DIGITS),
        "kl": _significant(kl),
        "engine_kl": _significant(engine_kl),
        "engine_name": engine_name,
        "engine_matmul_accuracy_level": matmul_accuracy_level,
    }
    if float_heads is not None:
        modules, floated = float_heads[0], round(float_heads[1], _DIGITS)
        block["embedding_lm_head"] = {
            "quantized": modules,
            "ir_with_them_float": floated,
            "cost": round(quantized - floated, _DIGITS),
            "relative_cost": round((quantized - floated) / floated, _DIGITS),
        }
    return block


def _significant(value: float) -> float:
    """KL to _DIGITS significant digits: an exact engine's is ~1e-9, not 0.0 at 6 decimals."""
    return float(f"{value:.{_DIGITS}g}")


def perplexity_summary(report: dict[str, Any], max_delta: float | None) -> dict[str, Any]:
    """The manifest's `eval.perplexity`: the headline numbers and the gate they passed."""
    ppl = report["perplexity"]
    keys = (
        "dataset",
        "windows",
        "seq_len",
        "original",
        "quantized",
        "delta",
        "engine",
        "engine_delta",
        "engine_name",
    )
    return {**{k: ppl[k] for k in keys}, "max_delta": max_delta}


def check_perplexity_gate(report: dict[str, Any], max_delta: float | None) -> None:
    """`max_delta` bounds the engine's perplexity above the original's (what ships)."""
    if max_delta is None:
        return
    ppl = report["perplexity"]
    if ppl["engine_delta"] > max_delta:
        raise EvalGateError(
            f"evaluate.perplexity.max_delta: the engine's ({ppl['engine_name']}, MatMulNBits "
            f"accuracy level {ppl['engine_matmul_accuracy_level']}) perplexity "
            f"{ppl['engine']:.4f} is {ppl['engine_delta']:.4f} above the original "
            f"{ppl['original']:.4f} on {ppl['dataset']} (quantized IR: {ppl['quantized']:.4f}), "
            f"over the limit {max_delta:g}; the artifact was not packaged (the previous one and "
            "the cached stages are kept)"
        )
