"""`method: auto` resolved from its measurements (sensitivity.py: each unit's KL under each
candidate): each unit's stored bytes counted (units.unit_bytes), the choice made under the
budget (knapsack.py), and the ordinary entries the layer walk runs in the auto entry's place,
one per chosen candidate with the exact modules it got. numpy only: the quantize stage runs it
in milliseconds, so entries differing only in their budget share one measurement."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.config import ModelConfig
from .knapsack import choose
from .method import QuantEntry, Resolution, method_of
from .units import Unit, unit_bytes

__all__ = ["choose_units", "resolved_entries"]


def choose_units(
    budget_bits: float,
    candidates: Sequence[QuantEntry],
    units: Sequence[Unit],
    kl: np.ndarray,
    cfg: ModelConfig,
) -> Resolution:
    """The candidate of each unit minimizing the summed KL ``kl`` [units, candidates] with
    the stored bits per weight within ``budget_bits``."""
    costs = np.array([[unit_bytes(c, u, cfg) for c in candidates] for u in units])  # [U, C]
    weights = sum(n * k for u in units for n, k in u.shapes(cfg))
    picks = choose(costs, kl, math.floor(budget_bits * weights / 8))
    rows = range(len(units))
    used = int(sum(costs[u, picks[u]] for u in rows))
    entries = resolved_entries(candidates, units, picks)
    record: dict[str, Any] = {
        "stored_bits": 8 * used / weights,
        "stored_bytes": used,
        "predicted_kl": float(sum(kl[u, picks[u]] for u in rows)),
        "resolved": [{**method_of(e).record(e), "modules": len(e.targets)} for e in entries],
    }
    return Resolution(tuple(entries), record)


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
