"""The build's stage graph: every stage a recipe needs, declared from the prepared inputs
before any stage runs, in dependency order:

    [calibrate] -> quantize -> export -> engine:<name> per target      (the target)
    heads | eagle                                                      (speculative method)
    [draft-calibrate] -> draft-quantize -> draft-export -> draft-engine:<name> per target
    interop:<format> per format
    [evaluate]

The walk (`walk.py`) runs them in that order through the cache; `StageGraph.outputs` then
gives their outputs by what they are, for the gates and the package step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .eagle import EagleOutput, eagle_aux_layers, eagle_stage
from .evaluate import EvaluateOutput, evaluate_stage
from .heads import HeadsOutput, heads_stage
from .interop import InteropOutput, interop_stage
from .model import ModelOutputs, ModelSource, ModelStages, declare_model
from .prepare import BuildInputs, source_digest
from .stage import Stage
from .walk import Walk

__all__ = ["BuildOutputs", "StageGraph", "declare_stages"]


@dataclass(frozen=True, slots=True)
class BuildOutputs:
    """What the walk's stages wrote, by what they are."""

    target: ModelOutputs
    draft: ModelOutputs | None
    heads: HeadsOutput | None
    eagle: EagleOutput | None
    interop: Mapping[str, InteropOutput]  # by format, in the recipe's order
    evaluation: EvaluateOutput | None


@dataclass(frozen=True, slots=True)
class StageGraph:
    """The declared stages of one build."""

    target: ModelStages
    heads: Stage[HeadsOutput] | None
    eagle: Stage[EagleOutput] | None
    draft: ModelStages | None
    interop: Mapping[str, Stage[InteropOutput]]
    evaluate: Stage[EvaluateOutput] | None

    def stages(self) -> list[Stage[Any]]:
        """Every stage, in the order the walk runs them (each after what it reads)."""
        drafters = [s for s in (self.heads, self.eagle) if s is not None]
        draft = self.draft.stages() if self.draft is not None else []
        evaluate = [self.evaluate] if self.evaluate is not None else []
        return [*self.target.stages(), *drafters, *draft, *self.interop.values(), *evaluate]

    def outputs(self, walk: Walk) -> BuildOutputs:
        def out(stage: Stage[Any] | None) -> Any:
            return walk[stage] if stage is not None else None

        return BuildOutputs(
            target=self.target.outputs(walk),
            draft=self.draft.outputs(walk) if self.draft is not None else None,
            heads=out(self.heads),
            eagle=out(self.eagle),
            interop={fmt: walk[stage] for fmt, stage in self.interop.items()},
            evaluation=out(self.evaluate),
        )


def declare_stages(inputs: BuildInputs) -> StageGraph:
    """Every stage the recipe needs, from its prepared inputs (RecipeError for EAGLE-3 aux
    layers that cannot serve: still before any stage runs)."""
    recipe, source = inputs.recipe, inputs.source
    method = recipe.speculative.method if recipe.speculative is not None else None
    aux_layers = None  # the target layers an EAGLE-3 draft reads (the graph outputs them)
    if method == "eagle":
        spec = recipe.speculative.heads
        aux_layers = eagle_aux_layers(spec, inputs.cfg.num_layers, inputs.eagle)
    digest = source_digest(source)
    model = ModelSource("", source.path, digest, recipe.quantize, inputs.calibration)
    target = declare_model(recipe, model, aux_layers)
    heads = eagle = draft = None
    if method == "medusa":
        heads = heads_stage(recipe, target.quantize, target.calibrated, inputs.heads)
    elif method == "eagle":
        verifier = getattr(recipe.source, "hub", None) or source.path.name  # for speculators
        eagle = eagle_stage(recipe, target.quantize, target.calibrated, inputs.eagle, verifier)
    if inputs.draft is not None:
        d = inputs.draft
        model = ModelSource(
            "draft-", d.source.path, source_digest(d.source), d.quantize, inputs.draft_calibration
        )
        draft = declare_model(recipe, model)
    interop = {
        fmt: interop_stage(fmt, recipe, target.quantize, target.export, source.path, digest)
        for fmt in recipe.stage_slice("interop")["interop"]
    }
    evaluate = None
    if inputs.evaluation is not None or inputs.speculative is not None:
        evaluate = evaluate_stage(inputs, target, draft, heads, eagle)
    return StageGraph(target, heads, eagle, draft, interop, evaluate)
