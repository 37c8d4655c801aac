"""Recipe checks that need the source model's config.json, run before any build work.

The recipe alone cannot tell whether a group size divides the model's widths or whether a
module pattern names anything; with the HF config (a plain dict) we can, in milliseconds,
instead of failing an hour into a build.
"""

from __future__ import annotations

import functools
import re
from typing import Any, get_args

from .errors import RecipeError, format_problem
from .quantize import CALIBRATED_METHODS, RtnQuantize
from .recipe import Recipe

__all__ = ["check_recipe_against_model", "linear_module_names", "module_selected"]

_LAYER_LINEARS = (
    "attn.q_proj",
    "attn.k_proj",
    "attn.v_proj",
    "attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
_REQUIRED_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "max_position_embeddings",
)
# Group sizes a recipe may ask for (besides -1): the Literal of the field, not a second copy.
_GROUP_SIZES = tuple(
    g for g in get_args(RtnQuantize.model_fields["group_size"].annotation) if g > 0
)


def linear_module_names(model_config: dict[str, Any]) -> list[str]:
    """IR names of every linear a quantize entry may select, in model order.

    The embedding is a lookup table, not a linear, so it is never selected. `lm_head` is
    listed even with tied embeddings: it is then the embedding matrix used as a linear, and a
    recipe may still choose to quantize or ignore it.
    """
    layers = range(model_config["num_hidden_layers"])
    per_layer = [f"layers.{i}.{linear}" for i in layers for linear in _LAYER_LINEARS]
    return [*per_layer, "lm_head"]


def module_selected(name: str, targets: list[str], ignore: list[str]) -> bool:
    """True if some target pattern matches `name` and no ignore pattern does.

    A pattern is an exact module name, or `re:<regex>` where the regex must match the whole
    name (so `re:layers\\.1\\..*` does not also catch layers 10-19).
    """
    return any(_matches(p, name) for p in targets) and not any(_matches(p, name) for p in ignore)


def check_recipe_against_model(
    recipe: Recipe, model_config: dict[str, Any], *, recipe_file: str | None = None
) -> None:
    """Raise RecipeError listing every way `recipe` does not fit the model of `model_config`.

    `recipe_file`, when given, prefixes each problem like load_recipe's messages.
    """
    missing = [k for k in _REQUIRED_KEYS if not isinstance(model_config.get(k), int)]
    if missing:
        problem = f"source model config.json lacks integer {', '.join(missing)}"
        raise RecipeError([format_problem("", problem, file=recipe_file, show_got=False)])

    modules = linear_module_names(model_config)
    problems = _check_max_seq_len(recipe, model_config)
    selected_by: dict[str, list[int]] = {}
    for index, entry in enumerate(recipe.quantize):
        pattern_problems = _check_patterns(index, entry, modules)
        problems += pattern_problems
        chosen = [m for m in modules if module_selected(m, entry.targets, entry.ignore)]
        if not chosen and not pattern_problems:
            problems.append(f"quantize.{index}: selects no module (its ignore covers its targets)")
        problems += _check_group_size(index, entry, chosen, model_config)
        if entry.method in CALIBRATED_METHODS and "lm_head" in chosen:
            problems.append(
                f"quantize.{index}.ignore: {entry.method} quantizes decoder-layer linears only "
                "and lm_head is selected (add lm_head to ignore, or quantize it with an rtn entry)"
            )
        for module in chosen:
            selected_by.setdefault(module, []).append(index)
    problems += _check_overlaps(selected_by)
    from ..interop.checks import interop_problems  # here: interop.checks imports this module

    problems += interop_problems(recipe, model_config)

    if problems:
        raise RecipeError([f"{recipe_file}: {p}" if recipe_file else p for p in problems])


def _check_max_seq_len(recipe: Recipe, cfg: dict[str, Any]) -> list[str]:
    limit = cfg["max_position_embeddings"]
    if recipe.export.max_seq_len <= limit:
        return []
    what = f"exceeds max_position_embeddings {limit} of the source model"
    return [format_problem("export.max_seq_len", what, recipe.export.max_seq_len, f"<= {limit}")]


def _check_patterns(index: int, entry: RtnQuantize, modules: list[str]) -> list[str]:
    # A pattern that matches nothing is almost always a typo ("layers.0.atn.q_proj").
    problems = []
    example = f"names like {modules[0]}, {modules[1]}, {modules[-1]}, or re:<regex>"
    for field in ("targets", "ignore"):
        for j, pattern in enumerate(getattr(entry, field)):
            if not any(_matches(pattern, m) for m in modules):
                what = "matches no module of the source model"
                problems.append(
                    format_problem(f"quantize.{index}.{field}.{j}", what, pattern, example)
                )
    return problems


def _check_group_size(
    index: int, entry: RtnQuantize, chosen: list[str], cfg: dict[str, Any]
) -> list[str]:
    # Groups run along a weight's input dimension, so the group size must divide the input
    # width of every selected module. Methods without groups (fp8, later) have no group_size.
    group_size = getattr(entry, "group_size", -1)
    if group_size <= 0:
        return []
    widths = dict(_input_width(m, cfg) for m in chosen)
    bad = [f"{label} {width}" for label, width in widths.items() if width % group_size]
    if not bad:
        return []
    fitting = [g for g in _GROUP_SIZES if all(w % g == 0 for w in widths.values())]
    use = ", ".join(str(g) for g in [*fitting, -1])
    return [
        f"quantize.{index}.group_size: {group_size} does not divide {' and '.join(bad)} "
        f"of the source model (use one of: {use})"
    ]


def _input_width(module: str, cfg: dict[str, Any]) -> tuple[str, int]:
    """(config name of, value of) the input width of `module`'s weight."""
    if module.endswith("down_proj"):
        return "intermediate_size", cfg["intermediate_size"]
    if module.endswith("o_proj"):
        # o_proj reads the concatenated heads, which is wider or narrower than hidden_size
        # when config.json sets head_dim explicitly (Mistral-Nemo: 32 * 128 != 5120).
        heads = cfg.get("num_attention_heads")
        head_dim = cfg.get("head_dim")
        attn_width = (
            heads * head_dim if isinstance(heads, int) and isinstance(head_dim, int) else None
        )
        if attn_width is not None and attn_width != cfg["hidden_size"]:
            return "num_attention_heads * head_dim", attn_width
    return "hidden_size", cfg["hidden_size"]


def _check_overlaps(selected_by: dict[str, list[int]]) -> list[str]:
    # Quantizing a module twice would quantize the already-rounded weights; refuse instead.
    shared: dict[tuple[int, int], list[str]] = {}
    for module, indexes in selected_by.items():
        for later in indexes[1:]:
            shared.setdefault((indexes[0], later), []).append(module)
    problems = []
    for (first, later), modules in shared.items():
        problems.append(
            f"quantize.{later}.targets: selects {len(modules)} module(s) already selected by "
            f"quantize.{first} (e.g. {modules[0]}); each module may be quantized only once"
        )
    return problems


@functools.lru_cache(maxsize=512)
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(regex)


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return _compiled(pattern[3:]).fullmatch(name) is not None
    return pattern == name
