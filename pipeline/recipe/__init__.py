"""The recipe: one declarative YAML file that says how to build an artifact.

A recipe has one section per concern, each in its own module here: `source` (source.py),
`calibration` (calibration.py), `quantize` (quantize.py), `kv_cache` and `export` (export.py),
`targets` (targets.py), `evaluate` (evaluate.py), `interop` (interop.py), `speculative`
(speculative.py) and `artifact` (artifact.py). recipe.py puts them together into the Recipe,
load.py reads a recipe file and errors.py turns validation errors into one line per problem.
Every model forbids unknown keys and is strict (base.py). Checks that need the source model's
config live in checks.py (run by pipeline/preflight.py).

Imports ingot.common, the plug-in registries and their torch-free interfaces (pipeline.engines,
pipeline/quantize/method.py and fields.py, pipeline/model's config.py, architecture.py and
selection.py), pydantic and yaml; never torch or onnx (tests/pipeline/test_quant_plugin.py).
"""

from __future__ import annotations

from .artifact import Artifact, ArtifactSign
from .calibration import Calibration
from .errors import RecipeError, format_problem, format_validation_error
from .evaluate import Evaluate, Perplexity, SpeculativeEval
from .export import Export, KvCache
from .interop import InteropFormat
from .load import load_recipe
from .quantize import Quantize
from .recipe import STAGES, Recipe, recipe_json_schema
from .source import HubSource, LocalSource, Source
from .speculative import (
    Draft,
    DraftModelSpeculative,
    EagleHeads,
    EagleSpeculative,
    EagleTrain,
    MedusaHeads,
    MedusaSpeculative,
    MedusaTrain,
    NgramSpeculative,
    Speculative,
)
from .targets import Target

__all__ = [
    "Artifact",
    "ArtifactSign",
    "Calibration",
    "Draft",
    "DraftModelSpeculative",
    "EagleHeads",
    "EagleSpeculative",
    "EagleTrain",
    "MedusaHeads",
    "MedusaSpeculative",
    "MedusaTrain",
    "Evaluate",
    "Export",
    "HubSource",
    "InteropFormat",
    "KvCache",
    "LocalSource",
    "NgramSpeculative",
    "Perplexity",
    "Recipe",
    "RecipeError",
    "Quantize",
    "STAGES",
    "Source",
    "Speculative",
    "SpeculativeEval",
    "Target",
    "format_problem",
    "format_validation_error",
    "load_recipe",
    "recipe_json_schema",
]
