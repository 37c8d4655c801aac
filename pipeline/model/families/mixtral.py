"""Mixtral (``MixtralForCausalLM``): Mistral's attention and a sparse mixture of experts in
every layer: a router (``block_sparse_moe.gate``) picks ``num_experts_per_tok`` of
``num_local_experts`` SwiGLU experts (``w1`` gate, ``w3`` up, ``w2`` down, each
``intermediate_size`` wide) per token; their softmax weights are always renormalised over the
chosen. llama.cpp runs it as ``llama`` with the experts' tensors stacked.
"""

from __future__ import annotations

from dataclasses import replace

from ..family import LayerLinear, LayerSpec, MoeRule, ScaleFold, TensorNames
from .llama import LAYER, QKV, O
from .llama import PLUGIN as LLAMA

__all__ = ["EXPERT_DOWN", "EXPERT_GATE_UP", "PLUGIN", "ROUTER", "SPARSE_LAYER"]

ROUTER = "mlp.router"
EXPERT_GATE_UP = ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj")
EXPERT_DOWN = ("mlp.experts.{e}.down_proj",)

# Llama's attention; the MLP is the router and the experts. Every expert's gate/up reads the
# post-attention norm's output (on the tokens routed to it), which the router reads too: no
# scale folds into that norm without changing the routing, so the experts' gate/up have no
# norm fold; an expert's up_proj output reaches its down_proj elementwise, as in Llama.
SPARSE_LAYER = LayerSpec(
    linears=(
        *LAYER.linears[:4],
        LayerLinear(ROUTER, "hidden", "experts"),
        LayerLinear(EXPERT_GATE_UP[0], "hidden", "expert_intermediate"),
        LayerLinear(EXPERT_GATE_UP[1], "hidden", "expert_intermediate"),
        LayerLinear(EXPERT_DOWN[0], "expert_intermediate", "hidden"),
    ),
    groups=(QKV, O, (ROUTER,), EXPERT_GATE_UP, EXPERT_DOWN),
    norms=LAYER.norms,
    folds=(*LAYER.folds[:2], ScaleFold("mlp.experts.{e}.up_proj", EXPERT_DOWN)),
    rotated=LAYER.rotated,
)

_HF_MOE, _IR_EXPERT = "model.layers.{i}.block_sparse_moe.", "layers.{i}.mlp.experts.{e}."

# HF's per-expert names (transformers' save_pretrained writes these), before Llama's.
TENSOR_NAMES = TensorNames(
    (
        (f"{_HF_MOE}gate.", "layers.{i}.mlp.router."),
        (f"{_HF_MOE}experts.{{e}}.w1.", f"{_IR_EXPERT}gate_proj."),
        (f"{_HF_MOE}experts.{{e}}.w3.", f"{_IR_EXPERT}up_proj."),
        (f"{_HF_MOE}experts.{{e}}.w2.", f"{_IR_EXPERT}down_proj."),
        *LLAMA.tensor_names.prefixes,
    )
)

PLUGIN = replace(
    LLAMA,
    name="mixtral",
    hf_class="MixtralForCausalLM",
    tensor_names=TENSOR_NAMES,
    sparse_layer=SPARSE_LAYER,
    # transformers' MixtralConfig: 8 experts, 2 per token.
    moe=MoeRule(
        experts="num_local_experts",
        norm_topk=True,
        defaults=(("num_local_experts", 8), ("num_experts_per_tok", 2)),
    ),
)
