"""`speculative.heads.attach`: an existing Medusa checkpoint, checked against the target before
any stage runs (its sizes from config.json; its tensors when the heads stage loads it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..cache import directory_digest
from ..model.config import ModelConfig
from ..model.medusa import (
    CONFIG_FILE,
    MedusaError,
    MedusaHeadsModel,
    load_medusa,
    load_medusa_config,
)
from ..recipe import Recipe, RecipeError

__all__ = ["AttachedHeads", "attach_dir", "load_attached", "resolve_heads", "size_mismatches"]

_WHERE = "speculative.heads.attach"


@dataclass(frozen=True, slots=True)
class AttachedHeads:
    path: Path
    digest: str  # over the directory's files: the heads stage's input


def resolve_heads(recipe: Recipe, recipe_path: Path, target: ModelConfig) -> AttachedHeads | None:
    """The attached heads' directory (relative to the recipe file) with its digest, checked
    against the target: vocab_size, hidden_size, at least num_speculative_tokens heads.
    None when the recipe attaches none; RecipeError naming the field otherwise."""
    spec = recipe.speculative
    if spec is None or spec.method != "medusa" or spec.heads.attach is None:
        return None
    heads = spec.heads
    path = attach_dir(heads.attach, recipe_path, "a Medusa checkpoint dir")
    try:
        cfg = load_medusa_config(path)
    except MedusaError as e:
        raise RecipeError([f"{_WHERE}: {e}"]) from None
    problems = size_mismatches(
        path,
        ("vocab_size", cfg.vocab_size, target.vocab_size),
        ("hidden_size", cfg.hidden_size, target.hidden_size),
    )
    k = recipe.speculative.num_speculative_tokens
    if cfg.num_heads < k:
        problems.append(
            f"{_WHERE}: {cfg.num_heads} heads cannot propose num_speculative_tokens {k} tokens "
            "(one head per token)"
        )
    if problems:
        raise RecipeError(problems)
    return AttachedHeads(path, directory_digest(path)[0])


def size_mismatches(path: Path, *sizes: tuple[str, int, int]) -> list[str]:
    """One problem per (name, the checkpoint's, the target's) size that differs, naming the
    attached directory's config.json."""
    return [
        f"{_WHERE}: {name} {mine} differs from the target's {theirs} ({path / CONFIG_FILE})"
        for name, mine, theirs in sizes
        if mine != theirs
    ]


def attach_dir(attach: str, recipe_path: Path, what: str) -> Path:
    """`speculative.heads.attach` resolved against the recipe file's directory; RecipeError
    unless it holds a config.json (``what`` says which checkpoint was expected)."""
    path = Path(attach).expanduser()
    if not path.is_absolute():
        path = Path(recipe_path).absolute().parent / path
    if not (path / CONFIG_FILE).is_file():
        raise RecipeError([f"{_WHERE}: {path} has no {CONFIG_FILE} ({what})"])
    return path


def load_attached(heads: AttachedHeads) -> MedusaHeadsModel:
    """The attached heads' weights (tensors checked against config.json)."""
    return load_medusa(heads.path)
