"""Qwen3-MoE on the build side, against transformers' own Qwen3-MoE: per-head q/k norms,
head_dim apart from hidden / heads, top-2 of 4 experts not renormalised, a dense layer among
the sparse ones (mlp_only_layers), a sliding window, a tied head; config.json ->
ModelConfig, the IR's logits, the calibration rule, every quantizer on experts, the interop
files in transformers and llama.cpp (``qwen3moe``), the preflight's GGUF refusals."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from moe_checks import (
    CALIBRATED,
    assert_llama_cpp_runs_the_gguf,
    assert_method_quantizes_the_experts,
    assert_starved_expert_is_sane,
    assert_transformers_loads_compressed_tensors,
    rtn_ir,
)

from ingot.cli import main
from ingot.pipeline.interop import interop_problems
from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.model.layers import MLP, SparseMoE
from ingot.pipeline.model.load import load_model
from ingot.pipeline.plan import _Shapes, plan_build
from ingot.pipeline.recipe import load_recipe

from fixtures import write_recipe
from harness import (
    TINY,
    WINDOW,
    assert_ir_matches_transformers,
    tiny_checkpoint,
)

EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96, head_dim=32)
# Layers 0 and 2 sparse, layer 1 dense (intermediate_size 128); every layer slides.
FEATURES = dict(
    **EXPERTS,
    norm_topk_prob=False,
    mlp_only_layers=[1],
    num_hidden_layers=3,
    use_sliding_window=True,
    sliding_window=WINDOW,
    tie_word_embeddings=True,
)


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("qwen3-moe"), "qwen3_moe", **FEATURES)


def test_config_describes_the_experts(qwen3_moe):
    cfg = ModelConfig.from_dir(qwen3_moe)  # transformers 5 writes num_local_experts
    assert (cfg.num_experts, cfg.top_k, cfg.norm_topk_prob) == (4, 2, False)
    assert (cfg.moe_layers, cfg.expert_intermediate_size, cfg.intermediate_size) == (
        (0, 2),
        96,
        128,
    )
    assert (cfg.sliding_window, cfg.layer_windows, cfg.tie_word_embeddings) == (16, None, True)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    # Qwen's own config.json names: num_experts; every decoder_sparse_step-th layer sparse.
    hf = {"model_type": "qwen3_moe", **TINY, **EXPERTS, "num_hidden_layers": 4}
    assert ModelConfig.from_hf({**hf, "decoder_sparse_step": 2}).moe_layers == (1, 3)
    assert ModelConfig.from_hf({**hf, "num_experts": 0}).moe_layers == ()


def test_ir_logits_match_transformers(qwen3_moe):
    assert_ir_matches_transformers(qwen3_moe, seq_len=40)
    kinds = [type(layer.mlp) for layer in load_model(qwen3_moe).layers]
    assert kinds == [SparseMoE, MLP, SparseMoE]


def test_an_expert_without_calibration_tokens_gets_sane_weights(qwen3_moe, tmp_path):
    assert_starved_expert_is_sane(qwen3_moe, tmp_path)


@pytest.mark.parametrize("method", sorted(CALIBRATED))
def test_calibrated_methods_quantize_every_expert_and_keep_the_routers(qwen3_moe, method):
    assert_method_quantizes_the_experts(qwen3_moe, CALIBRATED[method])


def test_compressed_tensors_loads_in_transformers(qwen3_moe, tmp_path):
    ir = rtn_ir(qwen3_moe, tmp_path / "ir")
    assert_transformers_loads_compressed_tensors(qwen3_moe, ir, tmp_path / "ct")


def test_gguf_runs_in_llama_cpp(tmp_path):
    # What llama.cpp's qwen3moe runs: every layer sparse, renormalised, no window.
    ckpt = tiny_checkpoint(tmp_path / "ckpt", "qwen3_moe", **EXPERTS, norm_topk_prob=True)
    assert_llama_cpp_runs_the_gguf(ckpt, tmp_path, "qwen3moe")


def test_gguf_refusals_name_what_llama_cpp_cannot_run(qwen3_moe, tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", qwen3_moe, interop=["gguf"]))
    problems = interop_problems(recipe, ModelConfig.from_dir(qwen3_moe))
    assert any("keeps layers [1] of 3 dense (config.json mlp_only_layers" in p for p in problems)
    assert any("llama.cpp renormalises the chosen experts' weights" in p for p in problems)
    assert any("norm_topk_prob false" in p for p in problems)


def test_plan_counts_total_and_active_parameters(qwen3_moe, tmp_path):
    """`ingot plan`: every expert's parameters, those a token computes with (2 of 4 experts
    in the 2 sparse layers), and the widest layer (a sparse one) sizing what a stage holds."""
    recipe = write_recipe(tmp_path / "r.yaml", qwen3_moe)
    hf = json.loads((qwen3_moe / "config.json").read_text())
    model = plan_build(load_recipe(recipe), recipe, hf, qwen3_moe).model
    expert = 3 * 64 * 96  # gate, up, down of one expert
    assert model["params"] - model["active_params"] == 2 * 2 * expert
    attention = 64 * (4 * 32) * 2 + 64 * (2 * 32) * 2  # q, o; k, v
    norms = 2 * 64 + 2 * 32  # the layer's two norms, the q/k norms over head_dim
    widest = attention + 64 * 4 + 4 * expert + norms  # router + 4 experts: the sparse layer
    assert model["experts"] == {
        "count": 4,
        "per_token": 2,
        "sparse_layers": 2,
        "widest_layer_params": widest,
    }
    # The calibrated walk's inputs: q,k,v and o over every token, each expert's gate,up and
    # down over the half (top-2 of 4) routed to it (GPTQ's Hessians, one per group).
    expert_inputs = [(64, 50.0), (96, 50.0)] * 4
    assert _Shapes(ModelConfig.from_hf(hf)).inputs(100) == ((64, 100), (128, 100), *expert_inputs)
    result = CliRunner().invoke(main, ["plan", "--recipe", str(recipe)])
    assert result.exit_code == 0, result.output
    assert "M active: 2 of 4 experts per token" in result.output.splitlines()[0]
