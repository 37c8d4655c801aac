"""Llama (``LlamaForCausalLM``): the layer, tensor names and rules Mistral and Qwen2 reuse.

A pre-norm decoder layer: RMSNorm -> attention (q/k/v/o, GQA, rotate-half RoPE) -> residual,
RMSNorm -> SwiGLU MLP (gate/up/down) -> residual. ``attention_bias`` gives all four attention
projections a bias. llama.cpp runs it as ``llama``, with interleaved RoPE: the q/k rows are
reordered in GGUF.
"""

from __future__ import annotations

from ..family import Biases, Gguf, LayerLinear, LayerSpec, ModelFamily, ScaleFold, TensorNames

__all__ = ["DOWN", "GATE_UP", "LAYER", "O", "PLUGIN", "QKV", "TENSOR_NAMES"]

QKV = ("attn.q_proj", "attn.k_proj", "attn.v_proj")
O = ("attn.o_proj",)  # noqa: E741 - the projection's own name
GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
DOWN = ("mlp.down_proj",)

LAYER = LayerSpec(
    linears=(
        LayerLinear("attn.q_proj", "hidden", "q", "qkv_bias"),
        LayerLinear("attn.k_proj", "hidden", "kv", "qkv_bias"),
        LayerLinear("attn.v_proj", "hidden", "kv", "qkv_bias"),
        LayerLinear("attn.o_proj", "q", "hidden", "o_bias"),
        LayerLinear("mlp.gate_proj", "hidden", "intermediate"),
        LayerLinear("mlp.up_proj", "hidden", "intermediate"),
        LayerLinear("mlp.down_proj", "intermediate", "hidden"),
    ),
    groups=(QKV, O, GATE_UP, DOWN),
    norms=("attn_norm", "mlp_norm"),
    # The norms scale their outputs directly; v_proj's output reaches o_proj through the
    # attention's weighted sum, one head to one head; up_proj's output reaches down_proj
    # through the elementwise product with silu(gate).
    folds=(
        ScaleFold("attn_norm", QKV),
        ScaleFold("attn.v_proj", O, whole_heads=True),
        ScaleFold("mlp_norm", GATE_UP),
        ScaleFold("mlp.up_proj", DOWN),
    ),
    rotated=("attn.q_proj", "attn.k_proj"),
)

# The IR's layer-local names are shorter than HF's; the interop writers map them back.
TENSOR_NAMES = TensorNames(
    (
        ("model.embed_tokens.", "embed_tokens."),
        ("model.norm.", "norm."),
        ("model.layers.{i}.input_layernorm.", "layers.{i}.attn_norm."),
        ("model.layers.{i}.post_attention_layernorm.", "layers.{i}.mlp_norm."),
        ("model.layers.{i}.self_attn.", "layers.{i}.attn."),
        ("model.layers.{i}.mlp.", "layers.{i}.mlp."),
    )
)

PLUGIN = ModelFamily(
    name="llama",
    hf_class="LlamaForCausalLM",
    layer=LAYER,
    tensor_names=TENSOR_NAMES,
    biases=Biases(qkv="attention_bias", o="attention_bias"),
    gguf=Gguf("llama", permute_rotated=True),
)
