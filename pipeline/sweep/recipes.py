"""Each variant as a full recipe file, DIR/recipes/<name>.yaml, checked before any build: the
recipe model's validation and the build's own preflight (stages/prepare.py: the source, the
recipe against the model, the data). A variant that fails is kept with its one-line reason
and never built."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ingot.common.errors import IngotError

from ..recipe import Recipe, load_recipe
from ..recipe.load import _UniqueKeyLoader
from ..stages.prepare import prepare
from .errors import SweepError
from .paths import absolute_paths
from .variants import Variant, VariantPathError, set_path

__all__ = ["VariantRecipe", "base_recipe", "one_line", "write_variants"]

RECIPES = "recipes"  # DIR/recipes/<name>.yaml


@dataclass(frozen=True, slots=True)
class VariantRecipe:
    variant: Variant
    path: Path  # DIR/recipes/<name>.yaml
    error: str | None  # why it cannot be built, one line; None when it passed the preflight
    tokenizer: Path | None = None  # its source's tokenizer.json (the ood text's tokens)
    seq_len: int = 0  # its evaluate.perplexity windows, which the ood text's follow
    max_windows: int | None = None

    @property
    def name(self) -> str:
        return self.variant.name


def base_recipe(path: Path) -> Recipe:
    """The base recipe, validated; SweepError unless it has `evaluate.perplexity`, whose
    windows the sweep's quality (kl, perplexity) is measured on."""
    recipe = load_recipe(path)
    if recipe.evaluate is None or recipe.evaluate.perplexity is None:
        raise SweepError(
            f"{path}: evaluate.perplexity: required by ingot sweep (kl and perplexity are "
            "measured on its windows, perplexity_ood with its seq_len and max_windows)"
        )
    return recipe


def write_variants(base: Path, variants: list[Variant], out: Path) -> list[VariantRecipe]:
    """Write and check every variant of the recipe at `base`; axis values that are paths are
    relative to `base`, like its own."""
    recipe = base_recipe(base)
    data = yaml.load(base.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    defaults = recipe.model_dump(mode="json")
    (out / RECIPES).mkdir(parents=True, exist_ok=True)
    return [_write_one(base, data, defaults, v, out) for v in variants]


def _write_one(
    base: Path, data: dict[str, Any], defaults: dict[str, Any], variant: Variant, out: Path
) -> VariantRecipe:
    path = out / RECIPES / f"{variant.name}.yaml"
    recipe = copy.deepcopy(data)
    try:
        for field, value in variant.values.items():
            set_path(recipe, field, value, defaults)
    except VariantPathError as e:
        path.unlink(missing_ok=True)  # no stale file from an earlier run beside the error
        return VariantRecipe(variant, path, str(e))
    absolute_paths(recipe, base.absolute().parent)
    path.write_text(_header(base, variant) + yaml.safe_dump(recipe, sort_keys=False))
    try:
        inputs = prepare(path)
    except (IngotError, OSError) as e:
        return VariantRecipe(variant, path, one_line(e, path))
    spec = inputs.evaluation.spec if inputs.evaluation is not None else None
    if spec is None:
        return VariantRecipe(variant, path, "evaluate.perplexity: the variant removes it")
    tokenizer = inputs.source.path / "tokenizer.json"
    return VariantRecipe(variant, path, None, tokenizer, spec.seq_len, spec.max_windows)


def _header(base: Path, variant: Variant) -> str:
    lines = [f"# ingot sweep: variant {variant.name} of {base.name}, with"]
    lines += [f"#   {field}: {value!r}" for field, value in variant.values.items()]
    return "\n".join(lines) + "\n"


def one_line(error: BaseException, recipe: Path | None = None) -> str:
    """An error's text as one line, without the recipe file's own path in front of each
    problem (sweep.json says which recipe it is)."""
    text = str(error)
    if recipe is not None:
        text = text.replace(f"{recipe}: ", "").replace(f"{recipe.absolute()}: ", "")
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())
