"""A toy model family, written as a contributor's own package would: Llama with q/k/v biases
(o_proj none) and a sliding window over every layer, config.json model_type "toyllama".

Its checkpoints are Qwen2's (use_sliding_window, max_window_layers 0) under another
model_type, so transformers' Qwen2 is the reference the tests compare it with. llama.cpp has
no architecture for it (gguf None). test_family_plugin.py registers it through the entry-point
group ``ingot.model_families``, as an installed distribution would.
"""

from __future__ import annotations

from dataclasses import replace

from ingot.pipeline.model.families.llama import PLUGIN as LLAMA
from ingot.pipeline.model.family import Biases

PLUGIN = replace(
    LLAMA,
    name="toyllama",
    hf_class="ToyLlamaForCausalLM",
    biases=Biases(qkv=True, o=False),
    gguf=None,
)
