"""eval/report.json and report.md, the manifest's summary of them, and the recipe's gate.

Three perplexities on the same windows: the original (float) model and the quantized IR, both
in torch, and the engine that ships (the artifact's first engine, run as the runtime runs it,
int8 activations included where it computes with them; report.md says how it computes as its
engine plug-in describes it). ``delta`` is the quantized IR's against the original,
``engine_delta`` the engine's; the gate judges the engine's, since that is what the artifact
serves. The `speculative` block (mean accepted
length) is speculative.py's; report.md gets a section per block.
"""

from __future__ import annotations

from typing import Any

from ingot.common.errors import IngotError

__all__ = [
    "EvalGateError",
    "perplexity_report",
    "render_markdown",
    "perplexity_summary",
    "check_perplexity_gate",
]

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
    engine_name: str,
    matmul_accuracy_level: int,
) -> dict[str, Any]:
    original, quantized, engine = (round(v, _DIGITS) for v in (original, quantized, engine))
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
        "engine": engine,
        "engine_delta": round(engine - original, _DIGITS),
        "engine_relative_delta": round((engine - original) / original, _DIGITS),
        "engine_name": engine_name,
        "engine_matmul_accuracy_level": matmul_accuracy_level,
    }


def render_markdown(report: dict[str, Any], engine_label: str) -> str:
    """report.md: a section per measurement the report holds (perplexity, speculative);
    `engine_label` says how the engine computes (its builder's `describe`)."""
    from .speculative import speculative_markdown

    lines = ["# Evaluation", ""]
    if "perplexity" in report:
        lines += _perplexity_markdown(report["perplexity"], engine_label)
    if "speculative" in report:
        lines += speculative_markdown(report["speculative"], engine_label)
    return "\n".join(lines)


def _perplexity_markdown(ppl: dict[str, Any], engine_label: str) -> list[str]:
    return [
        f"Perplexity on `{ppl['dataset']}` ({ppl['windows']} windows of {ppl['seq_len']} "
        f"tokens, {ppl['tokens_scored']} tokens scored; text {ppl['dataset_sha256']}).",
        "",
        "| model | perplexity | delta vs original |",
        "|---|---:|---:|",
        f"| original (float, PyTorch) | {ppl['original']:.4f} | |",
        f"| quantized IR (PyTorch) | {ppl['quantized']:.4f} | "
        f"{_delta(ppl['delta'], ppl['relative_delta'])} |",
        f"| engine `{ppl['engine_name']}` ({engine_label}) | {ppl['engine']:.4f} | "
        f"{_delta(ppl['engine_delta'], ppl['engine_relative_delta'])} |",
        "",
        "The gate (`evaluate.perplexity.max_delta`) judges the engine's delta: the engine is "
        "what the artifact serves.",
        "",
    ]


def _delta(delta: float, relative: float) -> str:
    return f"{delta:+.4f} ({100 * relative:+.2f}%)"


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
