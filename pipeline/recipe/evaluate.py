"""The `evaluate` section: quality checks of the quantized model and its engine (perplexity,
with a gate) and of the recipe's speculative decoding (mean accepted length, with a gate)."""

from __future__ import annotations

from pydantic import Field

from .base import _Strict

__all__ = ["Evaluate", "Perplexity", "SpeculativeEval"]


class Perplexity(_Strict):
    """Perplexity of the original model, the quantized IR and the first engine, same windows."""

    dataset: str = Field(
        min_length=1,
        description="Local .txt / .jsonl / .parquet / .arrow file (relative to the recipe file) "
        "or a Hub dataset id. Documents are joined with blank lines and tokenized with the "
        "checkpoint's tokenizer.json (no special tokens).",
    )
    split: str = Field(default="train", min_length=1, description="Split of a Hub dataset.")
    text_field: str = Field(
        default="text", min_length=1, description="Column (or JSON key) holding the text."
    )
    seq_len: int = Field(
        default=256,
        ge=16,
        description="Tokens per window. Windows are consecutive and non-overlapping; each is "
        "scored on its seq_len - 1 next-token predictions.",
    )
    max_windows: int | None = Field(
        default=None, gt=0, description="Evaluate only the first N windows (None: all)."
    )
    max_delta: float | None = Field(
        default=None,
        ge=0,
        description="Gate: fail the build (before packaging) when the engine's perplexity "
        "(the first target's, as the runtime runs it) minus the original's exceeds this. "
        "None: report only.",
    )


class SpeculativeEval(_Strict):
    """Speculative decoding as the runtime runs it: greedy generation from held-out prompts
    through the runtime's Generator with the recipe's `speculative` section, on the first
    target's engine (and the draft model's engine of that name)."""

    dataset: str | None = Field(
        default=None,
        min_length=1,
        description="Held-out text the prompts are cut from, like evaluate.perplexity.dataset. "
        "Omitted: evaluate.perplexity's dataset (with its split and text_field).",
    )
    split: str = Field(
        default="train", min_length=1, description="Split of a Hub dataset (with `dataset`)."
    )
    text_field: str = Field(
        default="text",
        min_length=1,
        description="Column (or JSON key) holding the text (with `dataset`).",
    )
    prompts: int = Field(
        default=16,
        ge=1,
        description="Prompts, run one at a time: the first prompt_tokens tokens of consecutive "
        "windows of prompt_tokens + max_tokens tokens.",
    )
    prompt_tokens: int = Field(default=64, ge=1, description="Tokens per prompt.")
    max_tokens: int = Field(
        default=64,
        ge=1,
        description="Tokens generated per prompt (greedy, EOS ignored); prompt_tokens + "
        "max_tokens must fit export.max_seq_len.",
    )
    min_accepted_length: float | None = Field(
        default=None,
        ge=1,
        description="Gate: fail the build (before packaging) when the mean accepted length "
        "(tokens per verification: 1 + accepted drafts / verifications) is below this. "
        "At most num_speculative_tokens + 1. None: report only.",
    )


class Evaluate(_Strict):
    """Quality checks of the quantized model, reported in the artifact's eval/."""

    perplexity: Perplexity | None = Field(
        default=None,
        description="Perplexity of the original model, the quantized IR and the engine.",
    )
    speculative: SpeculativeEval | None = Field(
        default=None,
        description="Mean accepted length of the recipe's speculative decoding (needs a "
        "`speculative` section).",
    )
