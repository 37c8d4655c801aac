"""`speculative.heads.attach` with method eagle: an EAGLE-3 checkpoint in the speculators
format, checked against the target before any stage runs (config.json only: its vocabulary,
the target hidden size fc reads, the aux layers it taps); its tensors are checked when the
eagle stage loads it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..cache import directory_digest
from ..model.config import ModelConfig
from ..model.eagle3 import Eagle3Config, Eagle3Error, load_eagle3_config
from ..recipe import Recipe, RecipeError
from .attach import attach_dir, size_mismatches

__all__ = ["AttachedEagle", "resolve_eagle"]

_WHERE = "speculative.heads.attach"


@dataclass(frozen=True, slots=True)
class AttachedEagle:
    path: Path
    digest: str  # over the directory's files: the eagle stage's input
    cfg: Eagle3Config


def resolve_eagle(recipe: Recipe, recipe_path: Path, target: ModelConfig) -> AttachedEagle | None:
    """The attached EAGLE-3 directory (relative to the recipe file) with its digest and
    config, checked against the target; None when the recipe attaches none; RecipeError
    naming the field and the file otherwise."""
    spec = recipe.speculative
    if spec is None or spec.method != "eagle" or spec.heads.attach is None:
        return None
    path = attach_dir(spec.heads.attach, recipe_path, "an EAGLE-3 speculators checkpoint")
    try:
        cfg = load_eagle3_config(path, target.num_layers)
    except Eagle3Error as e:
        raise RecipeError([f"{_WHERE}: {e}"]) from None
    problems = size_mismatches(
        path,
        ("vocab_size", cfg.vocab_size, target.vocab_size),
        ("target_hidden_size", cfg.target_hidden_size, target.hidden_size),
    )
    if problems:
        raise RecipeError(problems)
    return AttachedEagle(path, directory_digest(path)[0], cfg)
