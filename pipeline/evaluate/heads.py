"""What quantizing the embedding and lm_head costs: the IR scored again with the source's
float embedding and lm_head in their place (everything else as quantized), so the report can
attribute the IR's perplexity delta to them (the IR's perplexity minus this one)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..model.architecture import LM_HEAD
from ..model.llama import LlamaModel
from ..model.load import CheckpointReader
from ..model.qembedding import EMBEDDING, QuantizedEmbedding
from ..model.qlinear import QuantizedLinear

__all__ = ["quantized_heads", "with_float_heads"]


def quantized_heads(model: LlamaModel) -> list[str]:
    """The IR names of the quantized embedding and lm_head of `model` (either, both, none)."""
    names = []
    if isinstance(model.embed_tokens, QuantizedEmbedding):
        names.append(EMBEDDING)
    if isinstance(model.lm_head, QuantizedLinear):
        names.append(LM_HEAD.name)
    return names


def with_float_heads(model: LlamaModel, source: Path) -> LlamaModel:
    """`model` (the IR) with the embedding and lm_head of the float checkpoint at `source`,
    tied again where the config ties them; the layers stay as quantized."""
    reader = CheckpointReader(source, model.cfg)
    model.embed_tokens = nn.Embedding.from_pretrained(reader.embedding(), freeze=True)
    if model.cfg.tie_word_embeddings:  # the float head is the embedding's own tensor
        with torch.device("meta"):
            model.lm_head = nn.Linear(model.cfg.hidden_size, model.cfg.vocab_size, bias=False)
        model.tie_lm_head()
    else:
        model.lm_head = reader.lm_head()
    return model.eval()
