"""Qwen2 (``Qwen2ForCausalLM``): Llama's layer with q/k/v biases always (o_proj none,
whatever ``attention_bias`` says), a window when ``use_sliding_window`` on the layers
transformers slides (``layer_types``, else layers from ``max_window_layers`` on, 28 by
default: none of a model of 28 layers or fewer); llama.cpp runs it as ``qwen2``, with NEOX
RoPE, so its GGUF keeps HF's q/k row order."""

from __future__ import annotations

from dataclasses import replace

from ..family import Biases, Gguf, WindowRule
from .llama import PLUGIN as LLAMA

__all__ = ["PLUGIN"]

PLUGIN = replace(
    LLAMA,
    name="qwen2",
    hf_class="Qwen2ForCausalLM",
    biases=Biases(qkv=True, o=False),
    # transformers' Qwen2Config: max_window_layers defaults to 28.
    window=WindowRule(
        layer_types="layer_types",
        first_sliding="max_window_layers",
        first_sliding_default=28,
        switch_default=False,
    ),
    gguf=Gguf("qwen2", permute_rotated=False),
)
