"""Questions about a model's decoder layer, answered from its family's `LayerSpec`.

`layers.py` is the PyTorch definition that runs (its linears take their shapes and biases from
the family's table); these functions answer for the code that reasons about modules without
building them: the recipe checks (names, input widths), the quantizers (groups in compute
order, what scales fold into), interop (shapes, tying) and `ingot plan` (parameter counts).
tests/pipeline/test_architecture.py checks the table against the IR for every registered
family and variant (GQA, Qwen2's qkv bias, Llama's attention_bias, explicit head_dim, tied
embeddings). Torch-free: the recipe checks import it.

The constants (LAYER_LINEARS, LAYER_GROUPS, NORM_GROUPS, QKV, O, GATE_UP, DOWN) are the layer
Llama, Mistral and Qwen2 share (`families/llama.py`); code that must serve a family with
another layer reads ``cfg.family.layer`` instead.
"""

from __future__ import annotations

from .config import ModelConfig
from .families.llama import DOWN, GATE_UP, LAYER, QKV, O
from .family import EXPERT, LM_HEAD, Dim, LayerLinear, LayerSpec
from .selection import EMBEDDING, Holder

__all__ = [
    "DOWN",
    "EMBEDDING_TABLE",
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
    "fused_names",
    "has_bias",
    "layer_linear",
    "linear_names",
    "linear_shape",
    "lm_head_source",
    "parameter_count",
    "scaling_groups",
    "stays_float",
]

LAYER_LINEARS = LAYER.linears
LAYER_GROUPS = LAYER.groups
# (norm, group): the groups whose shared input is an RMSNorm's output, where a per-input-channel
# scale folds into the norm's weight (SmoothQuant smooths these only).
NORM_GROUPS = LAYER.norm_groups

_LABELS: dict[Dim, str] = {
    "hidden": "hidden_size",
    "intermediate": "intermediate_size",
    "q": "num_attention_heads * head_dim",
    "kv": "num_key_value_heads * head_dim",
    "vocab": "vocab_size",
    "experts": "the number of experts",
    "expert_intermediate": "the experts' intermediate size",
}


# The embedding table [vocab, hidden] is quantized as the weight of a linear hidden -> vocab
# (lm_head's shape: blocks along hidden), so group sizes are checked as lm_head's are.
EMBEDDING_TABLE = LayerLinear(EMBEDDING, "hidden", "vocab")


def _layer(cfg: ModelConfig | None, name: str) -> LayerSpec:
    """The spec of the layer a linear `layers.{i}.…` belongs to (its per-expert entries as
    templates: `LayerSpec.linear` matches an expert's name to them)."""
    if cfg is None:
        return LAYER
    if name.startswith("layers.") and int(name.split(".")[1]) in cfg.moe_layers:
        return cfg.family.sparse_layer
    return cfg.family.layer


def layer_linear(name: str, cfg: ModelConfig | None = None) -> LayerLinear:
    """The table's entry for a linear by its IR name (`layers.3.mlp.up_proj`, `lm_head`), in
    `cfg`'s family (None: the Llama layer)."""
    if name == LM_HEAD.name:
        return LM_HEAD
    if name == EMBEDDING_TABLE.name:
        return EMBEDDING_TABLE
    local = name.split(".", 2)[2] if name.startswith("layers.") else name
    layer = _layer(cfg, name)
    try:
        return layer.linear(local)
    except KeyError:
        family = "the Llama family" if cfg is None else f"the {cfg.architecture} family"
        raise KeyError(f"{name!r} is not a linear of {family}") from None


def dim_size(cfg: ModelConfig, dim: Dim) -> int:
    return {
        "hidden": cfg.hidden_size,
        "intermediate": cfg.intermediate_size,
        "q": cfg.num_heads * cfg.head_dim,
        "kv": cfg.num_kv_heads * cfg.head_dim,
        "vocab": cfg.vocab_size,
        "experts": cfg.num_experts,
        "expert_intermediate": cfg.expert_intermediate_size,
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
    linear = layer_linear(name, cfg)
    return dim_size(cfg, linear.in_dim), dim_size(cfg, linear.out_dim)


def has_bias(cfg: ModelConfig, linear: LayerLinear) -> bool:
    """Whether the linear has a bias in this model (its flag, set from config.json)."""
    return linear.bias is not None and getattr(cfg, linear.bias)


def linear_names(cfg: ModelConfig) -> list[str]:
    """IR names of every linear a quantize entry may select, in model order.

    The embedding is a lookup table, not a linear: it is not listed, and an entry selects it
    by its exact name only (`selection.embedding_entry`). `lm_head` is
    listed even with tied embeddings: it is then the embedding matrix used as a linear, and a
    recipe may still choose to quantize or ignore it.
    """
    per_layer = [
        f"layers.{i}.{m.name}"
        for i in range(cfg.num_layers)
        for m in cfg.layer_spec(i).linears
        if not stays_float(m)
    ]
    return [*per_layer, LM_HEAD.name]


def stays_float(linear: LayerLinear) -> bool:
    """A router (one logit per expert) stays float: no quantize entry selects it. It is a
    sliver of a layer's weights, and a rounded logit can change which experts compute."""
    return linear.out_dim == "experts"


def _linear_parameters(cfg: ModelConfig, m: LayerLinear) -> int:
    out = dim_size(cfg, m.out_dim)
    return dim_size(cfg, m.in_dim) * out + (out if has_bias(cfg, m) else 0)


def fused_names(cfg: ModelConfig) -> dict[str, Holder]:
    """{IR linear: the fused checkpoint tensor holding it} for every layer (`FusedLinear`:
    `layers.0.attn.q_proj` -> `layers.0.attn.qkv_proj` with its parts); empty for a family
    storing each linear on its own. A recipe pattern naming the fused tensor selects its
    parts (selection.py)."""
    holders = {}
    for i in range(cfg.num_layers):
        for fused in cfg.family.fused:
            parts = tuple(f"layers.{i}.{part}" for part in fused.parts)
            holder = Holder(f"layers.{i}.{fused.name}", parts)
            holders |= dict.fromkeys(parts, holder)
    return holders


def parameter_count(cfg: ModelConfig, *, active: bool = False) -> int:
    """The model's parameters: every layer's linears (biases included) and norms (per-head
    q/k norms too), the final norm, the embedding, and lm_head unless tied. `active`: those
    one token computes with (of a sparse layer's experts, the top_k chosen; the same as the
    total for a dense model)."""
    layers = 0
    for i in range(cfg.num_layers):
        spec = cfg.family.sparse_layer if i in cfg.moe_layers else cfg.family.layer
        copies = cfg.top_k if active else cfg.num_experts  # of each per-expert linear
        layers += sum(
            _linear_parameters(cfg, m) * (copies if EXPERT in m.name else 1) for m in spec.linears
        )
        layers += len(spec.norms) * cfg.hidden_size + len(spec.head_norms) * cfg.head_dim
    table = cfg.vocab_size * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else table
    return layers + cfg.hidden_size + table + head


def lm_head_source(cfg: ModelConfig) -> str:
    """The checkpoint tensor that holds lm_head's weight: the embedding's when tied."""
    return "embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"


def scaling_groups(cfg: ModelConfig, layer: int = 0) -> list[tuple[str, tuple[str, ...]]]:
    """(module whose output is a group's input, the group): where a per-input-channel scale
    of the group (AWQ, SmoothQuant) can be folded without changing the float model, in
    compute order (`ScaleFold`: a fold through whole heads only without GQA), in decoder
    layer `layer` (a sparse layer's differ from a dense one's)."""
    mha = cfg.num_heads == cfg.num_kv_heads
    folds = cfg.layer_spec(layer).folds
    return [(f.source, f.group) for f in folds if mha or not f.whole_heads]
