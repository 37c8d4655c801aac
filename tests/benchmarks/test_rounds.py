"""harness.rounds: the interleaved order, and the paired ratios' arithmetic."""

from __future__ import annotations

import pytest

from benchmarks.decode.rounds import pair_ratios, round_bounds
from benchmarks.harness.rounds import Paired, interleave, paired, paired_ratios, ranged, round_order


def test_each_round_rotates_the_order_by_one() -> None:
    names = ["a", "b", "c"]
    assert [round_order(names, i) for i in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_interleave_runs_every_case_once_per_round_and_keeps_results_per_case() -> None:
    calls, events = [], []

    def run(name: str, index: int) -> str:
        calls.append((name, index))
        return f"{name}{index}"

    results = interleave(
        ["a", "b"],
        3,
        run,
        after_case=lambda: events.append("case"),
        after_round=lambda i: events.append(f"round {i}"),
    )
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]
    assert results == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}
    assert list(results) == ["a", "b"]  # the given order, whatever ran first
    assert events == ["case", "case", "round 0", "case", "case", "round 1"] + [
        "case",
        "case",
        "round 2",
    ]


def test_interleave_keeps_a_fixed_order_when_told() -> None:
    calls = []
    interleave(["a", "b"], 2, lambda name, i: calls.append((name, i)), rotate=False)
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


def test_paired_ratios_are_the_median_of_the_rounds_ratios() -> None:
    # Ratios 2, 1, 4: their median is 2, while the ratio of the medians would be 30 / 20.
    ours, theirs = [20.0, 30.0, 80.0], [10.0, 30.0, 20.0]
    assert paired_ratios(ours, theirs) == [2.0, 1.0, 4.0]
    assert paired(ours, theirs) == Paired(2.0, [2.0, 1.0, 4.0])
    with pytest.raises(ValueError):
        paired_ratios([1.0, 2.0], [1.0])  # a round one side lacks pairs with nothing


def test_a_ratio_is_shown_with_the_range_of_its_rounds() -> None:
    assert ranged(1.234, [1.1, 1.234, 1.31], "x") == "1.23x (1.10–1.31)"
    assert ranged(0.5, [0.5]) == "0.50"  # one round: no range
    assert ranged(None, []) == "–"


def test_decode_rounds_pair_ingot_with_each_peer_and_bound_each_round() -> None:
    def case(*rates: float) -> dict:
        rounds = [{"tokens_per_s": r} for r in rates]
        return {"ok": True, "rounds": rounds, "traffic": {"bytes_per_step": 100.0, "batch": 1}}

    cases = {"ingot": case(10.0, 12.0, 9.0), "peer": case(5.0, 4.0, 9.0), "off": {"ok": False}}
    pair_ratios(cases)
    assert cases["peer"]["ingot_ratio_rounds"] == [2.0, 3.0, 1.0]
    assert cases["peer"]["ingot_ratio"] == 2.0
    assert cases["off"]["ingot_ratio"] is None
    # The bound divides each round's bandwidth by the bytes a token reads.
    round_bounds(cases["ingot"], [1000.0, 2000.0, 1000.0])
    assert cases["ingot"]["bound_tokens_per_s"] == 10.0
    assert [r["fraction_of_bound"] for r in cases["ingot"]["rounds"]] == [1.0, 0.6, 0.9]
    assert cases["ingot"]["fraction_of_bound"] == 0.9
