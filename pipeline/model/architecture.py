"""The Llama family's architecture as data: the one table of what a decoder layer holds.

`layers.py` is the PyTorch definition that runs; this table says the same thing for the code
that reasons about modules without building them: the recipe checks (names, input widths),
the quantizers (groups in compute order, what scales fold into), interop (shapes, tying) and
`ingot plan` (parameter counts). tests/pipeline/test_architecture.py checks the table against
the IR for every supported variant (GQA, Qwen2's qkv bias, Llama's attention_bias, explicit
head_dim, tied embeddings). Torch-free: the recipe checks import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .config import ModelConfig

__all__ = [
    "DOWN",
    "GATE_UP",
    "LAYER_GROUPS",
    "LAYER_LINEARS",
    "LM_HEAD",
    "NORM_GROUPS",
    "O",
    "QKV",
    "LayerLinear",
    "dim_label",
    "dim_size",
    "layer_linear",
    "linear_names",
    "linear_shape",
    "lm_head_source",
    "scaling_groups",
]

# The widths a linear reads or writes, by what config.json derives them from.
Dim = Literal["hidden", "intermediate", "q", "kv", "vocab"]


@dataclass(frozen=True, slots=True)
class LayerLinear:
    """One linear of a decoder layer. `bias` names the ModelConfig flag that gives it one."""

    name: str  # inside the layer: "attn.q_proj"; the IR's full name is layers.{i}.<name>
    in_dim: Dim
    out_dim: Dim
    bias: Literal["qkv_bias", "o_bias"] | None = None


LAYER_LINEARS = (
    LayerLinear("attn.q_proj", "hidden", "q", "qkv_bias"),
    LayerLinear("attn.k_proj", "hidden", "kv", "qkv_bias"),
    LayerLinear("attn.v_proj", "hidden", "kv", "qkv_bias"),
    LayerLinear("attn.o_proj", "q", "hidden", "o_bias"),
    LayerLinear("mlp.gate_proj", "hidden", "intermediate"),
    LayerLinear("mlp.up_proj", "hidden", "intermediate"),
    LayerLinear("mlp.down_proj", "intermediate", "hidden"),
)
LM_HEAD = LayerLinear("lm_head", "hidden", "vocab")

# The layer's linears in the order their inputs are computed; the linears of a group share
# one input. Each group's input depends only on the groups before it (true-sequential order).
QKV = ("attn.q_proj", "attn.k_proj", "attn.v_proj")
O = ("attn.o_proj",)  # noqa: E741 - the projection's own name
GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
DOWN = ("mlp.down_proj",)
LAYER_GROUPS = (QKV, O, GATE_UP, DOWN)
# (norm, group): the groups whose shared input is an RMSNorm's output, where a per-input-channel
# scale folds into the norm's weight (SmoothQuant smooths these only).
NORM_GROUPS = (("attn_norm", QKV), ("mlp_norm", GATE_UP))

_LABELS: dict[Dim, str] = {
    "hidden": "hidden_size",
    "intermediate": "intermediate_size",
    "q": "num_attention_heads * head_dim",
    "kv": "num_key_value_heads * head_dim",
    "vocab": "vocab_size",
}


def layer_linear(name: str) -> LayerLinear:
    """The table's entry for a linear by its IR name (`layers.3.mlp.up_proj`, `lm_head`)."""
    local = name.split(".", 2)[2] if name.startswith("layers.") else name
    for linear in (*LAYER_LINEARS, LM_HEAD):
        if linear.name == local:
            return linear
    raise KeyError(f"{name!r} is not a linear of the Llama family")


def dim_size(cfg: ModelConfig, dim: Dim) -> int:
    return {
        "hidden": cfg.hidden_size,
        "intermediate": cfg.intermediate_size,
        "q": cfg.num_heads * cfg.head_dim,
        "kv": cfg.num_kv_heads * cfg.head_dim,
        "vocab": cfg.vocab_size,
    }[dim]


def dim_label(cfg: ModelConfig, dim: Dim) -> str:
    """What a user's config.json calls the width: attention widths equal to hidden_size are
    called hidden_size (the common case); otherwise heads * head_dim (Mistral-Nemo: 32 * 128
    != 5120)."""
    if dim in ("q", "kv") and dim_size(cfg, dim) == cfg.hidden_size:
        return _LABELS["hidden"]
    return _LABELS[dim]


def linear_shape(cfg: ModelConfig, name: str) -> tuple[int, int]:
    """(input width K, output width N) of a linear by its IR name; its weight is [N, K]."""
    linear = layer_linear(name)
    return dim_size(cfg, linear.in_dim), dim_size(cfg, linear.out_dim)


def linear_names(cfg: ModelConfig) -> list[str]:
    """IR names of every linear a quantize entry may select, in model order.

    The embedding is a lookup table, not a linear, so it is never selected. `lm_head` is
    listed even with tied embeddings: it is then the embedding matrix used as a linear, and a
    recipe may still choose to quantize or ignore it.
    """
    per_layer = [f"layers.{i}.{m.name}" for i in range(cfg.num_layers) for m in LAYER_LINEARS]
    return [*per_layer, LM_HEAD.name]


def lm_head_source(cfg: ModelConfig) -> str:
    """The checkpoint tensor that holds lm_head's weight: the embedding's when tied."""
    return "embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"


def scaling_groups(cfg: ModelConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(module whose output is a group's input, the group): where a per-input-channel scale
    of the group (AWQ, SmoothQuant) can be folded without changing the float model.

    The norms scale their outputs directly; v_proj's output reaches o_proj through the
    attention's weighted sum, one head to one head, so only without GQA (a shared kv head
    would need one scale for several query heads); up_proj's output reaches down_proj through
    the elementwise product with silu(gate)."""
    attn, mlp = NORM_GROUPS
    groups = [attn]
    if cfg.num_heads == cfg.num_kv_heads:
        groups.append(("attn.v_proj", O))
    groups += [mlp, ("mlp.up_proj", DOWN)]
    return groups
