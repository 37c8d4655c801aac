"""Recipe checks that need the source model's config, run before any build work.

The recipe alone cannot tell whether a group size divides the model's widths or whether a
module pattern names anything; with the model's config we can, in milliseconds, instead of
failing an hour into a build. `pipeline/preflight.py` runs these with the interop checks.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model.architecture import (
    LM_HEAD,
    dim_label,
    dim_size,
    fused_names,
    layer_linear,
    linear_names,
)
from ..model.config import ModelConfig
from ..model.selection import EMBEDDING, embedding_entry, pattern_matches, selected
from ..quantize.fields import GROUP_SIZES
from ..quantize.method import method_of
from .embedding import embedding_problems
from .errors import format_problem
from .quantize import Quantize
from .recipe import Recipe

__all__ = ["model_problems", "quantize_problems"]


def model_problems(recipe: Recipe, cfg: ModelConfig) -> list[str]:
    """One line per way the recipe's quantize and export sections do not fit the model."""
    return _check_max_seq_len(recipe, cfg) + quantize_problems(recipe.quantize, cfg, "quantize")


def quantize_problems(entries: Sequence[Quantize], cfg: ModelConfig, path: str) -> list[str]:
    """One line per way the quantize entries at recipe `path` (`quantize`, or a draft model's
    list) do not fit the model of `cfg`."""
    modules, fused = linear_names(cfg), fused_names(cfg)
    holders = sorted({h.name for h in fused.values()})  # names a pattern may use too
    problems = []
    selected_by: dict[str, list[int]] = {}
    for index, entry in enumerate(entries):
        at = f"{path}.{index}"
        pattern_problems = _check_patterns(at, entry, modules, holders)
        problems += pattern_problems
        chosen = selected(entry, modules, fused)
        if embedding_entry([entry]) is not None:  # named exactly (selection.py)
            chosen = [EMBEDDING, *chosen]
            problems += embedding_problems(at, entry, chosen, cfg)
        if not chosen and not pattern_problems:
            problems.append(f"{at}: selects no module (its ignore covers its targets)")
        problems += _check_group_size(at, entry, chosen, cfg)
        linears = [m for m in chosen if m != EMBEDDING]
        problems += method_of(entry).model_problems(at, entry, linears, cfg)
        for inside, inner in method_of(entry).nested(entry).items():  # auto's candidates
            problems += _check_group_size(f"{at}.{inside}", inner, chosen, cfg)
            problems += method_of(inner).model_problems(f"{at}.{inside}", inner, linears, cfg)
        if entry.calibrated and LM_HEAD.name in chosen:
            problems.append(
                f"{at}.ignore: {entry.method} quantizes decoder-layer linears only "
                "and lm_head is selected (add lm_head to ignore, or quantize it with an rtn entry)"
            )
        for module in chosen:
            selected_by.setdefault(module, []).append(index)
    return problems + _check_overlaps(path, selected_by)


def _check_max_seq_len(recipe: Recipe, cfg: ModelConfig) -> list[str]:
    limit = cfg.max_position_embeddings
    if recipe.export.max_seq_len <= limit:
        return []
    what = f"exceeds max_position_embeddings {limit} of the source model"
    return [format_problem("export.max_seq_len", what, recipe.export.max_seq_len, f"<= {limit}")]


def _check_patterns(at: str, entry: Quantize, modules: list[str], fused: list[str]) -> list[str]:
    # A pattern that matches nothing is almost always a typo ("layers.0.atn.q_proj"). The
    # fused tensors a family stores linears in (Phi-3's qkv_proj) are names too.
    problems = []
    example = f"names like {modules[0]}, {modules[1]}, {modules[-1]}, {EMBEDDING}, or re:<regex>"
    known = [*modules, *fused, EMBEDDING]
    for field in ("targets", "ignore"):
        for j, pattern in enumerate(getattr(entry, field)):
            if not any(pattern_matches(pattern, m) for m in known):
                what = "matches no module of the source model"
                problems.append(format_problem(f"{at}.{field}.{j}", what, pattern, example))
    return problems


def _check_group_size(at: str, entry: Quantize, chosen: list[str], cfg: ModelConfig) -> list[str]:
    # Groups run along a weight's input dimension, so the group size must divide the input
    # width of every selected module. Entries without an integer grid (FP8, W8A8's one scale
    # per channel) have no groups.
    grid = method_of(entry).grid(entry)
    group_size = -1 if grid is None else grid.group_size
    if group_size <= 0:
        return []
    in_dims = {layer_linear(m, cfg).in_dim for m in chosen}
    widths = {dim_label(cfg, d): dim_size(cfg, d) for d in sorted(in_dims)}
    bad = [f"{label} {width}" for label, width in widths.items() if width % group_size]
    if not bad:
        return []
    fitting = [g for g in GROUP_SIZES if all(w % g == 0 for w in widths.values())]
    use = ", ".join(str(g) for g in [*fitting, -1])
    return [
        f"{at}.group_size: {group_size} does not divide {' and '.join(bad)} "
        f"of the source model (use one of: {use})"
    ]


def _check_overlaps(path: str, selected_by: dict[str, list[int]]) -> list[str]:
    # Quantizing a module twice would quantize the already-rounded weights; refuse instead.
    shared: dict[tuple[int, int], list[str]] = {}
    for module, indexes in selected_by.items():
        for later in indexes[1:]:
            shared.setdefault((indexes[0], later), []).append(module)
    problems = []
    for (first, later), modules in shared.items():
        problems.append(
            f"{path}.{later}.targets: selects {len(modules)} module(s) already selected by "
            f"{path}.{first} (e.g. {modules[0]}); each module may be quantized only once"
        )
    return problems
