"""The decode benchmark's rounds (harness.rounds.interleave: every engine's case once per
round, in turn) merged into one case per engine, with the paired ratios ingot / peer and the
fraction of the memory-bandwidth bound. The bandwidth is measured in each round too, so each
round's fraction of the bound divides by that round's own bandwidth.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.harness.rounds import paired

__all__ = ["merge_rounds", "pair_ratios", "round_bounds"]


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One case from its rounds (each a decode worker's result of one timed run).

    The first failed round is the case (its error is what the report shows). Otherwise
    tokens/s, TTFT and decode time are medians over the rounds' runs; TPOT p50 and p99 are the
    medians of the rounds' own percentiles; `rounds` keeps each round's rate and host load.
    """
    failed = next((r for r in rounds if not r.get("ok")), None)
    if failed is not None:
        return failed | {"rounds_ok": sum(1 for r in rounds if r.get("ok"))}
    runs = [run for r in rounds for run in r["runs"]]
    merged = dict(rounds[0])
    merged |= {
        "runs": runs,
        "tokens_per_s": statistics.median(run["tokens_per_s"] for run in runs),
        "ttft_s": statistics.median(run["ttft_s"] for run in runs),
        "decode_s": statistics.median(run["decode_s"] for run in runs),
        "tpot_p50_s": _median_of(rounds, "tpot_p50_s"),
        "tpot_p99_s": _median_of(rounds, "tpot_p99_s"),
        "tpot_intervals": sum(r.get("tpot_intervals") or 0 for r in rounds),
        "peak_rss_bytes": max(r.get("peak_rss_bytes") or 0 for r in rounds) or None,
        "load_1min_after": max(r["load_1min_after"] for r in rounds),
        "reduced": next((r["reduced"] for r in rounds if r.get("reduced")), None),
        "rounds": [
            {
                "tokens_per_s": r["tokens_per_s"],
                "load_1min_after": r["load_1min_after"],
                "load_s": r.get("load_s"),
            }
            for r in rounds
        ],
    }
    return merged


def pair_ratios(cases: dict[str, dict[str, Any]], ours: str = "ingot") -> None:
    """Each peer case gains `ingot_ratio`: the median over rounds of ours / peer in that
    round (None unless both have every round)."""
    mine = cases.get(ours, {})
    for engine, case in cases.items():
        if engine == ours:
            continue
        a, b = mine.get("rounds"), case.get("rounds")
        if not (mine.get("ok") and case.get("ok") and a and b and len(a) == len(b)):
            case["ingot_ratio"] = None
            continue
        ratio = paired([x["tokens_per_s"] for x in a], [y["tokens_per_s"] for y in b])
        case["ingot_ratio_rounds"] = ratio.rounds
        case["ingot_ratio"] = ratio.median


def round_bounds(case: dict[str, Any], bandwidths: list[float]) -> None:
    """The case's bound and fraction of it, per round against that round's bandwidth
    (bytes/s), then the medians. `traffic` holds the bytes a step reads and the batch."""
    traffic = case["traffic"]
    per_token = traffic["bytes_per_step"] / traffic["batch"]
    bounds = [bw / per_token for bw in bandwidths]
    case["bound_tokens_per_s"] = statistics.median(bounds)
    rounds = case.get("rounds")
    if not (case.get("ok") and rounds and len(rounds) == len(bounds)):
        case["fraction_of_bound"] = None
        return
    fractions = [r["tokens_per_s"] / bound for r, bound in zip(rounds, bounds, strict=True)]
    for r, bw, fraction in zip(rounds, bandwidths, fractions, strict=True):
        r["bandwidth_bytes_per_s"], r["fraction_of_bound"] = bw, fraction
    case["fraction_of_bound"] = statistics.median(fractions)


def _median_of(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None
