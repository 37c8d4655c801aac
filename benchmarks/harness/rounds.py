"""Interleaved rounds: every case measured once per round, the cases in turn, and ratios paired
within a round.

This host drifts by 20-30% within minutes, so cases measured one after another compare
different hosts: one committed run put ingot at 0.62x onnxruntime-genai at batch 1, a run an
hour later at 0.38x with nothing changed. Within a round the cases run minutes apart; a ratio
is taken per round (paired) and then the median over rounds, shown with the range of the
rounds' ratios. The order rotates by one each round, so no case always runs first (after a
pause, or another case's warm-up) or last.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

__all__ = ["Paired", "interleave", "paired", "paired_ratios", "ranged", "round_order"]

Name = TypeVar("Name")
Result = TypeVar("Result")


def round_order(names: Sequence[Name], round_index: int) -> list[Name]:
    """The cases in round `round_index`'s order: rotated by one each round."""
    k = round_index % len(names)
    return [*names[k:], *names[:k]]


def interleave(
    names: Sequence[Name],
    rounds: int,
    run: Callable[[Name, int], Result],
    *,
    after_case: Callable[[], Any] | None = None,
    after_round: Callable[[int], Any] | None = None,
    rotate: bool = True,
) -> dict[Name, list[Result]]:
    """Each case's results, one per round: `run(name, round_index)` for every name in each of
    `rounds` rounds, in round_order (the given order every round if not `rotate`);
    `after_case()` after each case (a host-load sample), `after_round(index)` after each round
    (a bandwidth measurement)."""
    results: dict[Name, list[Result]] = {name: [] for name in names}
    for index in range(rounds):
        for name in round_order(names, index) if rotate else names:
            results[name].append(run(name, index))
            if after_case is not None:
                after_case()
        if after_round is not None:
            after_round(index)
    return results


def paired_ratios(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """ours / theirs, round by round (the two lists hold one value per round)."""
    return [a / b for a, b in zip(ours, theirs, strict=True)]


class Paired(NamedTuple):
    """The median of the rounds' paired ratios, and the ratios (their range is the spread)."""

    median: float
    rounds: list[float]


def paired(ours: Sequence[float], theirs: Sequence[float]) -> Paired:
    ratios = paired_ratios(ours, theirs)
    return Paired(statistics.median(ratios), ratios)


def ranged(value: float | None, values: Sequence[float], unit: str = "") -> str:
    """`value` (a median of ratios) with the range of `values` in brackets where there is more
    than one: "1.23x (1.10–1.31)"; "–" for no value."""
    if value is None:
        return "–"
    spread = f" ({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else ""
    return f"{value:.2f}{unit}{spread}"
