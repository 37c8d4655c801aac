"""One model's compile stages, declared: [calibrate] -> [precision] -> quantize -> export ->
engine per target, for the target and (prefixed ``draft-``) a draft model, with the recipe's
kv_cache, export and targets (a draft's block size must be the target's). The precision stage
comes with an entry resolved by a search (`method: auto`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines.base import engine_name, ships_portable
from ..manifest_fields import ModelRecords
from ..recipe import Quantize, Recipe
from .calibrate import Calibrated, PreparedCalibration, calibrate_stage
from .engine import EngineOutput, engine_stage
from .export import ExportOutput, export_stage
from .precision import PrecisionOutput, precision_stage
from .quantize import QuantizeOutput, quantize_stage
from .stage import Stage
from .walk import Walk

__all__ = ["ModelOutputs", "ModelSource", "ModelStages", "declare_model"]


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One model the recipe compiles: the target (stage names as they are), or a draft model
    (stage names prefixed ``draft-``, its source in their inputs: neither model's change
    re-keys the other's stages)."""

    prefix: str
    path: Path
    digest: str  # the source's: its pinned files' digest
    entries: Sequence[Quantize]
    calibration: PreparedCalibration | None  # its windows, when a stage needs them


@dataclass(frozen=True, slots=True)
class ModelOutputs:
    """What one model's stages wrote."""

    quantize: QuantizeOutput
    export: ExportOutput
    engines: Mapping[str, EngineOutput]  # by engine name, in the recipe's target order

    def records(self, root: str = "", portable: bool = False) -> ModelRecords:
        """What the manifest records of the model, its engines under `root` in the artifact,
        its portable graph beside them where `ships_portable` says so (`portable`: asked for)."""
        engines = [engine.record() for engine in self.engines.values()]
        return ModelRecords(
            quantization=self.quantize.summary(),
            graph=self.export.graph_info(),
            engines=engines,
            checks=[engine.check() for engine in self.engines.values()],
            root=root,
            portable=ships_portable(engines, portable),
        )


@dataclass(frozen=True, slots=True)
class ModelStages:
    """One model's declared stages."""

    calibrated: Calibrated | None
    quantize: Stage[QuantizeOutput]
    export: Stage[ExportOutput]
    engines: Mapping[str, Stage[EngineOutput]]  # by engine name, in the recipe's target order
    precision: Stage[PrecisionOutput] | None = None  # with a searched (auto) entry

    @property
    def first_engine(self) -> str:
        """The first target's engine name: the one the runtime prefers."""
        return next(iter(self.engines))

    def stages(self) -> list[Stage[Any]]:
        calibrate = [self.calibrated.stage] if self.calibrated is not None else []
        precision = [self.precision] if self.precision is not None else []
        return [*calibrate, *precision, self.quantize, self.export, *self.engines.values()]

    def outputs(self, walk: Walk) -> ModelOutputs:
        engines = {name: walk[stage] for name, stage in self.engines.items()}
        return ModelOutputs(walk[self.quantize], walk[self.export], engines)


def declare_model(
    recipe: Recipe, model: ModelSource, aux_layers: tuple[int, ...] | None = None
) -> ModelStages:
    """The model's stages; `aux_layers`: the graph also outputs those layers' entering states
    (an EAGLE-3 draft's inputs)."""
    calibrated = None
    if model.calibration is not None:  # a GPTQ / AWQ entry, an int8 / fp8 KV cache, heads
        calibrated = calibrate_stage(model.prefix, model.digest, model.calibration)
    args = (model.prefix, model.path, model.digest, model.entries, calibrated)
    precision = precision_stage(*args)  # an auto entry resolved first
    quantize = quantize_stage(*args, precision)
    export = export_stage(model.prefix, recipe, quantize, calibrated, aux_layers)
    engines = {
        engine_name(target): engine_stage(model.prefix, target, export, quantize)
        for target in recipe.targets
    }
    return ModelStages(calibrated, quantize, export, engines, precision)
