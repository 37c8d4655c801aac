"""Stage: resolve the quantize entries chosen by measurement (`QuantMethod.searches`: `method:
auto`, the per-layer precision search) into ordinary entries with exact module targets, before
the quantize stage runs them.

A stage of its own, not the quantize stage's first step: its measurements (a forward of the
model per unit and candidate) are cached apart from the walk, so a quantize stage that fails
or is re-keyed by another input re-runs the walk only, and the lock lists the search's key and
output beside the quantize stage's. The quantize stage is keyed on this stage's output digest:
the resolved recipe, not the auto entry, decides the IR.

Declared only for a model whose quantize list holds a searched entry; keyed on the quantize
list and the calibration slice, reading the calibrate stage's windows, on the device the
calibrate stage resolved.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ingot.calibration.dataset import CalibrationSet

from ..model.load import CheckpointReader
from ..quantize.method import QuantEntry, SearchInputs, method_of
from ..recipe.quantize import Quantize, quantize_entry
from .calibrate import Calibrated, read_device_settings
from .stage import Input, Stage, StageJob, StageOutput

__all__ = ["PrecisionOutput", "precision_stage", "resolve_entries", "searched"]


@dataclass(frozen=True, slots=True)
class PrecisionOutput(StageOutput):
    """``precision.json``: per searched entry (by its index in the quantize list) the resolved
    entries, the record quantize.json and the manifest keep, and the measurements."""

    FILE: ClassVar[str] = "precision.json"

    def resolutions(self) -> dict[int, dict[str, Any]]:
        return {int(i): r for i, r in self._json(self.FILE).items()}

    def entries(self, entries: Sequence[Quantize]) -> list[QuantEntry]:
        """The quantize list with each searched entry replaced by its resolved entries."""
        resolved = self.resolutions()
        flat: list[QuantEntry] = []
        for i, entry in enumerate(entries):
            if i in resolved:
                flat += [quantize_entry(spec) for spec in resolved[i]["entries"]]
            else:
                flat.append(entry)
        return flat

    def records(self) -> dict[int, dict[str, Any]]:
        """{index in the quantize list: the search's record}."""
        return {i: r["record"] for i, r in self.resolutions().items()}


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
    key_slice: dict[str, Any] = {
        "quantize": [entry.model_dump(mode="json") for entry in entries],
        "calibration": calibrated.key_slice,
    }
    inputs: dict[str, Input] = {"source": source_digest, **calibrated.inputs()}
    calibrate = calibrated.stage

    def produce(job: StageJob) -> None:
        resolve_entries(source, entries, job[calibrate].dir, job.out)

    return Stage(f"{prefix}precision", PrecisionOutput, key_slice, inputs, produce)


def resolve_entries(
    source_path: Path, entries: Sequence[Quantize], calibration_dir: Path, out: Path
) -> None:
    """precision.json in ``out``: each searched entry of ``entries`` resolved on the windows."""
    calibration = CalibrationSet.load(calibration_dir)
    device = str(read_device_settings(calibration_dir).device)
    inputs = SearchInputs(CheckpointReader(source_path), calibration, device)
    resolved = {}
    for i, entry in enumerate(entries):
        method = method_of(entry)
        if method.searches(entry):
            resolution = method.search(entry, inputs)
            resolved[str(i)] = {
                "entries": [e.model_dump(mode="json") for e in resolution.entries],
                "record": resolution.record,
                "report": resolution.report,
            }
    (out / PrecisionOutput.FILE).write_text(json.dumps(resolved, indent=2, sort_keys=True) + "\n")
