"""Everything a recipe is checked against before any build work: the source model's config
(and its model family's blocks), its tokenizer (vocabulary_fit.py; and the GGUF vocabulary
when the recipe writes one), the token ids of its data, and a draft model's checkpoint
against the target's.

The recipe's own schema (pydantic) is checked when it loads; what needs the model's widths and
module names is checked here, section by section, and reported together, one line a problem.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .chat_template import chat_template_of
from .engines import ENGINE_BUILDERS
from .export import decoder
from .interop.checks import interop_problems
from .interop.gguf_vocab import gguf_vocabulary_problems
from .model import layers
from .model.config import ModelConfig
from .model.family import ModelFamily
from .recipe import Recipe, RecipeError
from .recipe.checks import model_problems, quantize_problems
from .recipe.embedding import default_entry
from .vocabulary import vocabulary_differences
from .vocabulary_fit import data_token_problems, tokenizer_config_problems, tokenizer_problems

__all__ = [
    "check_data_against_model",
    "check_draft_against_target",
    "check_recipe_against_model",
    "check_tokenizer_against_model",
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


def check_tokenizer_against_model(
    recipe: Recipe,
    cfg: ModelConfig,
    source: Path,
    chat_template: str | None,
    *,
    recipe_file: str | None = None,
) -> None:
    """Raise RecipeError listing every way the checkpoint's tokenizer (at `source`) cannot
    serve its model (vocabulary_fit.py), or cannot be written into a GGUF file the recipe's
    interop asks for; `chat_template`: the recipe's artifact.chat_template text (None: the
    artifact ships the checkpoint's, if it has one)."""
    problems = tokenizer_config_problems(source)
    if not problems:  # a readable tokenizer_config.json whose ids agree: the tokenizer is known
        problems = tokenizer_problems(source, cfg, _shipped_template(recipe, source, chat_template))
    if "gguf" in recipe.interop:
        problems += gguf_vocabulary_problems(source, cfg)
    _raise(problems, recipe_file)


def _shipped_template(
    recipe: Recipe, source: Path, chat_template: str | None
) -> tuple[str, str] | None:
    """(where it comes from, its text) of the chat template the artifact ships."""
    if chat_template is not None:
        return "artifact.chat_template", chat_template
    template = chat_template_of(source)
    jinja = source / "chat_template.jinja"
    where = jinja if jinja.is_file() else source / "tokenizer_config.json"
    return None if template is None else (str(where), template)


def check_data_against_model(
    data: Iterable[tuple[str, np.ndarray | None]], cfg: ModelConfig, source: Path
) -> None:
    """Raise RecipeError when the token ids of the recipe's data ((where, ids) pairs: the
    calibration, evaluation windows) hold a token past the model's vocabulary."""
    problems = []
    for where, ids in data:
        if ids is not None and ids.size:
            problems += data_token_problems(where, int(ids.max()), cfg, source)
    _raise(problems, None)


def with_model_defaults(recipe: Recipe, cfg: ModelConfig) -> Recipe:
    """`recipe` with what it leaves to the model's size: the embedding and lm_head entry a
    large source, or one whose tables are a large share of it, gets (`recipe/embedding.py`),
    appended to `quantize`,
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
