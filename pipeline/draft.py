"""The draft model of `speculative.method: draft_model`: its checkpoint resolved (files
hashed, remote code refused, like the target's) and checked against the target's before any
stage runs."""

from __future__ import annotations

from dataclasses import dataclass

from .model.config import ConfigError, ModelConfig
from .preflight import check_draft_against_target
from .recipe import Quantize, Recipe, RecipeError
from .source import ResolvedSource, SourceError, resolve_source

__all__ = ["DraftModel", "resolve_draft"]


@dataclass(frozen=True, slots=True)
class DraftModel:
    source: ResolvedSource
    cfg: ModelConfig
    quantize: list[Quantize]  # its own entries, else the target's


def resolve_draft(
    recipe: Recipe, target: ResolvedSource, target_cfg: ModelConfig
) -> DraftModel | None:
    """The recipe's draft model, checked against the target (`target`, `target_cfg`); None
    when the recipe builds none. Raises SourceError or RecipeError naming speculative.draft."""
    spec = recipe.draft()
    if spec is None:
        return None
    try:
        source = resolve_source(spec.source.model_dump(mode="json"))
    except SourceError as e:  # its messages name `source.path`: say whose source it is
        message = str(e)
        sep = "." if message.startswith("source.") else ".source: "
        raise SourceError(f"speculative.draft{sep}{message}") from None
    try:
        cfg = ModelConfig.from_hf(source.hf_config)  # an unsupported architecture fails here
    except ConfigError as e:
        raise RecipeError([f"speculative.draft.source: {e}"]) from None
    check_draft_against_target(
        recipe, cfg, target_cfg, draft_dir=source.path, target_dir=target.path
    )
    return DraftModel(source, cfg, list(recipe.draft_quantize()))
