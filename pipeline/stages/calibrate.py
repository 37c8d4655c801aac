"""Stage: calibration data -> the token windows GPTQ / AWQ (and the scales of an int8 / fp8
KV cache, in the export stage) run through the model.

The data is read, tokenized and sampled while the build validates (seconds, before any model
work), so a missing, unreadable or too-small dataset fails first; the stage then only stores
the windows (``tokens.safetensors`` + ``calibration.json``) in the cache for the quantize stage.

`calibration.device` is resolved while preparing too (`device.py`: `auto` -> cuda when torch
sees one, else cpu; cuda on a host without one fails in one line), and travels to the quantize
stage with the windows: ``device.json`` holds the resolved device and the `offload` setting,
and the stage's key slice (which is also the quantize stage's `calibration` slice) holds them
whenever they are not the defaults. So a device that resolves to cpu leaves both keys as they
were, and a CUDA run, whose kernels round differently, is never served a CPU run's output (nor
the reverse).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ingot.calibration.dataset import CalibrationSet, is_local_dataset, load_calibration

from ..chat_template import chat_template_of
from ..device import DeviceSettings, resolve_device
from ..model.config import ModelConfig
from ..quantize.layerwise import needs_calibration
from ..recipe import Quantize, Recipe
from ..vocabulary_fit import bos_eos_tokens
from .stage import Input, Stage, StageOutput

__all__ = [
    "CalibrateOutput",
    "Calibrated",
    "PreparedCalibration",
    "calibrate_stage",
    "prepare_calibration",
    "read_device_settings",
]

_RUN_FIELDS = ("device", "offload")  # how the quantize stage runs, not what the windows are


@dataclass(frozen=True, slots=True)
class CalibrateOutput(StageOutput):
    """``tokens.safetensors`` + ``calibration.json`` (the windows: `CalibrationSet.save`) and
    ``device.json`` (the resolved device and the offload setting)."""

    DEVICE: ClassVar[str] = "device.json"  # {"device": resolved, "offload": "cpu" | "disk"}


@dataclass(frozen=True, slots=True)
class PreparedCalibration:
    calibration: CalibrationSet
    section: dict[str, Any]  # the recipe's calibration section, as written
    settings: DeviceSettings = DeviceSettings()  # the section's device, resolved on this host

    @property
    def key_slice(self) -> dict[str, Any]:
        """What the stage depends on besides the data's digest: not where the data lives, and
        the device settings only where they differ from the defaults (cpu, cpu)."""
        keyed = {k: v for k, v in self.section.items() if k != "dataset" and k not in _RUN_FIELDS}
        if self.settings.device != "cpu":
            keyed["device"] = self.settings.device
        if self.settings.offload != "cpu":
            keyed["offload"] = self.settings.offload
        return keyed

    @property
    def lock_entry(self) -> dict[str, Any]:
        entry = self.calibration.lock_entry(self.section)
        entry["resolved_device"] = self.settings.device  # `auto` as it resolved here
        return entry

    def save(self, out: Path) -> None:
        self.calibration.save(out)
        settings = {"device": self.settings.device, "offload": self.settings.offload}
        text = json.dumps(settings, indent=2, sort_keys=True) + "\n"
        (out / CalibrateOutput.DEVICE).write_text(text)


def read_device_settings(calibration_dir: Path) -> DeviceSettings:
    """The device settings a calibrate stage output carries (cpu, cpu without the file)."""
    file = calibration_dir / CalibrateOutput.DEVICE
    if not file.is_file():
        return DeviceSettings()
    data = json.loads(file.read_text())
    return DeviceSettings(data["device"], data["offload"])


@dataclass(frozen=True, slots=True)
class Calibrated:
    """A calibrate stage and the windows it stores: what a stage that reads them adds to its
    key (the calibration slice, the data's digest and the calibrate stage's output)."""

    stage: Stage[CalibrateOutput]
    prepared: PreparedCalibration

    @property
    def key_slice(self) -> dict[str, Any]:
        return self.prepared.key_slice

    def inputs(self) -> dict[str, Input]:
        return {"dataset": self.prepared.calibration.dataset_digest, "calibrate": self.stage}


def calibrate_stage(prefix: str, source_digest: str, prepared: PreparedCalibration) -> Calibrated:
    """The calibrate stage of one model (`prefix`: "" for the target, "draft-" for a draft
    model): keyed on the calibration slice, the source and the data; stores the windows."""
    inputs = {"source": source_digest, "dataset": prepared.calibration.dataset_digest}
    stage = Stage(
        f"{prefix}calibrate",
        CalibrateOutput,
        prepared.key_slice,
        inputs,
        lambda job: prepared.save(job.out),
    )
    return Calibrated(stage, prepared)


def prepare_calibration(
    recipe: Recipe,
    recipe_path: Path,
    source_path: Path,
    cfg: ModelConfig,
    entries: Sequence[Quantize] | None = None,
) -> PreparedCalibration | None:
    """The recipe's calibration windows, tokenized by the checkpoint at `source_path` (of
    config `cfg`), and its device resolved on this host; None when no entry of `entries` (the
    recipe's `quantize` by default; a draft model's list) needs them, the KV cache is not
    int8 / fp8, whose scales are calibrated on them, and no Medusa heads are trained on them
    (RTN ignores the whole section, device included)."""
    trains_heads = entries is None and recipe.trains_heads()  # the target's windows only
    entries = recipe.quantize if entries is None else entries
    if not needs_calibration(entries) and not recipe.kv_cache.quantized and not trains_heads:
        return None
    settings = DeviceSettings(
        resolve_device(recipe.calibration.device, file=str(recipe_path)),
        recipe.calibration.offload,
    )  # before the data is read: a missing GPU is the cheaper failure
    # As JSON: ingot.calibration sits below the recipe and reads plain fields.
    section = recipe.stage_slice("calibrate")["calibration"]
    dataset = section["dataset"]
    base = Path(recipe_path).absolute().parent
    if is_local_dataset(dataset, base) and not Path(os.path.expanduser(dataset)).is_absolute():
        dataset = str(base / dataset)  # local data is named relative to the recipe
    calibration = load_calibration(
        {**section, "dataset": dataset},
        source_path / "tokenizer.json",
        eos_token_id=cfg.eos_token_ids[0] if cfg.eos_token_ids else None,
        chat_template=chat_template_of(source_path),
        special_tokens=bos_eos_tokens(source_path),
    )
    return PreparedCalibration(calibration, section, settings)
