"""The decode benchmark's `context` part: batch-1 decode against the length of the prompt.

Each engine, in its own process per round, loads once, warms up on the longest prompt, then
decodes `--context-tokens` tokens after each prompt of `--contexts` tokens in turn (shortest
first; engines.run_context); the rounds are interleaved as in the other parts, the memory
bandwidth measured after each. Per point: decode tok/s, TTFT (the prompt's prefill in one
step), the fraction of the bandwidth bound at that context, and the paired ratios of ingot's
engines to each peer and to the best peer (decode: highest tok/s; TTFT: lowest). The process's
peak RSS is that of the longest prompt's prefill (the warm-up's), compared with
onnxruntime-genai's, as issue 27's target does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from benchmarks.decode.rounds import OURS, best_peer, merge_rounds, pair_ratios, round_bounds
from benchmarks.harness.machine import measure_bandwidth
from benchmarks.harness.rounds import interleave

if TYPE_CHECKING:  # decode.py imports this module
    from benchmarks.decode.decode import Bench
    from benchmarks.decode.models import BenchModel

__all__ = ["MEMORY_PEER", "context_part", "merge_points"]

WARMUP_TOKENS = 2  # the warm-up prefills the longest prompt; one decode step after it
MEMORY_PEER = "onnxruntime-genai"  # the prefill-memory target is relative to it
TIMEOUT_S = 1800


def context_part(bench: Bench, model: BenchModel, loads: dict[str, Any]) -> dict[str, Any]:
    """Every engine over every context point, `--context-runs` interleaved rounds."""
    args = bench.args
    contexts = [model.prompts(1, length)[0] for length in args.contexts]
    tokens = args.context_tokens
    bandwidths: list[float] = []

    def run(engine: str, _: int) -> dict[str, Any]:
        load = loads[engine]
        if isinstance(load, str):
            return {"ok": False, "error": load}
        spec = {
            "kind": "context",
            "engine": engine,
            "load": bench.load_for(load, [contexts[-1]], tokens),
            "contexts": contexts,
            "tokens": tokens,
            "warmup_tokens": WARMUP_TOKENS,
        }
        lengths = ", ".join(map(str, args.contexts))
        bench.log(f"model {model.name}: {engine}, batch 1 after prompts of {lengths} tokens")
        result = bench.worker(spec, TIMEOUT_S, bench.python(engine))
        result["load_1min_after"] = bench.watch.sample()
        return result

    def after_round(_: int) -> None:
        bandwidths.append(measure_bandwidth(args.threads)["bytes_per_s"])
        bench.watch.sample()

    rounds = interleave(list(args.engines), args.context_runs, run, after_round=after_round)
    points = merge_points(rounds, args.contexts)
    for length, cases in zip(args.contexts, points, strict=True):
        for engine, case in cases["engines"].items():
            case["traffic"] = bench.traffic(model, engine, 1, length, tokens)
            round_bounds(case, bandwidths)
    return {
        "contexts": list(args.contexts),
        "new_tokens": tokens,
        "warmup_tokens": WARMUP_TOKENS,
        "runs": args.context_runs,
        "processes": {engine: [_process(r) for r in results] for engine, results in rounds.items()},
        "memory": _memory(rounds),
        "points": points,
    }


def merge_points(
    rounds: dict[str, list[dict[str, Any]]], contexts: list[int]
) -> list[dict[str, Any]]:
    """Per context point, each engine's case merged over rounds (rounds.merge_rounds), with
    the paired ratios to each peer and to the best peer of decode tok/s, and to the best peer
    of TTFT (`best_ttft_peer`: ours / theirs, below 1 is faster)."""
    points = []
    for index, length in enumerate(contexts):
        cases = {
            engine: merge_rounds([_point_round(r, index) for r in results])
            for engine, results in rounds.items()
        }
        pair_ratios(cases)
        peers = {e: c for e, c in cases.items() if e not in OURS and c.get("ok")}
        fastest = min(peers, key=lambda e: peers[e]["ttft_s"], default=None)
        for mine in OURS:
            if mine in cases:
                ttft = best_peer(cases[mine], peers.get(fastest), fastest, key="ttft_s")
                cases[mine]["best_ttft_peer"] = ttft
        points.append({"prompt_tokens": length, "engines": cases})
    return points


def _point_round(result: dict[str, Any], index: int) -> dict[str, Any]:
    """One round of one point, in the form of a decode worker's result (merge_rounds)."""
    if not result.get("ok"):
        return result
    point = result["points"][index]
    keep = ("load_1min_after", "load_s", "peak_rss_bytes")
    return point | {"ok": True} | {k: result.get(k) for k in keep}


def _process(result: dict[str, Any]) -> dict[str, Any]:
    """What a round's process says beyond its points: load, warm-up, memory, or its error."""
    keys = ("ok", "error", "load_s", "info", "warmup", "peak_rss_bytes", "load_1min_after")
    return {k: result[k] for k in keys if k in result}


def _memory(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each engine's peak RSS (the most of its rounds), and ours relative to MEMORY_PEER's."""
    peaks = {
        engine: max((r.get("peak_rss_bytes") or 0 for r in results if r.get("ok")), default=0)
        or None
        for engine, results in rounds.items()
    }
    base = peaks.get(MEMORY_PEER)
    ratios = {mine: peaks[mine] / base for mine in OURS if base and peaks.get(mine) is not None}
    return {"peak_rss_bytes": peaks, "relative_to": MEMORY_PEER, "ratios": ratios}
