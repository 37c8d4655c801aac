"""Head to head: the burst (every request at once) of each system once per round, in turn.

serve.py's main runs measure each system once, minutes apart, and this host drifts by 20-30%
within minutes: the same code measured 1.16x and 1.34x vllm serve's throughput on one day.
Here each round runs every system's burst (a fresh server each time), the order rotated per
round, and the ratios are paired: ingot's burst over each peer's in the same round, then the
median over rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from decode_rounds import round_order

__all__ = ["OURS", "head_to_head"]

OURS = "ingot serve"


def head_to_head(
    bursts: dict[str, Callable[[], dict[str, Any]]],
    rounds: int,
    around: Callable[[Callable[[], dict[str, Any]]], dict[str, Any]],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """`bursts[name]()` runs one burst of that system (OURS among them) and returns its
    summary (`output_tokens_per_s`, `ttft_s` percentiles) or {"ok": False, "error"}; `around`
    wraps each run in the host-load bookkeeping. Per system its rounds; per peer the paired
    throughput ratio and TTFT p50 ratio (ours / theirs), medians over the rounds where both
    ran."""
    names = list(bursts)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for index in range(rounds):
        for name in round_order(names, index):
            log(f"head to head, round {index + 1}/{rounds}: {name}")
            runs[name].append(around(bursts[name]))
    ratios = {name: _paired(runs[OURS], runs[name]) for name in names if name != OURS}
    return {"rounds": rounds, "runs": runs, "ratios": ratios}


def _paired(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    tps, ttft = [], []
    for a, b in zip(ours, theirs, strict=True):
        if not (a.get("ok", True) and b.get("ok", True)):
            continue
        tps.append(a["output_tokens_per_s"] / b["output_tokens_per_s"])
        ttft.append(a["ttft_s"]["p50"] / b["ttft_s"]["p50"] if "ttft_s" in b else None)
    ttft = [t for t in ttft if t is not None]
    return {
        "paired_rounds": len(tps),
        "tokens_per_s": statistics.median(tps) if tps else None,
        "tokens_per_s_rounds": tps,
        "ttft_p50": statistics.median(ttft) if ttft else None,
        "ttft_p50_rounds": ttft,
    }
