"""Qwen2 (``Qwen2ForCausalLM``): Llama's layer with q/k/v biases always (o_proj none,
whatever ``attention_bias`` says), a window when ``use_sliding_window``; llama.cpp runs it as
``qwen2``, with NEOX RoPE, so its GGUF keeps HF's q/k row order."""

from __future__ import annotations

from dataclasses import replace

from ..family import Biases, Gguf
from .llama import PLUGIN as LLAMA

__all__ = ["PLUGIN"]

PLUGIN = replace(
    LLAMA,
    name="qwen2",
    hf_class="Qwen2ForCausalLM",
    biases=Biases(qkv=True, o=False),
    gguf=Gguf("qwen2", permute_rotated=False),
)
