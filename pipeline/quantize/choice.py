"""`method: auto` resolved: each unit's KL under each candidate measured (sensitivity.py), its
stored bytes counted (units.unit_bytes), the choice made under the budget (knapsack.py), and
the ordinary entries the layer walk runs in the auto entry's place, one per chosen candidate
with the exact modules it got."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .knapsack import choose
from .method import QuantEntry, Resolution, SearchInputs, method_of
from .sensitivity import measure_kl
from .units import Unit, unit_bytes

__all__ = ["choose_units", "resolved_entries"]


def choose_units(
    entry: QuantEntry,
    candidates: Sequence[QuantEntry],
    units: Sequence[Unit],
    inputs: SearchInputs,
) -> Resolution:
    """The resolution of an auto entry (``budget_bits``) over ``units``."""
    cfg = inputs.source.cfg
    kl = measure_kl(inputs.source, inputs.calibration, units, candidates, device=inputs.device)
    costs = np.array([[unit_bytes(c, u, cfg) for c in candidates] for u in units])  # [U, C]
    weights = sum(n * k for u in units for n, k in u.shapes(cfg))
    budget = math.floor(entry.budget_bits * weights / 8)
    picks = choose(costs, kl, budget)
    rows = range(len(units))
    used = int(sum(costs[u, picks[u]] for u in rows))
    entries = resolved_entries(candidates, units, picks)
    record: dict[str, Any] = {
        "stored_bits": 8 * used / weights,
        "stored_bytes": used,
        "predicted_kl": float(sum(kl[u, picks[u]] for u in rows)),
        "resolved": [{**method_of(e).record(e), "modules": len(e.targets)} for e in entries],
    }
    report = {
        "budget_bytes": budget,
        "weights": weights,
        "candidates": [c.model_dump(mode="json") for c in candidates],
        "units": [
            {
                "modules": u.modules,
                "kl": kl[a].tolist(),
                "bytes": costs[a].tolist(),
                "chosen": picks[a],
            }
            for a, u in enumerate(units)
        ],
    }
    return Resolution(tuple(entries), record, report)


def resolved_entries(
    candidates: Sequence[QuantEntry], units: Sequence[Unit], picks: Sequence[int]
) -> list[QuantEntry]:
    """One entry per chosen candidate, its targets the exact modules of the units it got (in
    model order), in the candidates' order."""
    entries = []
    for j, candidate in enumerate(candidates):
        modules = [m for u, p in zip(units, picks, strict=True) if p == j for m in u.modules]
        if modules:
            spec = {**candidate.model_dump(mode="json"), "targets": modules, "ignore": []}
            entries.append(type(candidate).model_validate(spec))
    return entries
