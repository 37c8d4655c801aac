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
from pathlib import Path

from ingot.calibration.dataset import CalibrationSet

from ..device import DeviceSettings
from ..model.load import CheckpointReader
from ..quantize.driver import quantize_layers
from ..quantize.layerwise import needs_calibration
from ..recipe.quantize import Quantize
from .calibrate import read_device_settings

__all__ = ["run_quantize"]

_LOCAL_WORK = ".layers"  # a dot-name: never part of the output's digest


def run_quantize(
    source_path: Path,
    entries: Sequence[Quantize],
    out: Path,
    *,
    calibration_dir: Path | None = None,
    work_dir: Path | None = None,
) -> None:
    calibration, settings = None, DeviceSettings()
    if needs_calibration(entries):
        if calibration_dir is None or work_dir is None:
            raise ValueError("quantize: gptq / awq need the calibration windows and a work dir")
        calibration = CalibrationSet.load(calibration_dir)
        settings = read_device_settings(calibration_dir)  # what the stage's key holds
    source = CheckpointReader(source_path)
    work = work_dir if work_dir is not None else out / _LOCAL_WORK
    try:
        summaries = quantize_layers(
            source,
            entries,
            out,
            work,
            calibration,
            device=settings.device,
            offload=settings.offload,
        )
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    (out / "quantize.json").write_text(json.dumps(summaries, indent=2, sort_keys=True) + "\n")
