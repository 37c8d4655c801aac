"""DIR/sweep.md: the sweep's table, the Pareto front marked, and the variants not built with
their reasons."""

from __future__ import annotations

from typing import Any

from .pareto import HIGHER, LOWER
from .results import Row

__all__ = ["render_sweep"]

_MIB = 2**20


def render_sweep(rows: list[Row], about: dict[str, Any]) -> str:
    speed, load = about["speed"], about["speed"].get("load", {})
    axes = "; ".join(f"`{k}` in {v}" for k, v in about["axes_values"].items())
    host = "quiet" if load.get("quiet") else f"LOADED: {load.get('loaded')}"
    if "error" in load:
        host = f"not measured: {load['error']}"
    lines = [
        f"# Sweep of `{about['recipe']}`",
        "",
        f"Axes (`{about['axes']}`, {len(rows)} variants): {axes}.",
        "",
        f"Quality: `kl` is the engine's mean per-token KL(original || engine) and `ppl` its "
        f"perplexity, on the base recipe's evaluation text (`{about['eval_text']}`); "
        f"`ppl ood` on `{about['ood_text']}` (the same window length and count). Speed: "
        f"{speed['rounds']} rounds interleaved across variants, prompts of "
        f"{speed['prompt_tokens']} tokens, {speed['output_tokens']} output tokens, "
        f"batch 1 and {speed['concurrency']} requests at once; host {host}.",
        "",
        f"Pareto front (`*`): no other variant has {' and '.join(LOWER)} as low, "
        f"{' and '.join(HIGHER)} as high, and one of them strictly better.",
        "",
        "| front | variant | kl | ppl | ppl ood | size MiB | tok/s b1 | tok/s b32 | "
        "TTFT p50 ms | build s | peak build MiB |",
        "|:-:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_row(r) for r in rows if r.error is None]
    failed = [r for r in rows if r.error is not None]
    if failed:
        lines += ["", "Not built or not measured:", ""]
        lines += [f"- `{r.name}`: {r.error}" for r in failed]
    return "\n".join(lines) + "\n"


def _row(r: Row) -> str:
    cells = [
        "*" if r.pareto else "",
        f"`{r.name}`",
        f"{r.kl:.4g}",
        f"{r.perplexity:.3f}",
        f"{r.perplexity_ood:.3f}",
        f"{r.artifact_bytes / _MIB:.2f}",
        f"{r.tok_s_batch1:.1f}",
        f"{r.tok_s_batch32:.1f}",
        f"{r.ttft_ms_p50:.1f}",
        f"{r.build_s:.1f}",
        f"{r.peak_build_bytes / _MIB:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"
