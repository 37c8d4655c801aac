"""Qwen3 (``Qwen3ForCausalLM``, dense): Llama's layer with an RMSNorm over head_dim on each q
and k head before RoPE (``q_norm`` / ``k_norm``), biases on the four attention projections only
when ``attention_bias`` says so, an explicit ``head_dim`` (config.py reads it for every family)
and Qwen2's window rule. llama.cpp runs it as ``qwen3``, with NEOX RoPE: its GGUF keeps HF's
q/k row order."""

from __future__ import annotations

from dataclasses import replace

from ..family import Biases, Gguf
from .llama import LAYER
from .llama import PLUGIN as LLAMA
from .qwen2 import PLUGIN as QWEN2

__all__ = ["PLUGIN"]

PLUGIN = replace(
    LLAMA,
    name="qwen3",
    hf_class="Qwen3ForCausalLM",
    layer=replace(LAYER, head_norms=("attn.q_norm", "attn.k_norm")),
    biases=Biases(qkv="attention_bias", o="attention_bias"),
    window=QWEN2.window,
    gguf=Gguf("qwen3", permute_rotated=False),
)
