"""The decode report's context part: its table (decode.md) and its plot (decode_context.png,
decode tok/s against the prompt's length, one line per engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.decode.rounds import OURS
from benchmarks.harness.rounds import ranged

__all__ = ["PLOT", "best_cell", "context_section", "num", "plot_context"]

PLOT = "decode_context.png"  # beside decode.md
_MIB = 1 << 20


def context_section(models: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    rows = [(name, model["context"]) for name, model in models.items() if model.get("context")]
    if not rows:
        return ["Not run."]
    first = rows[0][1]
    lines = [
        f"One sequence: a prompt of each length, then {first['new_tokens']} new tokens, on one "
        f"loaded engine per round (warmed up on the longest prompt), {first['runs']} "
        "interleaved round(s). tok/s counts the decode steps after the prompt's prefill (TTFT: "
        "the prompt in one step); / best peer is paired by round, decode against the peer of "
        "the highest tok/s at that length, TTFT against the fastest peer's (below 1: faster); "
        "of bound: the rate over the bandwidth bound at that context.",
        "",
        f"![decode tok/s against context]({PLOT})",
        "",
        "| model | prompt tokens | engine | decode tok/s | TTFT s | decode / best peer "
        "| TTFT / best peer | of bound |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, context in rows:
        for point in context["points"]:
            for engine, case in point["engines"].items():
                cells = [
                    name,
                    str(point["prompt_tokens"]),
                    engine,
                    f"{case['tokens_per_s']:.1f}" if case.get("ok") else "failed",
                    f"{case['ttft_s']:.2f}" if case.get("ok") else "–",
                    best_cell(case.get("best_peer")) if engine in OURS else "",
                    best_cell(case.get("best_ttft_peer")) if engine in OURS else "",
                    num(case.get("fraction_of_bound"), ".2f"),
                ]
                lines.append("| " + " | ".join(cells) + " |")
        lines += ["", _memory_line(name, context)]
    return lines


def _memory_line(name: str, context: dict[str, Any]) -> str:
    memory = context["memory"]
    peaks = ", ".join(
        f"{engine} {num(peak, '.0f', 1 / _MIB)}"
        for engine, peak in memory["peak_rss_bytes"].items()
    )
    ratios = ", ".join(f"{mine} {ratio:.2f}x" for mine, ratio in memory["ratios"].items())
    longest = context["contexts"][-1]
    line = (
        f"{name}: peak RSS of each engine's process (loaded, the {longest}-token prompt "
        f"prefilled in one step), MiB: {peaks}"
    )
    if ratios:
        line += f"; relative to {memory['relative_to']}'s: {ratios}"
    return line + "."


def plot_context(report: dict[str, Any], path: Path) -> Path | None:
    """decode tok/s against the prompt's length, one line per engine and model, as a PNG at
    `path`; None (nothing written) where the report has no context part."""
    rows = [
        (name, model["context"])
        for name, model in report["results"]["models"].items()
        if model.get("context")
    ]
    if not rows:
        return None
    # Imported here: matplotlib (the dev extra) takes a second to import, and only this
    # plot uses it.
    import matplotlib

    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=100)
    for name, context in rows:
        engines = list(context["points"][0]["engines"])
        for engine in engines:
            xs, ys = [], []
            for point in context["points"]:
                case = point["engines"][engine]
                if case.get("ok") and case.get("tokens_per_s"):
                    xs.append(point["prompt_tokens"])
                    ys.append(case["tokens_per_s"])
            style = "-o" if engine in OURS else "--s"
            label = engine if len(rows) == 1 else f"{name} / {engine}"
            axes.plot(xs, ys, style, label=label)
    axes.set_xlabel("prompt tokens (context)")
    axes.set_ylabel("decode tok/s, batch 1")
    axes.set_ylim(bottom=0)
    machine = report["machine"]
    axes.set_title(
        f"Decode against context, {' / '.join(n for n, _ in rows)}, "
        f"{report['settings']['threads']} threads, {machine['date'][:10]}"
    )
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def best_cell(best: dict[str, Any] | None) -> str:
    """mine / the best peer (rounds.best_peer), its range over rounds and which peer."""
    if not best or best.get("ratio") is None:
        return "–"
    return f"{ranged(best['ratio'], best['rounds'])} ({best['engine']})"


def num(value: float | None, fmt: str, scale: float = 1.0) -> str:
    """`value` scaled and formatted; "–" for none."""
    return "–" if value is None else format(value * scale, fmt)
