"""Stage: quantize the source checkpoint into the IR, one decoder layer at a time.

Every recipe goes through `quantize.driver.quantize_layers` over the checkpoint read lazily
(`CheckpointReader`): each layer is read when its turn comes, quantized (RTN alone, or GPTQ /
AWQ on the calibrate stage's windows), written to the work directory and let go; the IR is then
assembled tensor by tensor. A calibrated build's work directory is the stage cache's (a killed
build resumes there); an RTN build's lives inside the output and goes before it is cached.

GPTQ / AWQ run on the device the calibrate stage resolved (its ``device.json``: the recipe's
`calibration.device` and `offload`, which the calibrate stage's key holds); RTN on the CPU.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ingot.calibration.dataset import CalibrationSet

from ..device import DeviceSettings
from ..model.architecture import fused_names, linear_names
from ..model.load import CheckpointReader
from ..quantize.driver import LayerCheckpoints, quantize_layers
from ..quantize.layerwise import needs_calibration
from ..quantize.method import QuantEntry
from ..quantize.summary import summaries
from ..recipe.quantize import Quantize
from .calibrate import Calibrated, read_device_settings
from .precision import PrecisionOutput
from .stage import Input, Stage, StageJob, StageOutput

__all__ = ["QuantizeOutput", "quantize_stage", "run_quantize"]

_LOCAL_WORK = ".layers"  # a dot-name: never part of the output's digest


@dataclass(frozen=True, slots=True)
class QuantizeOutput(StageOutput):
    """The IR (``ir_config.json``, ``ir.safetensors``: `quantize.checkpoint`, read by
    `IRLayers` / `load_ir` on `dir`), ``quantize.json`` (what each entry quantized) and, with
    a searched entry (auto), ``resolved.json`` (the entries it resolved to)."""

    SUMMARY: ClassVar[str] = "quantize.json"
    RESOLVED: ClassVar[str] = "resolved.json"

    def summary(self) -> Any:
        """quantize.json: the manifest's `model.quantization`."""
        return self._json(self.SUMMARY)

    def resolved(self) -> dict[str, Any] | None:
        """resolved.json: {index of a searched entry: its resolved entries} (ingot.lock), or
        None without a searched entry."""
        return self._json(self.RESOLVED) if (self.dir / self.RESOLVED).exists() else None


def quantize_stage(
    prefix: str,
    source: Path,
    source_digest: str,
    entries: Sequence[Quantize],
    calibrated: Calibrated | None,
    precision: Stage[PrecisionOutput] | None = None,
) -> Stage[QuantizeOutput]:
    """The quantize stage of one model (`prefix` "" or "draft-"), on the calibrate stage's
    windows when a GPTQ / AWQ entry needs them (resumable then); an RTN recipe's key holds no
    calibration, even when its KV cache's scales need one. With a `precision` stage (an auto
    entry) it runs the entries that stage resolved, keyed on its output."""
    # The slice is the entries' JSON (what Recipe.stage_slice("quantize") gives the target)
    key_slice: dict[str, Any] = {"quantize": [entry.model_dump(mode="json") for entry in entries]}
    inputs: dict[str, Input] = {"source": source_digest}
    calibrate = None
    if needs_calibration(entries):
        if calibrated is None:
            raise ValueError(f"{prefix}quantize: gptq / awq need the calibrate stage")
        calibrate = calibrated.stage
        key_slice["calibration"] = calibrated.key_slice
        inputs |= calibrated.inputs()
    if precision is not None:
        inputs["precision"] = precision

    def produce(job: StageJob) -> None:
        c_dir = job[calibrate].dir if calibrate is not None else None
        searched = job[precision] if precision is not None else None
        run_quantize(
            source, entries, job.out, calibration_dir=c_dir, work_dir=job.work, searched=searched
        )

    resumable = calibrate is not None  # its layers' checkpoints survive a crash
    return Stage(
        f"{prefix}quantize", QuantizeOutput, key_slice, inputs, produce, resumable=resumable
    )


def run_quantize(
    source_path: Path,
    entries: Sequence[Quantize],
    out: Path,
    *,
    calibration_dir: Path | None = None,
    work_dir: Path | None = None,
    searched: PrecisionOutput | None = None,
) -> None:
    """The IR and quantize.json in ``out``; a searched entry is resolved from its measurements
    (``searched``: the precision stage's output) and its entries run in its place."""
    source = CheckpointReader(source_path)
    resolved = searched.resolve(entries, source.cfg) if searched is not None else None
    walked: Sequence[QuantEntry] = entries if resolved is None else resolved.walked()
    calibration, settings = None, DeviceSettings()
    if needs_calibration(walked):
        if calibration_dir is None or work_dir is None:
            raise ValueError("quantize: gptq / awq need the calibration windows and a work dir")
        calibration = CalibrationSet.load(calibration_dir)
        settings = read_device_settings(calibration_dir)  # what the stage's key holds
    work = work_dir if work_dir is not None else out / _LOCAL_WORK
    try:
        quantize_layers(
            source,
            walked,
            out,
            work,
            calibration,
            device=settings.device,
            offload=settings.offload,
        )
        experts = LayerCheckpoints(work, source.cfg).experts()  # how each was calibrated
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    records = summaries(
        entries,
        linear_names(source.cfg),
        resolved.records() if resolved is not None else None,
        fused_names(source.cfg),
        experts=experts,
    )
    if resolved is not None:
        (out / QuantizeOutput.RESOLVED).write_text(json.dumps(resolved.lock_entry()) + "\n")
    (out / QuantizeOutput.SUMMARY).write_text(json.dumps(records, indent=2, sort_keys=True) + "\n")
