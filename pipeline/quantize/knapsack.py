"""The per-layer precision choice: one option per unit (a group of linears) minimizing the
summed predicted loss with the summed bytes within a budget, a multiple-choice knapsack.

Solved exactly by dynamic programming over bytes in steps of ``ceil(budget / steps)``: each
option's bytes rounded up to whole steps and the budget down, so any choice the program finds
fits the budget in real bytes; with a step of one byte (small problems) it is the exact optimum.
O(units x steps x options) with numpy over the steps: 100 units x 4096 steps x 6 options is
a few milliseconds.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["choose"]

_STEPS = 4096


def choose(costs: np.ndarray, losses: np.ndarray, budget: int, steps: int = _STEPS) -> list[int]:
    """The option of each unit: costs [U, C] integer bytes, losses [U, C] predicted loss;
    minimizes losses' sum with costs' sum <= budget. ValueError when even the cheapest choice
    does not fit."""
    costs = np.asarray(costs, dtype=np.int64)
    losses = np.asarray(losses, dtype=np.float64)
    cheapest = int(costs.min(axis=1).sum())
    if cheapest > budget:
        raise ValueError(f"the cheapest choice takes {cheapest} bytes, over the budget {budget}")
    step = max(1, math.ceil(budget / steps))
    units, options = costs.shape
    size = budget // step
    weight = -(-costs // step)  # [U, C] steps, rounded up
    best = np.zeros(size + 1)  # best[b]: least loss of the units so far within b steps
    picks = np.zeros((units, size + 1), dtype=np.int64)
    for u in range(units):
        candidates = np.full((options, size + 1), np.inf)
        for c in range(options):
            w = weight[u, c]
            if w <= size:
                candidates[c, w:] = best[: size + 1 - w] + losses[u, c]
        picks[u] = candidates.argmin(axis=0)
        best = candidates.min(axis=0)
    if not np.isfinite(best[size]):
        # Rounding up to whole steps lost the fit; a finer step always recovers it.
        return choose(costs, losses, budget, steps * 4)
    chosen, b = [0] * units, size
    for u in range(units - 1, -1, -1):
        chosen[u] = int(picks[u, b])
        b -= int(weight[u, chosen[u]])
    return chosen
