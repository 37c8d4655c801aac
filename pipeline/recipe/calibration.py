"""The `calibration` section: the text activation-aware quantizers (gptq, awq) run through."""

from __future__ import annotations

from pydantic import Field

from .base import _Strict

__all__ = ["Calibration"]


class Calibration(_Strict):
    """Text the activation-aware quantizers run through the model (RTN does not use it)."""

    dataset: str = Field(
        min_length=1, description="Hub dataset id, or a local .txt / .jsonl / .parquet file."
    )
    split: str = Field(default="train", min_length=1, description="Dataset split to sample.")
    text_field: str = Field(
        default="text", min_length=1, description="Column (or JSON key) holding the text."
    )
    samples: int = Field(default=128, gt=0, description="Number of calibration sequences.")
    seq_len: int = Field(default=512, ge=16, description="Tokens per calibration sequence.")
    seed: int = Field(default=0, ge=0, description="Seed for choosing the samples.")
