"""The recipe checks of a quantize entry that selects the token embedding (`embed_tokens`).

The embedding is rounded without data (after the layer walk) to integer codes that the
exported graph gathers row by row (pipeline/export/embedding.py): 8-bit codes, since ONNX's
Gather takes no 4-bit tensors. A tied model keeps one tensor, which its lm_head reads too.
"""

from __future__ import annotations

from ..model.architecture import LM_HEAD, parameter_count
from ..model.config import ModelConfig
from ..model.selection import EMBEDDING, embedding_entry, entry_for
from ..quantize.method import Scheme, method_of
from .quantize import Quantize, quantize_entry
from .recipe import Recipe

__all__ = ["DEFAULT_FROM_PARAMETERS", "default_entry", "embedding_problems", "tables_dominate"]

# The default for sources this large (`Recipe.embedding_and_lm_head: auto`): at 1B the
# embedding and lm_head are a fifth to a half of the weights (Llama-3.2-1B ties a 525M-entry
# table), so fp32 tables dominate an int4 artifact; below, they stay as recipes have them...
DEFAULT_FROM_PARAMETERS = 1_000_000_000
# ... unless the tables are this share of a source of DEFAULT_FROM_SMALL parameters or more:
# a large vocabulary on a small model (Gemma-3-1B: 999.9M parameters, 30% of them its 262k x
# 1152 table; Gemma-3-270m 63%; Qwen3-0.6B 26%). The floor keeps test-sized models as written.
DEFAULT_FROM_TABLE_SHARE = 0.25
DEFAULT_FROM_SMALL = 100_000_000
# int8 with one scale per row: the table's rows are gathered as 8-bit codes (4-bit cannot be,
# in standard ONNX), and a tied lm_head reads the same tensor; int8 lm_heads cost about
# nothing in perplexity (benchmarks/results/embedding_heads.md).
_DEFAULT = {
    "method": "rtn",
    "bits": 8,
    "group_size": -1,
    "symmetric": True,
    "targets": [EMBEDDING, LM_HEAD.name],
    "ignore": [],
}


def default_entry(recipe: Recipe, cfg: ModelConfig) -> Quantize | None:
    """The entry `recipe` gets for the embedding and lm_head when it says nothing of them
    (`embedding_and_lm_head: auto`, no entry selecting either, some entry quantizing) and the
    source is large or its tables a large share of it (`tables_dominate`); None otherwise."""
    entries = recipe.quantize
    if recipe.embedding_and_lm_head != "auto" or not entries:
        return None
    if embedding_entry(entries) is not None or entry_for(LM_HEAD.name, entries) is not None:
        return None
    if not tables_dominate(cfg):
        return None
    return quantize_entry(_DEFAULT)


def tables_dominate(cfg: ModelConfig) -> bool:
    """Whether the source is large enough, or its embedding and lm_head a large enough share
    of it, for the default int8 tables."""
    total = parameter_count(cfg)
    tables = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    if total >= DEFAULT_FROM_PARAMETERS:
        return True
    return total >= DEFAULT_FROM_SMALL and tables >= DEFAULT_FROM_TABLE_SHARE * total


def embedding_problems(at: str, entry: Quantize, chosen: list[str], cfg: ModelConfig) -> list[str]:
    """One line per way entry `at` (which selects the embedding; `chosen`: every module it
    selects) cannot quantize it."""
    method = method_of(entry)
    if entry.calibrated:
        return [
            f"{at}.targets: {entry.method} quantizes decoder-layer linears only and {EMBEDDING} "
            "is selected (quantize the embedding with an rtn entry)"
        ]
    if method.scheme(entry) is not Scheme.WEIGHT_ONLY_INT:
        return [
            f"{at}.method: {entry.method} with these settings is not integer weight-only "
            f"quantization; {EMBEDDING} is gathered as integer codes (use rtn)"
        ]
    problems = []
    bits = method.grid(entry).bits
    if bits <= 4:
        problems.append(
            f"{at}.bits: {bits}: {EMBEDDING} is gathered as 8-bit codes (ONNX's Gather takes "
            "no 4-bit tensors); use bits: 8 in an entry of its own"
        )
    if cfg.tie_word_embeddings and LM_HEAD.name not in chosen:
        problems.append(
            f"{at}.targets: the model ties lm_head to {EMBEDDING} (tie_word_embeddings): one "
            "tensor, so this entry must select lm_head too (add it to targets, with ignore: [])"
        )
    return problems
