"""Mixtral (sparse mixture of experts, top-2 of 4 experts, a sliding window): config.json ->
ModelConfig, and the IR's logits equal transformers' on a tiny random checkpoint made by
transformers itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.model.architecture import linear_names, parameter_count
from ingot.pipeline.model.config import ConfigError, ModelConfig
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.layers import SparseMoE
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.driver import quantize_layers
from ingot.pipeline.quantize.ir_layers import IRLayers
from ingot.pipeline.quantize.method import method_of
from ingot.pipeline.quantize.moe_calibration import ALL_TOKENS, ROUTED, min_routed_tokens
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import BASE, write_tokenizer

WINDOW = 16
W4 = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True, "ignore": ["lm_head"]}
MIXTRAL = dict(
    num_local_experts=4, num_experts_per_tok=2, intermediate_size=96, sliding_window=WINDOW
)


def moe_checkpoint(path: Path, model_type: str, seed: int = 0, **config) -> Path:
    """A random checkpoint of `model_type` made and saved by transformers, weights widened
    (std 0.15) so logits and routing are not trivial."""
    torch.manual_seed(seed)
    hf_config = AutoConfig.for_model(model_type, **{**BASE, **config})
    model = AutoModelForCausalLM.from_config(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.15)
    model.save_pretrained(path)
    write_tokenizer(path, hf_config.vocab_size)
    return path


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory) -> Path:
    return moe_checkpoint(tmp_path_factory.mktemp("mixtral"), "mixtral", **MIXTRAL)


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


def test_top_k_beyond_the_experts_is_refused(mixtral):
    hf = {"model_type": "mixtral", **BASE, **MIXTRAL, "num_experts_per_tok": 5}
    with pytest.raises(ConfigError, match="num_experts_per_tok 5 is not between 1 and"):
        ModelConfig.from_hf(hf)


def test_ir_logits_equal_transformers(mixtral):
    ir = load_model(mixtral)
    assert all(isinstance(layer.mlp, SparseMoE) for layer in ir.layers)
    ref = AutoModelForCausalLM.from_pretrained(mixtral, dtype=torch.float32).eval()
    ids = torch.randint(0, BASE["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(ids).logits
        torch.testing.assert_close(ir(ids)[0], want, atol=1e-4 * want.abs().max(), rtol=0)
        # Every expert is chosen by some token: the test covers the whole routing.
        x = ir.layers[0].mlp_norm(ir.embed_tokens(ids)).reshape(-1, BASE["hidden_size"])
        assert ir.layers[0].mlp.route(x)[1].unique().numel() == 4


class _Starved(nn.Linear):
    """The router `router` (its weight, saved as its own) never choosing expert `starved`:
    that logit is -inf."""

    def __init__(self, router: nn.Linear, starved: int) -> None:
        super().__init__(router.in_features, router.out_features, bias=False)
        self.weight, self.starved = router.weight, starved

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        logits[..., self.starved] = float("-inf")
        return logits


def test_an_expert_without_calibration_tokens_gets_sane_weights(mixtral, tmp_path):
    """GPTQ W4 on a model whose layer 0 never routes a token to expert 3: that expert is
    calibrated on every token (the `all_tokens` rule, recorded), the others on theirs; its
    quantized weights are finite and as close to the float ones as rounding to nearest."""
    model = load_model(mixtral)
    model.layers[0].mlp.router = _Starved(model.layers[0].mlp.router, 3)
    starved = model.layers[0].mlp.experts[3]
    floats = {n: m.weight.detach().clone() for n, m in starved.named_children()}
    tokens = np.random.default_rng(0).integers(2, BASE["vocab_size"], size=(8, 32))
    calibration = CalibrationSet(tokens.astype(np.int64), list(range(8)), "sha256:test")
    entry = quantize_entry({**W4, "method": "gptq"})
    (tmp_path / "ir").mkdir()
    [summary] = quantize_layers(
        ModelLayers(model), [entry], tmp_path / "ir", tmp_path / "work", calibration
    )
    least = min_routed_tokens(model.cfg)
    assert summary["experts"]["layers.0.mlp.experts.3"] == {
        "routed_tokens": 0,
        "statistics": ALL_TOKENS,
    }
    for record in summary["experts"].values():
        assert record["statistics"] == (ROUTED if record["routed_tokens"] >= least else ALL_TOKENS)
    assert len(summary["experts"]) == 8  # every expert of both layers
    layer = IRLayers(tmp_path / "ir").layer(0)
    for name, weight in floats.items():
        quantized = layer.mlp.experts[3].get_submodule(name)
        got = quantized.dequantize()
        assert torch.isfinite(got).all()
        assert (got - weight).norm() < 1.5 * (_nearest(weight) - weight).norm(), name


def _nearest(weight: torch.Tensor) -> torch.Tensor:
    """`weight` rounded to nearest (RTN) in the W4 scheme, dequantized."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    rtn = quantize_entry(W4)
    with torch.no_grad():
        return method_of(rtn).round(linear, rtn).dequantize()
