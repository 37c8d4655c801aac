"""Model families: the registry, each family's config.json rules, and the blocks the IR and the
ONNX decoder implement for the features a family names."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ingot.pipeline.export import decoder
from ingot.pipeline.model import layers, rope
from ingot.pipeline.model.config import ConfigError, ModelConfig
from ingot.pipeline.model.family import MODEL_FAMILIES
from ingot.pipeline.preflight import family_problems

from fixtures import BASE

FAMILIES = MODEL_FAMILIES.names()


def _cfg(model_type: str, **hf) -> ModelConfig:
    return ModelConfig.from_hf({"model_type": model_type, **BASE, **hf})


def test_registry_holds_the_families_by_model_type() -> None:
    assert FAMILIES[:3] == ("llama", "mistral", "qwen2")  # the built-ins, in declared order
    for name in FAMILIES:
        family = MODEL_FAMILIES.get(name)
        assert family.name == name
        assert _cfg(name).family is family


def test_unsupported_model_type_lists_the_registered_families() -> None:
    with pytest.raises(ConfigError) as err:
        _cfg("gpt2")
    supported = ", ".join(FAMILIES)  # "llama, mistral, qwen2" and any installed plug-in's
    assert (
        str(err.value)
        == f"config.json: model_type 'gpt2' is not supported (supported: {supported})"
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_every_feature_a_family_names_has_a_block(name: str) -> None:
    family = MODEL_FAMILIES.get(name)
    assert family.norm in layers.NORMS and family.norm in decoder.NORMS
    assert family.activation in layers.ACTIVATIONS and family.activation in decoder.ACTIVATIONS
    assert set(family.rope_scalings) <= set(rope.SCALINGS)
    sparse = () if family.sparse_layer is None else (family.sparse_layer.expand(3),)
    for layer in (family.layer, *sparse):
        names = [linear.name for linear in layer.linears]
        assert [n for group in layer.groups for n in group] == names  # each once, compute order
        assert set(layer.rotated) <= set(names)
        for fold in layer.folds:
            assert fold.group in layer.groups
            assert fold.source in layer.norms or fold.source in names


def test_bias_rules() -> None:
    # Llama (and Mistral): attention_bias gives all four projections a bias.
    for name in ("llama", "mistral"):
        assert not _cfg(name).qkv_bias and not _cfg(name).o_bias
        biased = _cfg(name, attention_bias=True)
        assert biased.qkv_bias and biased.o_bias
    # Qwen2: q/k/v always, o_proj never, whatever attention_bias says.
    for hf in ({}, {"attention_bias": True}):
        cfg = _cfg("qwen2", **hf)
        assert cfg.qkv_bias and not cfg.o_bias


def test_window_rules() -> None:
    assert _cfg("mistral", sliding_window=16).sliding_window == 16
    assert _cfg("mistral").sliding_window is None
    assert _cfg("qwen2", sliding_window=16, use_sliding_window=False).sliding_window is None
    # Qwen configs without use_sliding_window: off, as transformers' defaults.
    assert _cfg("qwen2", sliding_window=16, max_window_layers=0).sliding_window is None
    moe = {"num_experts": 4, "num_experts_per_tok": 2}
    assert _cfg("qwen3_moe", sliding_window=16, **moe).sliding_window is None
    # As transformers' Qwen2Config: layers from max_window_layers (default 28) on slide.
    on = {"sliding_window": 16, "use_sliding_window": True}
    assert _cfg("qwen2", **on).sliding_window is None  # 2 layers, none from layer 28 on
    assert _cfg("qwen2", **on, max_window_layers=0).sliding_window == 16
    full, local = "full_attention", "sliding_attention"
    assert _cfg("qwen2", **on, layer_types=[local, local]).sliding_window == 16
    assert _cfg("qwen2", **on, max_window_layers=0, layer_types=[full, full]).sliding_window is None
    # Mistral slides every layer whatever those keys say (transformers' MistralAttention).
    assert _cfg("mistral", sliding_window=16, max_window_layers=9).sliding_window == 16


@pytest.mark.parametrize(
    "hf", [{"max_window_layers": 1}, {"layer_types": ["full_attention", "sliding_attention"]}]
)
def test_mixed_local_and_global_layers_get_a_window_each(hf) -> None:
    cfg = _cfg("qwen2", sliding_window=16, use_sliding_window=True, **hf)
    assert cfg.sliding_window == 16 and cfg.layer_windows == (None, 16)
    assert cfg.windows == (None, 16) and cfg.window_of(0) is None
    # The per-layer windows survive the IR checkpoint's config round trip.
    assert type(cfg).from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_activation_and_rope_are_checked_against_the_family() -> None:
    with pytest.raises(ConfigError, match=r"hidden_act 'gelu' \(expected 'silu'\)"):
        _cfg("llama", hidden_act="gelu")
    with pytest.raises(ConfigError, match=r"rope type 'yarn' is not supported \(supported: "):
        _cfg("llama", rope_scaling={"rope_type": "yarn", "factor": 2.0})


# HF's post_attention_layernorm is the MLP's pre-norm in Llama's layer, the attention's
# post-norm in Gemma's sandwich layer (whose MLP pre-norm is pre_feedforward_layernorm).
_AFTER_ATTENTION = {"gemma3_text": "layers.0.attn_post_norm.weight"}


@pytest.mark.parametrize("name", FAMILIES)
def test_tensor_names_round_trip(name: str) -> None:
    names = MODEL_FAMILIES.get(name).tensor_names
    for hf, ir in (
        ("model.layers.3.self_attn.q_proj.weight", "layers.3.attn.q_proj.weight"),
        ("model.layers.12.input_layernorm.weight", "layers.12.attn_norm.weight"),
        (
            "model.layers.0.post_attention_layernorm.weight",
            _AFTER_ATTENTION.get(name, "layers.0.mlp_norm.weight"),
        ),
        ("model.embed_tokens.weight", "embed_tokens.weight"),
        ("lm_head.weight", "lm_head.weight"),
    ):
        assert names.to_ir(hf) == ir and names.to_hf(ir) == hf


def test_a_family_naming_a_block_ingot_lacks_fails_the_preflight() -> None:
    llama = MODEL_FAMILIES.get("llama")
    assert family_problems(llama, "source") == []
    gemma_like = replace(llama, name="gemmaish", activation="gelu_erf", norm="rms1p")
    assert family_problems(gemma_like, "source") == [
        "source: model family 'gemmaish' needs the norm 'rms1p', which ingot does not "
        "implement (implemented: gemma_rms, rms)",
        "source: model family 'gemmaish' needs the activation 'gelu_erf', which ingot "
        "does not implement (implemented: gelu_pytorch_tanh, silu)",
    ]
