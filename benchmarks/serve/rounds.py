"""Head to head: the burst (every request at once) of each system once per round, in turn.

serve.py's main runs measure each system once, minutes apart, and this host drifts by 20-30%
within minutes: the same code measured 1.16x and 1.34x vllm serve's throughput on one day.
Here each round runs every system's burst (a fresh server each time), the order rotated per
round (harness.rounds.interleave), and the ratios are paired: ingot's burst over each peer's in
the same round, then the median over rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from benchmarks.harness.rounds import interleave, paired_ratios

__all__ = ["OURS", "PHASES", "head_to_head", "paired_bursts"]

OURS = "ingot serve"
# A server's first burst (prompts it has not seen), then the same burst again (with prefix
# caching, its prompts' blocks are cached): the main runs measure the second kind.
PHASES = ("new prompts", "repeated prompts")


def head_to_head(
    bursts: dict[str, Callable[[], dict[str, dict[str, Any]]]],
    rounds: int,
    around: Callable[[Callable[[], dict[str, Any]]], dict[str, Any]],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """`bursts[name]()` runs that system's bursts (OURS among them): {phase: summary
    (`output_tokens_per_s`, `ttft_s` percentiles) or {"ok": False, "error"}} for each of
    PHASES; `around` wraps each call in the host-load bookkeeping. Per system its rounds; per
    phase and peer the paired throughput and TTFT p50 ratios (ours / theirs), medians over the
    rounds where both ran."""
    names = list(bursts)

    def run(name: str, index: int) -> dict[str, dict[str, Any]]:
        log(f"head to head, round {index + 1}/{rounds}: {name}")
        return around(bursts[name])

    runs = interleave(names, rounds, run)
    ratios = {
        phase: {
            name: paired_bursts([r[phase] for r in runs[OURS]], [r[phase] for r in runs[name]])
            for name in names
            if name != OURS
        }
        for phase in PHASES
    }
    return {"rounds": rounds, "phases": list(PHASES), "runs": runs, "ratios": ratios}


def paired_bursts(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """The paired ratios of `ours` over `theirs` (one summary per round each) over the rounds
    where both ran (TTFT: where both report it)."""
    both = [
        (a, b) for a, b in zip(ours, theirs, strict=True) if a.get("ok", True) and b.get("ok", True)
    ]
    tps = paired_ratios(*_columns(both, lambda r: r["output_tokens_per_s"]))
    timed = [(a, b) for a, b in both if "ttft_s" in a and "ttft_s" in b]
    ttft = paired_ratios(*_columns(timed, lambda r: r["ttft_s"]["p50"]))
    return {
        "paired_rounds": len(tps),
        "tokens_per_s": statistics.median(tps) if tps else None,
        "tokens_per_s_rounds": tps,
        "ttft_p50": statistics.median(ttft) if ttft else None,
        "ttft_p50_rounds": ttft,
    }


def _columns(pairs: list[tuple[dict, dict]], value: Callable[[dict], float]) -> tuple[list, list]:
    """(ours, theirs): `value` of each pair's two runs."""
    return [value(a) for a, _ in pairs], [value(b) for _, b in pairs]
