"""Gemma 3's text decoder (``Gemma3ForCausalLM``, model_type ``gemma3_text``).

Llama's linears in a "sandwich" layer: RMSNorm -> attention (per-head q/k norms before RoPE,
scale query_pre_attn_scalar ** -0.5) -> RMSNorm -> residual, RMSNorm -> GeGLU MLP (tanh GELU)
-> RMSNorm -> residual. Its RMSNorm scales by (1 + w) (the "gemma_rms" block; the checkpoint
stores w). The embedding's rows are scaled by sqrt(hidden_size); lm_head is tied by default.
Sliding-window layers (``layer_types``, else every ``sliding_window_pattern``-th layer global)
rotate with a RoPE base of their own (``rope_local_base_freq``, or rope_parameters'
"sliding_attention"). llama.cpp runs it as ``gemma3`` with NEOX RoPE (HF's q/k row order).
"""

from __future__ import annotations

from ..family import Biases, Gguf, LayerSpec, ModelFamily, ScaleFold, TensorNames, WindowRule
from .llama import DOWN, GATE_UP, QKV, O
from .llama import LAYER as LLAMA_LAYER

__all__ = ["LAYER", "PLUGIN", "TENSOR_NAMES"]

LAYER = LayerSpec(
    linears=LLAMA_LAYER.linears,
    groups=LLAMA_LAYER.groups,
    norms=("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm"),
    # As Llama's: the pre-norms scale the groups' inputs; the post-norms scale what o_proj and
    # down_proj write to the residual stream, which no linear reads directly.
    folds=(
        ScaleFold("attn_norm", QKV),
        ScaleFold("attn.v_proj", O, whole_heads=True),
        ScaleFold("mlp_norm", GATE_UP),
        ScaleFold("mlp.up_proj", DOWN),
    ),
    rotated=LLAMA_LAYER.rotated,
    head_norms=("attn.q_norm", "attn.k_norm"),
    post_norms=("attn_post_norm", "mlp_post_norm"),
)

# HF's post_attention_layernorm is the attention's post-norm here (Llama's is the MLP's
# pre-norm): the IR names say which side of the sublayer each norm is on.
TENSOR_NAMES = TensorNames(
    (
        ("model.embed_tokens.", "embed_tokens."),
        ("model.norm.", "norm."),
        ("model.layers.{i}.input_layernorm.", "layers.{i}.attn_norm."),
        ("model.layers.{i}.post_attention_layernorm.", "layers.{i}.attn_post_norm."),
        ("model.layers.{i}.pre_feedforward_layernorm.", "layers.{i}.mlp_norm."),
        ("model.layers.{i}.post_feedforward_layernorm.", "layers.{i}.mlp_post_norm."),
        ("model.layers.{i}.self_attn.", "layers.{i}.attn."),
        ("model.layers.{i}.mlp.", "layers.{i}.mlp."),
    )
)

PLUGIN = ModelFamily(
    name="gemma3_text",
    hf_class="Gemma3ForCausalLM",
    layer=LAYER,
    tensor_names=TENSOR_NAMES,
    biases=Biases(qkv="attention_bias", o="attention_bias"),
    # transformers' Gemma3TextConfig: every 6th layer global unless layer_types says.
    window=WindowRule(
        switch=None, layer_types="layer_types", period="sliding_window_pattern", period_default=6
    ),
    norm="gemma_rms",
    activation="gelu_pytorch_tanh",
    activation_key="hidden_activation",
    rope_scalings=("default", "linear"),
    tie_default=True,
    gguf=Gguf("gemma3", permute_rotated=False, windows=True, wide_scale_layers=62),
    scale_embedding=True,
    attention_scalar_key="query_pre_attn_scalar",
    local_rope_theta_key="rope_local_base_freq",
    unsupported_keys=(
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "use_bidirectional_attention",
    ),
)
