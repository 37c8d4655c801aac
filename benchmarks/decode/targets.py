"""Issue 27's decode targets, judged from a decode report's results for each of ingot's engines.

Each target is a ratio of one of ours to a peer (or to the best peer of the row, or to the
bandwidth bound) against a threshold: `issue27_targets(results)` lists, per target and engine,
the measured value (None where the run lacks it) and whether it meets the threshold. The
report renders them (report.py), the notes quote them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.decode.rounds import OURS

__all__ = ["TARGETS", "Target", "issue27_targets"]

MODEL_1B, MODEL_SMALL = "llama-1b-shape", "pydoc-16m"
LONG = 4096  # the context of the long-context row


class Target:
    """One row: its statement, how to read the value from the results, the threshold and
    whether the value must be at least (`at_least`) or at most it."""

    def __init__(
        self,
        statement: str,
        read: Callable[[dict[str, Any], str], float | None],
        threshold: float,
        at_least: bool = True,
    ) -> None:
        self.statement, self.read = statement, read
        self.threshold, self.at_least = threshold, at_least

    def judge(self, results: dict[str, Any], engine: str) -> dict[str, Any]:
        value = self.read(results, engine)
        met = None
        if value is not None:
            met = value >= self.threshold if self.at_least else value <= self.threshold
        return {"statement": self.statement, "engine": engine, "value": value, "met": met}


def _case(results: dict[str, Any], model: str, group: str, engine: str) -> dict[str, Any]:
    return results["models"].get(model, {}).get(group, {}).get(engine) or {}


def _vs(model: str, group: str, peer: str) -> Callable[[dict[str, Any], str], float | None]:
    """ours / peer's decode tok/s in the group (the peer case's paired ratio)."""
    return lambda results, mine: (_case(results, model, group, peer).get("ratios") or {}).get(mine)


def _bound(results: dict[str, Any], mine: str) -> float | None:
    return _case(results, MODEL_1B, "batch1", mine).get("fraction_of_bound")


def _long(key: str) -> Callable[[dict[str, Any], str], float | None]:
    """ours / best peer at the longest context point (LONG): `best_peer` (decode tok/s) or
    `best_ttft_peer` (TTFT)."""

    def read(results: dict[str, Any], mine: str) -> float | None:
        context = results["models"].get(MODEL_1B, {}).get("context") or {}
        point = next((p for p in context.get("points", []) if p["prompt_tokens"] == LONG), None)
        if point is None:
            return None
        return ((point["engines"].get(mine) or {}).get(key) or {}).get("ratio")

    return read


def _memory(results: dict[str, Any], mine: str) -> float | None:
    context = results["models"].get(MODEL_1B, {}).get("context") or {}
    return (context.get("memory") or {}).get("ratios", {}).get(mine)


def _ttft_vs(model: str, group: str, peer: str) -> Callable[[dict[str, Any], str], float | None]:
    """ours / peer's TTFT (median over rounds; below 1 is faster)."""

    def read(results: dict[str, Any], mine: str) -> float | None:
        ours, theirs = _case(results, model, group, mine), _case(results, model, group, peer)
        if not (ours.get("ok") and theirs.get("ok")):
            return None
        return ours["ttft_s"] / theirs["ttft_s"]

    return read


TARGETS = [
    Target(
        "1B, batch 1, 32-token prompt: decode / llama.cpp",
        _vs(MODEL_1B, "batch1", "llama.cpp"),
        1.1,
    ),
    Target("1B, batch 1, 32-token prompt: fraction of the bandwidth bound", _bound, 0.88),
    Target(f"1B, batch 1, {LONG}-token prompt: decode / best peer", _long("best_peer"), 1.1),
    Target(
        f"1B, batch 1, {LONG}-token prompt: TTFT / best peer's",
        _long("best_ttft_peer"),
        1.0,
        at_least=False,
    ),
    Target(
        f"1B, {LONG}-token prefill: peak RSS / onnxruntime-genai's", _memory, 1.2, at_least=False
    ),
    Target("pydoc-16m, batch 1: decode / llama.cpp", _vs(MODEL_SMALL, "batch1", "llama.cpp"), 1.0),
    Target(
        "pydoc-16m, batch 1: decode / onnxruntime-genai",
        _vs(MODEL_SMALL, "batch1", "onnxruntime-genai"),
        1.2,
    ),
    Target(
        "1B, 32 sequences: decode / OpenVINO GenAI",
        _vs(MODEL_1B, "batched", "openvino-genai"),
        1.2,
    ),
    Target(
        "1B, 32 sequences: TTFT / OpenVINO GenAI's",
        _ttft_vs(MODEL_1B, "batched", "openvino-genai"),
        1.0,
        at_least=False,
    ),
]


def issue27_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target judged for each of ours, in TARGETS order."""
    return [target.judge(results, mine) for target in TARGETS for mine in OURS]
