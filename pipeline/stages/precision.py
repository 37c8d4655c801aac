"""Stage: measure what the quantize entries chosen by measurement need (`QuantMethod.searches`:
`method: auto`, the per-layer precision search: each unit's KL under each candidate), before the
quantize stage resolves them (`QuantMethod.resolve`, milliseconds) into ordinary entries with
exact module targets and runs those.

A stage of its own, not the quantize stage's first step: the measurements (a forward of part
of the model per unit and candidate, the bulk of the search) are cached apart from the walk and
keyed without the budget (`QuantMethod.measure_key`), so recipes that differ in the budget
only (a sweep over budgets) or in the other entries share one measurement, and a quantize
stage that fails or is re-keyed re-runs the walk only. The quantize stage is keyed on this
stage's output digest and the recipe's quantize list (the budget with it).

Declared only for a model whose quantize list holds a searched entry; keyed on those entries'
`measure_key` and the calibration slice, reading the calibrate stage's windows, on the device
the calibrate stage resolved.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ingot.calibration.dataset import CalibrationSet

from ..model.config import ModelConfig
from ..model.load import CheckpointReader
from ..quantize.method import QuantEntry, Resolution, SearchInputs, method_of
from ..recipe.quantize import Quantize
from .calibrate import Calibrated, read_device_settings
from .stage import Input, Stage, StageJob, StageOutput

__all__ = ["PrecisionOutput", "Resolved", "measure_entries", "precision_stage", "searched"]


@dataclass(frozen=True, slots=True)
class PrecisionOutput(StageOutput):
    """``precision.json``: {index of a searched entry in the quantize list: its method's
    measurements (`QuantMethod.measure`)}."""

    FILE: ClassVar[str] = "precision.json"

    def measured(self) -> dict[int, dict[str, Any]]:
        return {int(i): m for i, m in self._json(self.FILE).items()}

    def resolve(self, entries: Sequence[Quantize], cfg: ModelConfig) -> Resolved:
        """The quantize list with each searched entry resolved from its measurements."""
        measured = self.measured()
        return Resolved(
            {i: method_of(entries[i]).resolve(entries[i], m, cfg) for i, m in measured.items()},
            entries,
        )


@dataclass(frozen=True, slots=True)
class Resolved:
    """A quantize list's searched entries resolved (by index)."""

    resolutions: dict[int, Resolution]
    entries: Sequence[Quantize]

    def walked(self) -> list[QuantEntry]:
        """The list the layer walk runs: each searched entry replaced by its entries."""
        flat: list[QuantEntry] = []
        for i, entry in enumerate(self.entries):
            found = self.resolutions.get(i)
            flat += list(found.entries) if found is not None else [entry]
        return flat

    def records(self) -> dict[int, dict[str, Any]]:
        """{index: the search's record} (quantize.json, the manifest)."""
        return {i: r.record for i, r in self.resolutions.items()}

    def lock_entry(self) -> dict[str, list[dict[str, Any]]]:
        """{index: the resolved entries as a recipe states them} for ingot.lock."""
        return {
            str(i): [e.model_dump(mode="json") for e in r.entries]
            for i, r in self.resolutions.items()
        }


def searched(entries: Sequence[Quantize]) -> bool:
    """Whether a quantize list holds an entry resolved by a search (it needs this stage)."""
    return any(method_of(e).searches(e) for e in entries)


def precision_stage(
    prefix: str,
    source: Path,
    source_digest: str,
    entries: Sequence[Quantize],
    calibrated: Calibrated | None,
) -> Stage[PrecisionOutput] | None:
    """The model's precision stage, or None when no entry is searched."""
    if not searched(entries):
        return None
    if calibrated is None:
        raise ValueError(f"{prefix}precision: a searched entry needs the calibrate stage")
    search = {
        str(i): method_of(e).measure_key(e)
        for i, e in enumerate(entries)
        if method_of(e).searches(e)
    }
    key_slice: dict[str, Any] = {"search": search, "calibration": calibrated.key_slice}
    inputs: dict[str, Input] = {"source": source_digest, **calibrated.inputs()}
    calibrate = calibrated.stage

    def produce(job: StageJob) -> None:
        measure_entries(source, entries, job[calibrate].dir, job.out)

    return Stage(f"{prefix}precision", PrecisionOutput, key_slice, inputs, produce)


def measure_entries(
    source_path: Path, entries: Sequence[Quantize], calibration_dir: Path, out: Path
) -> None:
    """precision.json in ``out``: each searched entry of ``entries`` measured on the windows."""
    calibration = CalibrationSet.load(calibration_dir)
    device = str(read_device_settings(calibration_dir).device)
    inputs = SearchInputs(CheckpointReader(source_path), calibration, device)
    measured = {
        str(i): method_of(e).measure(e, inputs)
        for i, e in enumerate(entries)
        if method_of(e).searches(e)
    }
    (out / PrecisionOutput.FILE).write_text(json.dumps(measured, indent=2, sort_keys=True) + "\n")
