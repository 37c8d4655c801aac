"""auto: a per-layer precision search under a size budget. Each unit (units.py: the selected
linears of one compute group of one layer) gets one of the ``candidates`` (entries of the
other methods), the choice minimizing the summed predicted loss (each unit's measured KL
increase alone: sensitivity.py) with the weights' stored bytes (weight_bytes.py: codes,
scales and zero points as the export stores them) averaging at most ``budget_bits`` per weight
(a multiple-choice knapsack: knapsack.py).

The entry is resolved before the layer walk, in the precision stage (`search`): the walk runs
ordinary entries, one per chosen candidate, with exact module targets; quantize.json (then the
manifest) records them under the auto entry, and ingot.lock records them too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import numpy as np
from pydantic import Field

from ...model.architecture import fused_names, linear_names
from ...model.selection import selected
from ..choice import choose_units
from ..fields import Ignore, Targets
from ..method import (
    QUANT_METHODS,
    Grid,
    LayerCost,
    LayerWork,
    QuantEntry,
    QuantMethod,
    Resolution,
    Scheme,
    SearchInputs,
    method_of,
)
from ..units import Unit, unit_bytes, units_of

if TYPE_CHECKING:
    from ...model.config import ModelConfig

__all__ = ["PLUGIN", "AutoQuantize"]

_NAME = "auto"

# Any other registered method's entry (entry-point plug-ins included), discriminated by method.
Candidate = Annotated[
    Union[  # noqa: UP007 - built at run time
        tuple(QUANT_METHODS.get(name).entry for name in QUANT_METHODS.names() if name != _NAME)
    ],
    Field(discriminator="method"),
]


class AutoQuantize(QuantEntry):
    """Per-layer precision search: each group of linears (q,k,v; o; gate,up; down of a layer)
    gets the candidate that costs the least predicted quality (its measured KL increase on the
    calibration windows) with the average bits per weight, scales and zero points counted as
    the artifact stores them, within the budget. Needs `calibration`."""

    method: Literal["auto"] = Field(description="Quantization algorithm.")
    budget_bits: float = Field(
        gt=0,
        le=32,
        description="Average stored bits per weight over the selected linears, counting "
        "scales and zero points (int4 g32 with fp32 scales: 5.0; int8 per channel: ~8.0).",
    )
    candidates: list[Candidate] = Field(
        min_length=1,
        description="Entries of other methods to choose from, per group of linears; their "
        "targets and ignore are this entry's.",
    )
    targets: Targets = ["re:layers\\..*"]
    ignore: Ignore = ["lm_head"]

    @property
    def bits(self) -> int:
        return math.ceil(self.budget_bits)

    @property
    def calibrated(self) -> bool:
        return True  # the search measures every candidate on the calibration windows


class Auto(QuantMethod):
    name = _NAME
    entry = AutoQuantize

    def nested(self, entry: AutoQuantize) -> dict[str, QuantEntry]:
        return {f"candidates.{j}": c for j, c in enumerate(entry.candidates)}

    def searches(self, entry: AutoQuantize) -> bool:
        return True

    def measure_key(self, entry: AutoQuantize) -> dict[str, Any]:
        return entry.model_dump(mode="json", exclude={"budget_bits"})

    def measure(self, entry: AutoQuantize, inputs: SearchInputs) -> dict[str, Any]:
        """Each unit's mean KL (nats per token) under each candidate alone."""
        # torch: the measurement runs in the precision stage, not in the recipe or `inspect`
        from ..sensitivity import measure_kl

        units = _units(entry, inputs.source.cfg)
        kl = measure_kl(
            inputs.source, inputs.calibration, units, entry.candidates, device=inputs.device
        )
        return {"units": [u.modules for u in units], "kl": kl.tolist()}

    def resolve(
        self, entry: AutoQuantize, measured: dict[str, Any], cfg: ModelConfig
    ) -> Resolution:
        units = _units(entry, cfg)
        if measured["units"] != [u.modules for u in units]:
            raise ValueError("auto: the measurements are of other modules than the entry's")
        kl = np.asarray(measured["kl"])
        return choose_units(entry.budget_bits, entry.candidates, units, kl, cfg)

    def scheme(self, entry: AutoQuantize) -> Scheme:
        """The candidates' scheme; a mix is reported as its first non-integer one (what the
        interop formats and engines refuse, since any candidate may be chosen)."""
        schemes = [method_of(c).scheme(c) for c in entry.candidates]
        return next((s for s in schemes if s is not Scheme.WEIGHT_ONLY_INT), schemes[0])

    def grid(self, entry: AutoQuantize) -> Grid | None:
        grids = {method_of(c).grid(c) for c in entry.candidates}
        return grids.pop() if len(grids) == 1 else None

    def describe(self, record: dict[str, Any]) -> str:
        budget = f"auto, budget {record['budget_bits']} bits per weight"
        if "resolved" not in record:
            return budget
        parts = [
            f"{QUANT_METHODS.get(r['method']).describe(r)} x{r['modules']}"
            for r in record["resolved"]
            if r["method"] in QUANT_METHODS
        ]
        return f"{budget} ({record['stored_bits']:.2f} used): {', '.join(parts)}"

    def model_problems(
        self, at: str, entry: AutoQuantize, chosen: list[str], cfg: ModelConfig
    ) -> list[str]:
        problems = [
            f"{at}.candidates.{j}.{field}: a candidate quantizes the modules the auto entry "
            f"selects; set {field} on the auto entry, not on its candidates"
            for j, c in enumerate(entry.candidates)
            for field in ("targets", "ignore")
            if field in c.model_fields_set
        ]
        units = units_of(chosen, cfg)
        weights = sum(n * k for u in units for n, k in u.shapes(cfg))
        if weights:
            cheapest = sum(min(unit_bytes(c, u, cfg) for c in entry.candidates) for u in units)
            least = 8 * cheapest / weights
            if least > entry.budget_bits:
                problems.append(
                    f"{at}.budget_bits: {entry.budget_bits} is below the cheapest choice of "
                    f"its candidates, {least:.3f} bits per weight with scales and zero points "
                    "(raise it or add a smaller candidate)"
                )
        return problems

    def layer_costs(self, entry: AutoQuantize, work: LayerWork) -> dict[str, LayerCost]:
        # The walk runs the resolved candidates: at most every candidate's cost.
        costs: dict[str, LayerCost] = {}
        for c in entry.candidates:
            costs |= method_of(c).layer_costs(c, work)
        return costs


def _units(entry: AutoQuantize, cfg: ModelConfig) -> list[Unit]:
    return units_of(selected(entry, linear_names(cfg), fused_names(cfg)), cfg)


PLUGIN = Auto()
