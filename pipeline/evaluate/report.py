"""eval/report.json and report.md, the manifest's summary of them, and the recipe's gate."""

from __future__ import annotations

from typing import Any

__all__ = [
    "EvalGateError",
    "perplexity_report",
    "render_markdown",
    "perplexity_summary",
    "check_perplexity_gate",
]

_DIGITS = 6  # reported precision; the build decides pass / fail on these same numbers


class EvalGateError(ValueError):
    """The quantized model fails a quality gate of the recipe's `evaluate` section."""


def perplexity_report(
    *,
    dataset: str,
    dataset_sha256: str,
    seq_len: int,
    windows: int,
    original: float,
    quantized: float,
) -> dict[str, Any]:
    original, quantized = round(original, _DIGITS), round(quantized, _DIGITS)
    return {
        "dataset": dataset,
        "dataset_sha256": dataset_sha256,
        "seq_len": seq_len,
        "windows": windows,
        "tokens_scored": windows * (seq_len - 1),
        "original": original,
        "quantized": quantized,
        "delta": round(quantized - original, _DIGITS),
        "relative_delta": round((quantized - original) / original, _DIGITS),
    }


def render_markdown(report: dict[str, Any]) -> str:
    ppl = report["perplexity"]
    return "\n".join(
        [
            "# Evaluation",
            "",
            f"Perplexity on `{ppl['dataset']}` ({ppl['windows']} windows of {ppl['seq_len']} "
            f"tokens, {ppl['tokens_scored']} tokens scored; text {ppl['dataset_sha256']}).",
            "",
            "| model | perplexity |",
            "|---|---:|",
            f"| original (float) | {ppl['original']:.4f} |",
            f"| quantized | {ppl['quantized']:.4f} |",
            f"| delta | {ppl['delta']:+.4f} ({100 * ppl['relative_delta']:+.2f}%) |",
            "",
        ]
    )


def perplexity_summary(report: dict[str, Any], max_delta: float | None) -> dict[str, Any]:
    """The manifest's `eval.perplexity`: the headline numbers and the gate they passed."""
    ppl = report["perplexity"]
    keys = ("dataset", "windows", "seq_len", "original", "quantized", "delta")
    return {**{k: ppl[k] for k in keys}, "max_delta": max_delta}


def check_perplexity_gate(report: dict[str, Any], max_delta: float | None) -> None:
    if max_delta is None:
        return
    ppl = report["perplexity"]
    if ppl["delta"] > max_delta:
        raise EvalGateError(
            f"evaluate.perplexity.max_delta: quantized perplexity {ppl['quantized']:.4f} is "
            f"{ppl['delta']:.4f} above the original {ppl['original']:.4f} on "
            f"{ppl['dataset']}, over the limit {max_delta:g}; the artifact was not packaged "
            "(the previous one and the cached stages are kept)"
        )
