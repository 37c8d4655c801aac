"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3's attention (per-head q/k norms, NEOX RoPE) and
Mixtral's sparse layer: a router (``mlp.gate``) picks ``num_experts_per_tok`` of
``num_experts`` SwiGLU experts (``mlp.experts.{e}.gate_proj / up_proj / down_proj``,
``moe_intermediate_size`` wide) per token, their softmax weights renormalised over the chosen
when ``norm_topk_prob``. A layer in ``mlp_only_layers``, or off every ``decoder_sparse_step``-th,
keeps a dense MLP of ``intermediate_size``. No shared expert (Qwen2-MoE's). A window
(``sliding_window``) on every layer when ``use_sliding_window``. llama.cpp runs it as
``qwen3moe`` with the experts' tensors stacked.
"""

from __future__ import annotations

from dataclasses import replace

from ..family import Gguf, MoeRule, TensorNames, WindowRule
from .mixtral import SPARSE_LAYER
from .qwen3 import PLUGIN as QWEN3

__all__ = ["PLUGIN"]

PLUGIN = replace(
    QWEN3,
    name="qwen3_moe",
    hf_class="Qwen3MoeForCausalLM",
    # The experts' names are the IR's already; the router is HF's `gate`.
    tensor_names=TensorNames(
        (("model.layers.{i}.mlp.gate.", "layers.{i}.mlp.router."), *QWEN3.tensor_names.prefixes)
    ),
    # transformers' Qwen3MoeAttention slides every layer when use_sliding_window.
    window=WindowRule(switch_default=False),
    sparse_layer=replace(SPARSE_LAYER, head_norms=QWEN3.layer.head_norms),
    # transformers' Qwen3MoeConfig: 128 experts, 8 per token, 768 wide, not renormalised.
    moe=MoeRule(
        experts="num_experts",
        norm_topk="norm_topk_prob",
        expert_intermediate="moe_intermediate_size",
        sparse_step="decoder_sparse_step",
        dense_layers="mlp_only_layers",
        defaults=(("num_experts", 128), ("num_experts_per_tok", 8), ("moe_intermediate_size", 768)),
        # Qwen's checkpoints write num_experts; transformers 5's save_pretrained writes its
        # attribute_map's num_local_experts.
        aliases=(("num_local_experts", "num_experts"),),
    ),
    gguf=Gguf("qwen3moe", permute_rotated=False),
)
