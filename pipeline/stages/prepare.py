"""Everything a build needs before its first stage, validated and prepared in seconds, so bad
input fails before any model work: the recipe (strict), the source (files hashed), the recipe
against the model, a draft model against the target, attached heads or EAGLE-3 draft, the
signing key, the chat template, the evaluation text and the calibration data (read, tokenized,
windowed; the calibration device resolved)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..chat_template import recipe_chat_template
from ..draft import DraftModel, resolve_draft
from ..evaluate.speculative import SpeculativePrompts, speculative_prompts
from ..evaluate.windows import EvalWindows, eval_windows
from ..heads.attach import AttachedHeads, resolve_heads
from ..heads.eagle_attach import AttachedEagle, resolve_eagle
from ..model.config import ModelConfig
from ..preflight import (
    check_data_against_model,
    check_recipe_against_model,
    check_tokenizer_against_model,
    with_model_defaults,
)
from ..recipe import Recipe, RecipeError, load_recipe
from ..source import ResolvedSource, resolve_source
from .calibrate import PreparedCalibration, prepare_calibration

__all__ = ["BuildInputs", "prepare", "source_digest"]


@dataclass(frozen=True, slots=True)
class BuildInputs:
    """What the stages are declared from."""

    recipe: Recipe
    recipe_path: Path
    source: ResolvedSource
    cfg: ModelConfig  # the source's
    draft: DraftModel | None  # speculative.method draft_model's, checked against the target
    heads: AttachedHeads | None  # attached Medusa heads
    eagle: AttachedEagle | None  # an attached EAGLE-3 draft
    sign_key: Path | None
    chat_template: str | None  # artifact.chat_template's text, shipped instead of the source's
    evaluation: EvalWindows | None  # evaluate.perplexity's windows
    speculative: SpeculativePrompts | None  # evaluate.speculative's prompts
    calibration: PreparedCalibration | None  # the target's windows, when a stage needs them
    draft_calibration: PreparedCalibration | None  # the same data, by the draft's tokenizer
    defaulted: tuple[int, ...] = ()  # quantize entries the model's size added (the lock's)


def prepare(recipe_path: str | Path) -> BuildInputs:
    """The recipe at `recipe_path` and everything its stages read, checked: each problem
    fails here (RecipeError, SourceError, EvalDataError, ...), before any stage runs."""
    recipe_path = Path(recipe_path)
    recipe = load_recipe(recipe_path)
    source = resolve_source(recipe.stage_slice("source")["source"])
    cfg = ModelConfig.from_hf(source.hf_config)
    written = len(recipe.quantize)
    recipe = with_model_defaults(recipe, cfg)  # the stages, the lock and the checks see it
    check_recipe_against_model(recipe, cfg)
    chat_template = recipe_chat_template(recipe, recipe_path)  # a missing template fails here
    check_tokenizer_against_model(recipe, cfg, source.path, chat_template)  # and its quirks
    draft = resolve_draft(recipe, source, cfg)  # a draft that cannot serve fails here
    heads = resolve_heads(recipe, recipe_path, cfg)  # and attached Medusa heads
    eagle = resolve_eagle(recipe, recipe_path, cfg)  # and an EAGLE-3 draft
    sign_key = _sign_key(recipe, recipe_path)  # a missing key fails before any stage runs
    evaluation = eval_windows(recipe, recipe_path, source.path)  # unreadable data fails here
    speculative = speculative_prompts(recipe, recipe_path, source.path)  # and too little of it
    calibration = prepare_calibration(recipe, recipe_path, source.path, cfg)  # and here
    data = [
        ("calibration.dataset", calibration and calibration.calibration.tokens),
        ("evaluate.perplexity.dataset", evaluation and evaluation.windows.numpy()),
        ("evaluate.speculative.dataset", speculative and speculative.prompts),
    ]
    check_data_against_model(data, cfg, source.path)  # a token the model cannot embed
    draft_calibration = None
    if draft is not None:  # the same data, tokenized by the draft's (equal) tokenizer
        draft_calibration = prepare_calibration(
            recipe, recipe_path, draft.source.path, draft.cfg, draft.quantize
        )
    return BuildInputs(
        recipe,
        recipe_path,
        source,
        cfg,
        draft,
        heads,
        eagle,
        sign_key,
        chat_template,
        evaluation,
        speculative,
        calibration,
        draft_calibration,
        tuple(range(written, len(recipe.quantize))),
    )


def source_digest(source: ResolvedSource) -> str:
    """The source's digest, a stage input: sha256 of its pinned files' {name: sha256}."""
    blob = json.dumps(source.files, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _sign_key(recipe: Recipe, recipe_path: Path) -> Path | None:
    """artifact.sign.key, resolved against the recipe's directory like source.path."""
    if recipe.artifact.sign is None:
        return None
    key = recipe_path.absolute().parent / Path(recipe.artifact.sign.key).expanduser()
    if not key.is_file():
        raise RecipeError([f"{recipe_path}: artifact.sign.key: {key}: no such key file"])
    return key
