"""A model, one decoder layer at a time: what every stage that walks the layers reads.

Quantization, export and the export check each visit the layers in order and need only one at
a time, so they take a `LayerSource` rather than a whole `LlamaModel`: a source over a model
in memory (`ModelLayers`, for tests and small models) and sources that read each layer from
disk when asked (the HF checkpoint, the quantize stage's IR) serve them alike, and a 70B
model costs one layer of memory, not seventy.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from .config import ModelConfig
from .layers import DecoderLayer
from .llama import LlamaModel
from .qembedding import QuantizedEmbedding

__all__ = ["LayerSource", "ModelLayers"]


class LayerSource(Protocol):
    """The parts of a decoder model, each loaded when asked for.

    `layer(i)` may return a fresh module each call (a disk source) or the model's own (a
    memory source): callers read it and let it go, and never assume it stays cached.
    """

    @property
    def cfg(self) -> ModelConfig: ...

    def embedding(self) -> torch.Tensor:
        """[vocab, hidden] float32: the token embedding table (a quantized one dequantized)."""
        ...

    def quantized_embedding(self) -> QuantizedEmbedding | None:
        """The embedding's codes and scales when it is quantized, else None."""
        ...

    def layer(self, i: int) -> DecoderLayer:
        """Decoder layer i (float or quantized linears), ready to run (eval mode)."""
        ...

    def final_norm(self) -> nn.Module:
        """The norm after the last layer (the family's norm block)."""
        ...

    def lm_head(self) -> nn.Module:
        """The output projection: a float Linear (its weight *is* `embedding()` when tied) or
        a QuantizedLinear."""
        ...

    @property
    def lm_head_tied(self) -> bool:
        """lm_head computes with the embedding's own tensor (stored once, exported once)."""
        ...


class ModelLayers:
    """A `LayerSource` over a model already in memory."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model

    @property
    def cfg(self) -> ModelConfig:
        return self.model.cfg

    def embedding(self) -> torch.Tensor:
        table = self.model.embed_tokens
        if isinstance(table, QuantizedEmbedding):
            return table.dequantize()
        return table.weight.detach().float()

    def quantized_embedding(self) -> QuantizedEmbedding | None:
        table = self.model.embed_tokens
        return table if isinstance(table, QuantizedEmbedding) else None

    def layer(self, i: int) -> DecoderLayer:
        return self.model.layers[i]

    def final_norm(self) -> nn.Module:
        return self.model.norm

    def lm_head(self) -> nn.Module:
        return self.model.lm_head

    @property
    def lm_head_tied(self) -> bool:
        return self.model.lm_head_tied
