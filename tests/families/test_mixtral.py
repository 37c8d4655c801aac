"""Mixtral (a sparse mixture of experts in every layer: top-2 of 4, a sliding window) on the
build side, against transformers' own Mixtral: config.json -> ModelConfig, the IR's logits,
the calibration rule for an expert no token reaches, every quantizer on experts, the interop
files in transformers and llama.cpp, the preflight's GGUF refusal."""

from __future__ import annotations

import pytest
import torch
from moe_checks import (
    CALIBRATED,
    assert_llama_cpp_runs_the_gguf,
    assert_method_quantizes_the_experts,
    assert_starved_expert_is_sane,
    assert_transformers_loads_compressed_tensors,
    rtn_ir,
)

from ingot.pipeline.interop import interop_problems
from ingot.pipeline.model.architecture import linear_names, parameter_count
from ingot.pipeline.model.config import ConfigError, ModelConfig
from ingot.pipeline.model.layers import SparseMoE
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.summary import summaries
from ingot.pipeline.recipe import load_recipe
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import write_recipe
from harness import (
    TINY,
    WINDOW,
    assert_ir_matches_transformers,
    tiny_checkpoint,
)

MIXTRAL = dict(
    num_local_experts=4, num_experts_per_tok=2, intermediate_size=96, sliding_window=WINDOW
)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("mixtral"), "mixtral", **MIXTRAL)


def test_config_describes_the_experts(mixtral):
    cfg = ModelConfig.from_dir(mixtral)
    assert (cfg.num_experts, cfg.top_k, cfg.norm_topk_prob) == (4, 2, True)
    assert (cfg.moe_layers, cfg.expert_intermediate_size, cfg.sliding_window) == ((0, 1), 96, 16)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    names = linear_names(cfg)
    assert "layers.1.mlp.experts.3.down_proj" in names
    assert not any("router" in n for n in names)  # the router stays float
    # Active parameters: top-2 of 4 experts' MLPs per layer.
    expert = 3 * 64 * 96
    assert parameter_count(cfg) - parameter_count(cfg, active=True) == 2 * 2 * expert


def test_top_k_beyond_the_experts_is_refused():
    hf = {"model_type": "mixtral", **TINY, **MIXTRAL, "num_experts_per_tok": 5}
    with pytest.raises(ConfigError, match="num_experts_per_tok 5 is not between 1 and"):
        ModelConfig.from_hf(hf)


def test_ir_logits_match_transformers(mixtral):
    assert_ir_matches_transformers(mixtral, seq_len=40)
    ir = load_model(mixtral)
    assert all(isinstance(layer.mlp, SparseMoE) for layer in ir.layers)
    # Every expert is chosen by some token: the comparison covers the whole routing.
    ids = torch.randint(0, TINY["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        x = ir.layers[0].mlp_norm(ir.embed_tokens(ids)).reshape(-1, TINY["hidden_size"])
        assert ir.layers[0].mlp.route(x)[1].unique().numel() == 4


def test_an_expert_without_calibration_tokens_gets_sane_weights(mixtral, tmp_path):
    assert_starved_expert_is_sane(mixtral, tmp_path)


@pytest.mark.parametrize("method", sorted(CALIBRATED))
def test_calibrated_methods_quantize_every_expert_and_keep_the_routers(mixtral, method):
    assert_method_quantizes_the_experts(mixtral, CALIBRATED[method])


def test_compressed_tensors_loads_in_transformers(mixtral, tmp_path):
    ir = rtn_ir(mixtral, tmp_path / "ir")
    assert_transformers_loads_compressed_tensors(mixtral, ir, tmp_path / "ct")


def test_gguf_runs_in_llama_cpp(tmp_path):
    full = {**MIXTRAL, "sliding_window": None}  # llama.cpp runs Mixtral without a window
    ckpt = tiny_checkpoint(tmp_path / "ckpt", "mixtral", **full)
    assert_llama_cpp_runs_the_gguf(ckpt, tmp_path, "llama")


def test_gguf_of_a_binding_window_is_refused_before_any_work(mixtral, tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", mixtral, interop=["gguf"]))
    [problem] = interop_problems(recipe, ModelConfig.from_dir(mixtral))
    assert "llama.cpp runs this model without sliding-window attention" in problem


def test_a_searched_entry_lists_its_calibrated_experts(mixtral):
    """quantize.json of `method: auto`: the experts its resolved (calibrated) entries
    quantized are listed under it, as under any entry."""
    auto = {
        "method": "auto",
        "budget_bits": 6.0,
        "candidates": [
            {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True},
            {"method": "gptq", "bits": 8, "group_size": -1, "symmetric": True},
        ],
    }
    record = {"routed_tokens": 7, "statistics": "all_tokens"}
    experts = {"layers.1.mlp.experts.2": record}
    searched = {0: {"resolved": [{"modules": 3}]}}
    names = linear_names(ModelConfig.from_dir(mixtral))
    [summary] = summaries([quantize_entry(auto)], names, searched, experts=experts)
    assert summary["experts"] == experts and summary["modules"] == 3
