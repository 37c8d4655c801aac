"""The `targets` section: the engines the artifact is built for, one per engine and device.

An entry is validated by its engine's target model: the union of every registered engine
builder's `target_model` (pipeline/engines: `ENGINE_BUILDERS`), told apart by ``engine``; the
rest of the recipe against each target by its builder's `recipe_problems` (`target_problems`).
"""

from __future__ import annotations

import operator
from functools import reduce
from typing import Annotated, Any

from pydantic import Field
from pydantic_core import PydanticCustomError

from ..engines import ENGINE_BUILDERS
from ..engines.base import EngineTarget

__all__ = ["DEFAULT_TARGETS", "Target", "target_problems"]

# The recipe's targets when it names none: ONNX Runtime on the CPU, which every host runs.
DEFAULT_TARGETS = [ENGINE_BUILDERS.get("onnxruntime").target_model(engine="onnxruntime")]


def _target_union() -> Any:
    """The registered engines' target models as one union on ``engine`` (a single model when
    one engine is registered: the same schema as a one-member union)."""
    models = [builder.target_model for builder in ENGINE_BUILDERS]
    return Annotated[reduce(operator.or_, models), Field(discriminator="engine")]


Target = _target_union()


def _check_unique_targets(targets: list[EngineTarget]) -> list[EngineTarget]:
    # Each target gets its own engines/<engine>-<device>/ directory in the artifact.
    seen: dict[tuple[str, str], int] = {}
    for index, target in enumerate(targets):
        key = (target.engine, target.device)
        if key in seen:
            raise PydanticCustomError(
                "duplicate_target",
                "targets {first} and {second} are both {engine} on {device}",
                {"first": seen[key], "second": index, "engine": key[0], "device": key[1]},
            )
        seen[key] = index
    return targets


def target_problems(recipe: Any) -> list[str]:
    """One line per part of ``recipe`` (a `Recipe`) that one of its targets' engines cannot
    run (the engine's builder says which: `EngineBuilder.recipe_problems`), in target order."""
    return [
        problem
        for target in recipe.targets
        for problem in ENGINE_BUILDERS.get(target.engine).recipe_problems(target, recipe)
    ]
