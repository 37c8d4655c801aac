"""Phi-3 and Phi-4-mini (``Phi3ForCausalLM``, model_type ``phi3``): Llama's layer stored with
two fused tensors, ``self_attn.qkv_proj`` ([q; k; v] rows) and ``mlp.gate_up_proj`` ([gate;
up] rows), no biases, LongRoPE scaling (``longrope``, formerly ``su``: short / long factors
per frequency, an attention factor on cos / sin) and partial rotary
(``partial_rotary_factor``: Phi-4-mini rotates the first 3/4 of each head). A sliding window
over every layer when config.json's ``sliding_window`` is set (Phi-3-mini: 2047).

The IR splits the fused tensors into Llama's linears (`FusedLinear`): every stage (the
quantizers' groups and folds, the graph, the engines, speculation) then runs Phi-3 as it runs
Llama, the reader splits them at no cost (a row range of a row-major tensor is a contiguous
byte range), and the interop writers stack the parts again. llama.cpp runs it as ``phi3``,
with NEOX RoPE (HF's row order) and the fused ``attn_qkv`` / ``ffn_up`` tensors.
"""

from __future__ import annotations

from dataclasses import replace

from ..family import Biases, FusedLinear, Gguf
from .llama import GATE_UP, QKV
from .llama import PLUGIN as LLAMA

__all__ = ["PLUGIN"]

PLUGIN = replace(
    LLAMA,
    name="phi3",
    hf_class="Phi3ForCausalLM",
    biases=Biases(qkv=False, o=False),
    rope_scalings=("default", "longrope"),
    gguf=Gguf("phi3", permute_rotated=False, rope_scalings=("default", "longrope")),
    fused=(FusedLinear("attn.qkv_proj", QKV), FusedLinear("mlp.gate_up_proj", GATE_UP)),
)
