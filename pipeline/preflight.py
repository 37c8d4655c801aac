"""Everything a recipe is checked against before any build work: the source model's config
(and its model family's blocks), and a draft model's checkpoint against the target's.

The recipe's own schema (pydantic) is checked when it loads; what needs the model's widths and
module names is checked here, section by section, and reported together, one line a problem.
"""

from __future__ import annotations

from pathlib import Path

from .engines import ENGINE_BUILDERS
from .export import decoder
from .interop.checks import interop_problems
from .model import layers
from .model.config import ModelConfig
from .model.family import ModelFamily
from .recipe import Recipe, RecipeError
from .recipe.checks import model_problems, quantize_problems
from .recipe.embedding import default_entry
from .vocabulary import vocabulary_differences

__all__ = [
    "check_draft_against_target",
    "check_recipe_against_model",
    "family_problems",
    "with_model_defaults",
    "mixed_window_problems",
]

_DRAFT = "speculative.draft"


def check_recipe_against_model(
    recipe: Recipe, cfg: ModelConfig, *, recipe_file: str | None = None
) -> None:
    """Raise RecipeError listing every way `recipe` does not fit the model of `cfg`.

    `recipe_file`, when given, prefixes each problem like load_recipe's messages.
    """
    problems = family_problems(cfg.family, "source")
    problems += mixed_window_problems(cfg, "source", recipe)
    problems += model_problems(recipe, cfg) + interop_problems(recipe, cfg)
    problems += [  # what each target's engine cannot run of the model (its builder says)
        problem
        for index, target in enumerate(recipe.targets)
        for problem in ENGINE_BUILDERS.get(target.engine).model_problems(
            target, cfg, f"targets.{index}"
        )
    ]
    _raise(problems, recipe_file)


def with_model_defaults(recipe: Recipe, cfg: ModelConfig) -> Recipe:
    """`recipe` with what it leaves to the model's size: the embedding and lm_head entry a
    source of 1e9 parameters or more gets (`recipe/embedding.py`), appended to `quantize`,
    unless an interop format of the recipe cannot hold it (it then stays as written)."""
    entry = default_entry(recipe, cfg)
    if entry is None:
        return recipe
    resolved = recipe.model_copy(update={"quantize": [*recipe.quantize, entry]})
    if len(interop_problems(resolved, cfg)) > len(interop_problems(recipe, cfg)):
        return recipe
    return resolved


def family_problems(family: ModelFamily, where: str) -> list[str]:
    """The blocks `family` names (its norm, its activation) that the IR (model/layers.py) or
    the ONNX decoder (export/decoder.py) does not implement: a plug-in family built on blocks
    ingot lacks fails here, naming them, rather than in the middle of a stage."""
    named = (
        ("norm", family.norm, layers.NORMS, decoder.NORMS),
        ("activation", family.activation, layers.ACTIVATIONS, decoder.ACTIVATIONS),
    )
    return [
        f"{where}: model family {family.name!r} needs the {kind} {value!r}, which ingot does "
        f"not implement (implemented: {', '.join(sorted(set(torch_blocks) & set(onnx_blocks)))})"
        for kind, value, torch_blocks, onnx_blocks in named
        if value not in torch_blocks or value not in onnx_blocks
    ]


def mixed_window_problems(cfg: ModelConfig, where: str, recipe: Recipe | None = None) -> list[str]:
    """A model mixing local and global layers: its graph gives the local layers inputs of
    their own, which only a graph that writes its pool has (not fp8's, `recipe`'s
    kv_cache.dtype), and a draft model runs on one block table (`recipe` None: the draft)."""
    if cfg.layer_windows is None:
        return []
    local = [i for i, w in enumerate(cfg.layer_windows) if w is not None]
    mixed = (
        f"config.json layer_types / max_window_layers: layers {local} of {cfg.num_layers} "
        f"slide (window {cfg.sliding_window}) and the others attend to the whole context"
    )
    if recipe is None:
        return [f"{where}: {mixed}; a draft model mixing local and global layers is not supported"]
    if recipe.kv_cache.dtype == "fp8":
        return [
            f"kv_cache.dtype: fp8 returns the call's K/V instead of writing the pool, which a "
            f"model mixing local and global layers needs ({mixed}); use fp16, fp32 or int8"
        ]
    return []


def check_draft_against_target(
    recipe: Recipe,
    draft: ModelConfig,
    target: ModelConfig,
    *,
    draft_dir: Path,
    target_dir: Path,
    recipe_file: str | None = None,
) -> None:
    """Raise RecipeError listing every way the draft checkpoint (config `draft`, files in
    `draft_dir`) cannot serve the target's: the target verifies the draft's token ids with its
    own logits (same tokenizer, same vocab_size), the draft runs at every position the target
    does (max_seq_len), and the draft's quantize entries must fit the draft."""
    source = f"{_DRAFT}.source"
    problems = family_problems(draft.family, source) + mixed_window_problems(draft, source)
    if draft.vocab_size != target.vocab_size:
        problems.append(
            f"{source}: vocab_size {draft.vocab_size} in the draft's config.json differs from "
            f"the target's {target.vocab_size} (the draft's logits must index the target's "
            "vocabulary)"
        )
    problems += [
        f"{source}: tokenizer.json differs from the target's: {difference}"
        for difference in vocabulary_differences(
            target_dir / "tokenizer.json", draft_dir / "tokenizer.json"
        )
    ]
    limit = draft.max_position_embeddings
    if recipe.export.max_seq_len > limit:
        problems.append(
            f"{source}: max_position_embeddings {limit} of the draft is below export.max_seq_len "
            f"{recipe.export.max_seq_len} (the draft runs at every position the target does)"
        )
    if recipe.draft().quantize is not None:
        problems += quantize_problems(recipe.draft_quantize(), draft, f"{_DRAFT}.quantize")
    else:  # the target's list, applied to the draft: name the list and where it applies
        inherited = quantize_problems(recipe.draft_quantize(), draft, "quantize")
        applied = f"{_DRAFT} (the target's quantize, applied to the draft)"
        problems += [f"{applied}: {p}" for p in inherited]
    _raise(problems, recipe_file)


def _raise(problems: list[str], recipe_file: str | None) -> None:
    if problems:
        raise RecipeError([f"{recipe_file}: {p}" if recipe_file else p for p in problems])
