"""Recipe checks for `interop`, run with the other recipe checks before any build work.

Each format stores what it can: GPTQ v1 one bits / group size / symmetry for every decoder
linear; AWQ GEMM 4-bit with zero points in groups; compressed-tensors any integer scheme, W8A8
(smoothquant) and FP8, mixed in one model. GPTQ, AWQ and GGUF hold weight-only integer weights.
Packing into int32 needs widths divisible by the values per word. GGUF holds any weights (what
its blocks cannot hold is written as F16), but llama.cpp must be able to run the model: no
sliding window, no dynamic NTK RoPE. compressed-tensors holds an fp8 KV cache, not an int8 one
(kv_scheme.py); GPTQ, AWQ and GGUF hold no KV cache scheme and leave it out.
"""

from __future__ import annotations

from ..model.architecture import fused_names, linear_names, linear_shape
from ..model.config import ModelConfig
from ..model.selection import Holder, selected
from ..quantize.method import Grid, Scheme, method_of
from ..recipe import Quantize, Recipe
from ..recipe.errors import format_problem
from .kv_scheme import KV_SCHEME_FORMATS

__all__ = ["gguf_model_problems", "interop_problems"]

# compressed-tensors holds every scheme (int-quantized, float-quantized, W8A8 among them); the
# other formats hold weight-only integer weights.
_HOLDS_EVERY_SCHEME = "compressed-tensors"


def interop_problems(recipe: Recipe, cfg: ModelConfig) -> list[str]:
    """One line per way the recipe's `interop` formats cannot hold its quantized model."""
    if not recipe.interop:
        return []
    if not recipe.quantize:
        return ["interop: the interop formats hold quantized weights; add a quantize section"]
    modules = linear_names(cfg)
    fused = fused_names(cfg)
    entry_of = {
        m: i for i, entry in enumerate(recipe.quantize) for m in selected(entry, modules, fused)
    }
    problems = _fused_alike(fused, entry_of)
    for j, fmt in enumerate(recipe.interop):
        if fmt != _HOLDS_EVERY_SCHEME:
            problems += _schemes(j, fmt, recipe)
        if fmt == "awq":
            problems += _awq(recipe, entry_of)
        if fmt == "gptq":
            problems += _gptq(j, recipe, modules, entry_of)
        if fmt in ("awq", "gptq"):
            problems += _widths(j, fmt, recipe, entry_of, cfg)
        if fmt == "gguf":
            problems += [f"interop.{j}: {p}" for p in gguf_model_problems(cfg)]
        if fmt in KV_SCHEME_FORMATS and recipe.kv_cache.quantized:
            held = KV_SCHEME_FORMATS[fmt]
            if recipe.kv_cache.dtype not in held:
                what = (
                    f"interop {fmt} (interop.{j}) stores only an {' / '.join(held)} KV cache "
                    f"scheme (vLLM has no {recipe.kv_cache.dtype} KV cache)"
                )
                problems.append(
                    format_problem("kv_cache.dtype", what, recipe.kv_cache.dtype, ", ".join(held))
                )
    return problems


def _fused_alike(fused: dict[str, Holder], entry_of: dict[str, int]) -> list[str]:
    # The checkpoint stores these linears as one tensor (Phi-3's qkv_proj): every format
    # writes them back stacked (fused.py), which needs one scheme for all the parts.
    for holder, linears in {h.name: h.parts for h in fused.values()}.items():
        entries = [entry_of.get(m) for m in linears]
        if len(set(entries)) > 1:
            named = ", ".join(
                f"{m} by {'nothing' if e is None else f'quantize.{e}'}"
                for m, e in zip(linears, entries, strict=True)
            )
            return [
                f"interop: {holder} is one tensor in the checkpoint, which the interop formats "
                f"write back, but its parts are quantized apart ({named}); select them with one "
                "entry (a pattern naming the fused tensor selects all its parts)"
            ]
    return []


def gguf_model_problems(cfg: ModelConfig) -> list[str]:
    """What llama.cpp cannot run as this model computes it (the GGUF writer refuses the same)."""
    problems = []
    if cfg.family.gguf is None:
        problems.append(
            f"gguf: llama.cpp has no architecture for model_type {cfg.architecture!r} "
            "(its model family names none)"
        )
    runs = cfg.family.gguf.rope_scalings if cfg.family.gguf is not None else ()
    if cfg.family.gguf is not None and cfg.rope.type not in runs:
        problems.append(
            f"gguf: llama.cpp has no {cfg.rope.type!r} RoPE scaling for "
            f"{cfg.family.gguf.arch} (config.json rope_type {cfg.rope.type!r}; llama.cpp runs "
            f"{', '.join(runs)})"
        )
    dense = [i for i in range(cfg.num_layers) if i not in cfg.moe_layers]
    if cfg.moe_layers and dense:
        moe = cfg.family.moe
        keys = " / ".join(k for k in (moe.dense_layers, moe.sparse_step) if k)
        problems.append(
            f"gguf: llama.cpp runs every layer of a mixture of experts as experts, and this "
            f"model keeps layers {dense} of {cfg.num_layers} dense (config.json {keys})"
        )
    if cfg.moe_layers and not cfg.norm_topk_prob:
        rule = cfg.family.moe.norm_topk
        why = f"config.json {rule} false" if isinstance(rule, str) else "its family never does"
        problems.append(
            "gguf: llama.cpp renormalises the chosen experts' weights over the top-k, and this "
            f"model does not ({why})"
        )
    window = cfg.sliding_window
    if cfg.layer_windows is not None:
        # llama.cpp's qwen2 reads no window at all (its hparams load has no sliding-window
        # key), let alone one per layer.
        local = [i for i, w in enumerate(cfg.layer_windows) if w is not None]
        problems.append(
            f"gguf: llama.cpp runs no layer with a sliding window, and this model mixes them "
            f"(config.json layer_types / max_window_layers: layers {local} of {cfg.num_layers} "
            f"slide by {window}, the others attend to the whole context)"
        )
    elif window is not None and window < cfg.max_position_embeddings:
        problems.append(
            "gguf: llama.cpp runs this model without sliding-window attention (config.json "
            f"sliding_window = {window}, below max_position_embeddings = "
            f"{cfg.max_position_embeddings})"
        )
    return problems


def _schemes(j: int, fmt: str, recipe: Recipe) -> list[str]:
    problems = []
    for i, entry in enumerate(recipe.quantize):
        scheme = method_of(entry).scheme(entry)
        if scheme is not Scheme.WEIGHT_ONLY_INT:
            what = (
                f"interop {fmt} (interop.{j}) holds {Scheme.WEIGHT_ONLY_INT.value}, "
                f"not {scheme.value}; {_HOLDS_EVERY_SCHEME} holds it"
            )
            problems.append(format_problem(f"quantize.{i}.method", what, entry.method))
    return problems


def _grid(entry: Quantize) -> Grid | None:
    """A weight-only integer entry's grid, the settings the checks below read; None for the
    other schemes (refused above)."""
    if method_of(entry).scheme(entry) is not Scheme.WEIGHT_ONLY_INT:
        return None
    return method_of(entry).grid(entry)


def _awq(recipe: Recipe, entry_of: dict[str, int]) -> list[str]:
    problems = []
    for i, entry in enumerate(recipe.quantize):
        grid = _grid(entry)
        if grid is None:  # refused above
            continue
        bits, group_size, symmetric = grid
        if bits != 4:
            what = "interop awq (GEMM) packs 4-bit weights only"
            problems.append(format_problem(f"quantize.{i}.bits", what, bits, "4"))
        if symmetric is not False:
            what = "interop awq stores zero points; quantize asymmetrically"
            problems.append(format_problem(f"quantize.{i}.symmetric", what, symmetric, "false"))
        if group_size == -1:
            what = "interop awq needs groups, not per-channel scales"
            problems.append(format_problem(f"quantize.{i}.group_size", what, -1, "32, 64, 128"))
    if "lm_head" in entry_of:
        i = entry_of["lm_head"]
        what = "interop awq keeps lm_head float (AWQ checkpoints never quantize it)"
        problems.append(format_problem(f"quantize.{i}.ignore", what, show_got=False))
    return problems


def _gptq(j: int, recipe: Recipe, modules: list[str], entry_of: dict[str, int]) -> list[str]:
    problems = []
    entries = [recipe.quantize[i] for i in set(entry_of.values())]
    settings = {_grid(e) for e in entries} - {None}
    if len(settings) > 1:
        problems.append(
            f"interop.{j}: gptq states one bits / group_size / symmetric for the whole model, "
            f"the quantize entries use {len(settings)} (use compressed-tensors)"
        )
    left_float = [m for m in modules if m != "lm_head" and m not in entry_of]
    if left_float:
        problems.append(
            f"interop.{j}: gptq (v1) quantizes every decoder linear; the recipe leaves "
            f"{len(left_float)} float (e.g. {left_float[0]}); use compressed-tensors"
        )
    return problems


def _widths(
    j: int, fmt: str, recipe: Recipe, entry_of: dict[str, int], cfg: ModelConfig
) -> list[str]:
    # GPTQ packs K and N, AWQ packs N, into words of 32 / bits values.
    problems = []
    for module, i in entry_of.items():
        grid = _grid(recipe.quantize[i])
        if grid is None or 32 % grid.bits:
            continue
        bits = grid.bits
        per = 32 // bits
        k, n = linear_shape(cfg, module)
        packed = (("N", n), ("K", k)) if fmt == "gptq" else (("N", n),)
        for label, width in packed:
            if width % per:
                problems.append(
                    f"interop.{j}: {fmt} packs {per} values per int32, but {module} has "
                    f"{label} = {width}"
                )
    return problems
