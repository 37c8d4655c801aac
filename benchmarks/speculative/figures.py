"""The speculative report's figures: rows in the benchmark's order, ratios to plain, and the
formats of its cells."""

from __future__ import annotations

from typing import Any

from benchmarks.speculative.methods import OTHERS_LIMIT_CORES, ingot_methods

__all__ = [
    "SETS",
    "fmt",
    "get_path",
    "gib",
    "one_token_call_ms",
    "ordered_rows",
    "pct",
    "quiet_line",
    "ratio_of",
    "seconds_text",
    "share",
    "speedup_of",
    "spread",
]

SETS = ("code", "text")


def ordered_rows(rows: dict[str, Any], order: Any = None) -> list[tuple[str, Any]]:
    """`rows` in the benchmark's order (the committed JSON has sorted keys): the methods as
    ingot_methods lists them, each forced variant after its method; then anything else."""
    if order is None:
        order = []
        for name in ingot_methods():
            order += [name, f"{name} forced"]
    rank = {name: i for i, name in enumerate(order)}
    return sorted(rows.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def quiet_line(results: dict[str, Any]) -> str:
    parts = []
    for engine in ("ingot", "transformers"):
        q = (results.get(engine) or {}).get("quiet")
        if q:
            parts.append(
                f"{engine}: {q['repeated']} of {q['measurements']} repeated, "
                f"{q['still_disturbed']} still disturbed after {q['max_attempts']} attempts"
            )
    if not parts:
        return ""
    return (
        "A timed run (ingot: one method over all the prompts; transformers: one prompt) is "
        f"repeated while other processes used more than {OTHERS_LIMIT_CORES} cores during it "
        "(host busy time from /proc/stat, steal included, less the worker's own): "
        + "; ".join(parts)
        + "."
    )


def one_token_call_ms(row: dict[str, Any]) -> float | None:
    by_q = (row.get("step_breakdown") or {}).get("target_call_ms_by_tokens_per_sequence") or {}
    return by_q.get("1", {}).get("ms")


def speedup_of(rows: dict[str, Any], method: str | None) -> float | None:
    """ingot: the median over runs of each run's ratio to plain's run of the same round;
    transformers (one run): the ratio of the totals."""
    if not method or method not in rows or "plain" not in rows:
        return None
    if "speedup" in rows[method]:
        return rows[method]["speedup"]
    return rows[method]["decode_tokens_per_s"] / rows["plain"]["decode_tokens_per_s"]


def ratio_of(row: dict[str, Any] | None, plain: dict[str, Any] | None) -> float | None:
    if not row or not plain:
        return None
    if "ratio_to_plain" in row:
        return row["ratio_to_plain"]
    return row["tokens_per_s"] / plain["tokens_per_s"]


def spread(values: list[float] | None) -> str:
    """The range over runs, for a ratio shown as a median."""
    if not values or len(values) < 2 or min(values) == max(values) == 1:  # plain's own row
        return ""
    return f" ({min(values):.2f}–{max(values):.2f})"


def get_path(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def share(match: dict[str, Any] | None) -> str:
    return "–" if not match else f"{match['equal']}/{match['of']}"


def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def seconds_text(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} s"


def gib(value: int | None) -> str:
    return "–" if value is None else f"{value / (1 << 30):.2f} GiB"
