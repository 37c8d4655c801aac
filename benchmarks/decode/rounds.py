"""The decode benchmark's rounds (harness.rounds.interleave: every engine's case once per
round, in turn) merged into one case per engine, with the paired ratios of ingot's engines to
each peer and to the best peer, and the fraction of the memory-bandwidth bound. The bandwidth
is measured in each round too, so each round's fraction of the bound divides by that round's
own bandwidth.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.harness.rounds import Paired, paired

__all__ = ["OURS", "best_peer", "merge_rounds", "pair_ratios", "round_bounds"]

OURS = ("ingot", "ingot-openvino")  # one artifact, its two engines: every other is a peer


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
                "ttft_s": r.get("ttft_s"),
                "load_1min_after": r["load_1min_after"],
                "load_s": r.get("load_s"),
            }
            for r in rounds
        ],
    }
    return merged


def pair_ratios(cases: dict[str, dict[str, Any]], ours: Sequence[str] = OURS) -> None:
    """Each peer case (an engine not in `ours`) gains `ratios`: for each of ours, the median
    over rounds of ours / peer in that round, and `ratio_rounds` those rounds' ratios (None
    unless both have every round); `ingot_ratio` and `ingot_ratio_rounds` are ingot's. Each of
    ours gains `best_peer`: the peer of the highest tok/s and the paired ratio to it."""
    peers = {e: c for e, c in cases.items() if e not in ours}
    for case in peers.values():
        case["ratios"], case["ratio_rounds"] = {}, {}
        for mine in ours:
            ratio = _paired(cases.get(mine, {}), case, "tokens_per_s")
            case["ratios"][mine] = ratio and ratio.median
            case["ratio_rounds"][mine] = ratio and ratio.rounds
        case["ingot_ratio"] = case["ratios"].get("ingot")
        case["ingot_ratio_rounds"] = case["ratio_rounds"].get("ingot")
    ok = {e: c for e, c in peers.items() if c.get("ok")}
    best = max(ok, key=lambda e: ok[e].get("tokens_per_s") or 0.0, default=None)
    for mine in ours:
        if mine in cases:
            cases[mine]["best_peer"] = best_peer(cases[mine], ok.get(best), best)


def best_peer(
    mine: dict[str, Any], peer: dict[str, Any] | None, name: str | None, key: str = "tokens_per_s"
) -> dict[str, Any]:
    """mine / the best peer's `key`, paired by round: {engine, ratio, rounds}, the ratio None
    where either has no number for every round."""
    ratio = _paired(mine, peer or {}, key)
    return {"engine": name, "ratio": ratio and ratio.median, "rounds": ratio and ratio.rounds}


def _paired(mine: dict[str, Any], peer: dict[str, Any], key: str) -> Paired | None:
    a, b = mine.get("rounds"), peer.get("rounds")
    if not (mine.get("ok") and peer.get("ok") and a and b and len(a) == len(b)):
        return None
    return paired([x[key] for x in a], [y[key] for y in b])


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
