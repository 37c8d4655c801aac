"""Loading a recipe file: YAML (a key given twice is an error), validation into a Recipe with
one problem line per error, and the source path resolved against the recipe's directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from .errors import RecipeError, format_validation_error
from .recipe import Recipe
from .source import LocalSource, Source

__all__ = ["load_recipe"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice is an error instead of last-one-wins."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in keys:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            keys.add(key)
        return super().construct_mapping(node, deep=deep)


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Read and validate a recipe file; raises RecipeError listing every problem found."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError([f"{file}: no such recipe file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError([f"{file}: cannot read recipe: {exc}"]) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise RecipeError([f"{file}: not valid YAML: {where}{exc.problem}"]) from None
    except yaml.YAMLError as exc:
        raise RecipeError([f"{file}: not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise RecipeError([f"{file}: a recipe must be a YAML mapping of sections (got {kind})"])
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, file, Recipe)) from None
    return _resolve_source_path(recipe, Path(path).absolute().parent)


def _resolve_source_path(recipe: Recipe, recipe_dir: Path) -> Recipe:
    # A recipe names its checkpoints relative to itself, so it builds from any working
    # directory: the target's source and a draft model's.
    update = {"source": _resolved(recipe.source, recipe_dir)}
    draft = recipe.draft()
    if draft is not None:
        resolved = draft.model_copy(update={"source": _resolved(draft.source, recipe_dir)})
        update["speculative"] = recipe.speculative.model_copy(update={"draft": resolved})
    return recipe.model_copy(update=update)


def _resolved(source: Source, recipe_dir: Path) -> Source:
    if not isinstance(source, LocalSource):
        return source
    resolved = os.path.normpath(recipe_dir / os.path.expanduser(source.path))
    return source.model_copy(update={"path": resolved})
