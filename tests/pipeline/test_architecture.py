"""The architecture table says what the IR builds: every linear's name, shape and bias for each
registered family and variant, the compute-order groups, the tying rule and the scaling
groups."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ingot.pipeline.model.architecture import (
    LAYER_GROUPS,
    LAYER_LINEARS,
    layer_linear,
    linear_names,
    linear_shape,
    lm_head_source,
    parameter_count,
    scaling_groups,
)
from ingot.pipeline.model.family import MODEL_FAMILIES
from ingot.pipeline.model.llama import LlamaModel

from fixtures import model_config

VARIANTS = {
    "llama-mha": {"num_key_value_heads": 4},
    "llama-gqa": {"num_key_value_heads": 2},
    "llama-attention-bias": {"attention_bias": True},
    "llama-explicit-head-dim": {"head_dim": 24},
    "llama-tied": {"tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2"},
    "mistral": {"model_type": "mistral", "sliding_window": 16},
    "phi3": {"model_type": "phi3", "partial_rotary_factor": 0.75},
    "qwen3": {"model_type": "qwen3", "head_dim": 24, "attention_bias": True},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 48,
        "mlp_only_layers": [1],
    },
}


def _ir(**overrides) -> LlamaModel:
    with torch.device("meta"):
        return LlamaModel(model_config(**overrides))


def test_every_registered_family_has_a_variant() -> None:
    covered = {overrides.get("model_type", "llama") for overrides in VARIANTS.values()}
    assert covered == set(MODEL_FAMILIES.names())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_table_matches_the_ir(variant: str) -> None:
    model = _ir(**VARIANTS[variant])
    cfg = model.cfg
    built = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    # A router stays float: no quantize entry selects it.
    assert [n for n in built if not n.endswith("router")] == linear_names(cfg)
    for name, linear in built.items():
        assert linear_shape(cfg, name) == (linear.in_features, linear.out_features), name
        flag = layer_linear(name, cfg).bias
        assert (linear.bias is not None) == (flag is not None and getattr(cfg, flag)), name


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parameter_count_is_the_irs(variant: str) -> None:
    model = _ir(**VARIANTS[variant])
    # A tied lm_head shares the embedding's tensor: parameters() yields it once.
    assert parameter_count(model.cfg) == sum(p.numel() for p in model.parameters())


def test_groups_cover_every_layer_linear_once_in_compute_order() -> None:
    assert [n for group in LAYER_GROUPS for n in group] == [m.name for m in LAYER_LINEARS]


def test_lm_head_tying() -> None:
    tied, untied = _ir(tie_word_embeddings=True), _ir()
    assert tied.lm_head_tied and not untied.lm_head_tied
    assert lm_head_source(tied.cfg) == "embed_tokens.weight"
    assert lm_head_source(untied.cfg) == "lm_head.weight"
    # A quantized lm_head holds its own codes: tie_lm_head leaves it alone.
    tied.lm_head = nn.Identity()
    tied.tie_lm_head()
    assert not tied.lm_head_tied


def test_linear_names() -> None:
    cfg = model_config()
    names = linear_names(cfg)
    assert names[0] == "layers.0.attn.q_proj"
    assert names[-1] == "lm_head"
    assert "embed_tokens" not in names  # a lookup table, never quantized as a linear
    assert len(names) == 1 + 7 * cfg.num_layers
    # Tied embeddings: lm_head is still a matrix used as a linear, so still selectable.
    assert "lm_head" in linear_names(model_config(tie_word_embeddings=True))


def test_unknown_linear_is_refused() -> None:
    with pytest.raises(KeyError, match="layers.0.attn.qkv_proj"):
        layer_linear("layers.0.attn.qkv_proj")


def test_scaling_groups_feed_their_groups() -> None:
    # Every group a scale folds into is one of the compute-order groups.
    for gqa in (2, 4):
        for _, group in scaling_groups(model_config(num_key_value_heads=gqa)):
            assert group in LAYER_GROUPS
