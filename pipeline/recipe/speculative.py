"""The `speculative` section: how the runtime drafts tokens for the target to verify, and the
draft model the build compiles for it.

One member per method, discriminated by `method`: `ngram` builds nothing and is only recorded
in the manifest; `draft_model` builds a second, smaller checkpoint through the target's stages
into the artifact's `draft/`; `medusa` trains (or attaches) heads on the target's final hidden
state and exports them to `draft/heads/`; `eagle` trains (or attaches) an EAGLE-3 draft layer
on three of the target's hidden states and exports it to `draft/eagle/`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .base import _Strict
from .quantize import Quantize
from .source import Source

__all__ = [
    "Draft",
    "DraftModelSpeculative",
    "EagleHeads",
    "EagleSpeculative",
    "EagleTrain",
    "MedusaHeads",
    "MedusaSpeculative",
    "MedusaTrain",
    "NgramSpeculative",
    "Speculative",
]

_MAX_SPECULATIVE_TOKENS = 16

NumSpeculativeTokens = Annotated[
    int,
    Field(
        ge=1,
        le=_MAX_SPECULATIVE_TOKENS,
        description="Tokens proposed per step, verified by the target in one call (1..16).",
    ),
]


class Draft(_Strict):
    """The draft checkpoint: built like the target (same kv_cache, export and targets) and
    packed under the artifact's draft/. Its tokenizer and vocab_size must be the target's."""

    source: Source = Field(description="Where the draft checkpoint comes from (like `source`).")
    quantize: list[Quantize] | None = Field(
        default=None,
        description="Quantization passes of the draft; omitted: the target's `quantize` list "
        "applied to the draft; []: the draft stays float.",
    )


class NgramSpeculative(_Strict):
    """Prompt lookup: the runtime proposes the tokens that followed the latest earlier
    occurrence of the last n-gram; nothing is built."""

    method: Literal["ngram"] = Field(description="Speculative decoding method.")
    num_speculative_tokens: NumSpeculativeTokens
    prompt_lookup_min: int = Field(
        default=1, ge=1, description="Shortest n-gram looked up (vLLM's prompt_lookup_min)."
    )
    prompt_lookup_max: int = Field(
        default=4,
        ge=1,
        validate_default=True,  # a min above the default max is refused too
        description="Longest n-gram looked up (vLLM's prompt_lookup_max); >= prompt_lookup_min.",
    )

    @field_validator("prompt_lookup_max")
    @classmethod
    def _max_not_below_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("prompt_lookup_min")
        if low is not None and value < low:
            raise PydanticCustomError(
                "lookup_range", "below prompt_lookup_min", {"allowed": f">= {low}"}
            )
        return value


class DraftModelSpeculative(_Strict):
    """A small draft model proposes the tokens; it shares the target's KV block table."""

    method: Literal["draft_model"] = Field(description="Speculative decoding method.")
    num_speculative_tokens: NumSpeculativeTokens
    draft: Draft = Field(description="The draft model to build.")


class MedusaTrain(_Strict):
    """Self-distillation of Medusa heads against the quantized target, on the recipe's
    calibration windows: head k learns the target's own next-token distribution k + 1
    positions further on, from the target's final hidden state (`pipeline/heads/train.py`)."""

    num_heads: int = Field(default=4, ge=1, le=_MAX_SPECULATIVE_TOKENS, description="Heads.")
    num_layers: int = Field(
        default=1, ge=1, le=4, description="Residual SiLU blocks per head (Medusa's ResBlock)."
    )
    steps: int = Field(default=600, ge=1, description="Optimizer steps (AdamW).")
    learning_rate: float = Field(default=1e-3, gt=0, description="AdamW learning rate.")
    batch_size: int = Field(default=64, ge=1, description="Positions per step.")
    seed: int = Field(default=0, ge=0, description="Seed for the positions each step draws.")


class _TrainOrAttach(_Strict):
    """A drafter trained in the build (`train`) or attached (`attach`): exactly one."""

    @model_validator(mode="after")
    def _one_origin(self) -> _TrainOrAttach:
        if (self.train is None) == (self.attach is None):
            raise PydanticCustomError(
                "heads_origin", "give exactly one of `train` and `attach`", {}
            )
        return self


class MedusaHeads(_TrainOrAttach):
    """Where the heads come from: trained here (`train`), or an existing checkpoint in vLLM's
    Medusa layout (`attach`: config.json + safetensors, blocks.{h}.layers.{l}, lm_heads.{h})."""

    train: MedusaTrain | None = Field(default=None, description="Train heads in the build.")
    attach: str | None = Field(
        default=None,
        min_length=1,
        description="Directory of a Medusa checkpoint in vLLM's layout (relative to the "
        "recipe file); its vocab_size and hidden_size must be the target's.",
    )


class MedusaSpeculative(_Strict):
    """Medusa heads propose the tokens from the target's final hidden state: no draft model
    and no KV cache of their own, one small graph call per step."""

    method: Literal["medusa"] = Field(description="Speculative decoding method.")
    num_speculative_tokens: NumSpeculativeTokens
    heads: MedusaHeads = Field(description="Train the heads, or attach existing ones.")

    @model_validator(mode="after")
    def _enough_heads(self) -> MedusaSpeculative:
        train = self.heads.train
        if train is not None and self.num_speculative_tokens > train.num_heads:
            raise PydanticCustomError(
                "heads_count",
                "num_speculative_tokens ({k}) exceeds speculative.heads.train.num_heads ({n}): "
                "one head proposes each token",
                {"k": self.num_speculative_tokens, "n": train.num_heads},
            )
        return self


class EagleTrain(_Strict):
    """Self-distillation of an EAGLE-3 draft layer against the quantized target, on the
    recipe's calibration windows (`pipeline/heads/eagle_train.py`): from three of the target's
    hidden states and the next token's embedding, the layer learns the target's own
    distribution one position further on, and (training-time test) again from its own output
    for `ttt_steps - 1` more positions. The layer has the target's attention and MLP shapes,
    its embedding is the target's and its lm_head starts as the target's (full vocabulary)."""

    steps: int = Field(default=800, ge=1, description="Optimizer steps (AdamW).")
    learning_rate: float = Field(default=1e-3, gt=0, description="AdamW learning rate.")
    batch_size: int = Field(default=8, ge=1, description="Token spans per step.")
    span: int = Field(
        default=128, ge=8, description="Tokens per span (at most calibration.seq_len)."
    )
    ttt_steps: int = Field(
        default=3,
        ge=1,
        le=8,
        description="Drafting steps unrolled in training (EAGLE-3's "
        "training-time test): 1 trains on the target's features only.",
    )
    aux_layers: tuple[int, int, int] | None = Field(
        default=None,
        description="The target layers whose inputs feed the draft (3 indices); default "
        "vLLM's: 2, num_layers // 2, num_layers - 3.",
    )
    seed: int = Field(default=0, ge=0, description="Seed for the spans each step draws.")


class EagleHeads(_TrainOrAttach):
    """Where the EAGLE-3 draft comes from: trained here (`train`), or an existing checkpoint
    in the speculators format (`attach`: config.json with speculators_model_type eagle3 +
    safetensors: fc, layers.0.*, norm, lm_head over a draft vocabulary with d2t / t2d)."""

    train: EagleTrain | None = Field(default=None, description="Train the draft in the build.")
    attach: str | None = Field(
        default=None,
        min_length=1,
        description="Directory of an EAGLE-3 checkpoint in the speculators format (relative "
        "to the recipe file); its vocab_size and target hidden size must be the target's.",
    )


class EagleSpeculative(_Strict):
    """An EAGLE-3 draft layer proposes the tokens one at a time from three of the target's
    hidden states (its first draft) and from its own output (the next ones), with a KV cache
    of its own in the target's block tables."""

    method: Literal["eagle"] = Field(description="Speculative decoding method.")
    num_speculative_tokens: NumSpeculativeTokens
    heads: EagleHeads = Field(description="Train the draft layer, or attach an existing one.")


# Discriminated by `method`: an unknown method fails with the list of known ones, and a field
# of another method (draft under ngram, prompt_lookup_* under draft_model) is an unknown field.
Speculative = Annotated[
    NgramSpeculative | DraftModelSpeculative | MedusaSpeculative | EagleSpeculative,
    Field(discriminator="method"),
]
