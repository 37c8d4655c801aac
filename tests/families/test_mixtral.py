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
from ingot.pipeline.interop import write_interop
from ingot.pipeline.interop.gguf import GGUF_FILE
from ingot.pipeline.model.architecture import linear_names, parameter_count
from ingot.pipeline.model.config import ConfigError, ModelConfig
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.layers import SparseMoE
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qlinear import QuantizedLinear
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.checkpoint import load_ir, save_ir
from ingot.pipeline.quantize.driver import quantize_layers
from ingot.pipeline.quantize.ir_layers import IRLayers
from ingot.pipeline.quantize.method import method_of
from ingot.pipeline.quantize.moe_calibration import ALL_TOKENS, ROUTED, min_routed_tokens
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import BASE, write_tokenizer

gguf = pytest.importorskip("gguf")

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


@pytest.fixture(scope="module")
def rtn_ir(mixtral, tmp_path_factory) -> Path:
    """The Mixtral IR, every linear but lm_head RTN int4 g32 (the routers float)."""
    model = load_model(mixtral)
    quantize_model(model, [quantize_entry(W4)])
    out = tmp_path_factory.mktemp("mixtral-ir")
    save_ir(model, out)
    return out


def test_compressed_tensors_loads_in_transformers(mixtral, rtn_ir, tmp_path):
    """transformers reads the per-expert checkpoint into its fused experts: the IR's weights
    exactly; the logits differ only by the fp16 float tensors."""
    write_interop("compressed-tensors", rtn_ir, mixtral, tmp_path / "ct")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ct", dtype=torch.float32).eval()
    ir = load_ir(rtn_ir)
    ids = torch.tensor([[5, 9, 40, 7, 100, 3, 77, 12]])
    with torch.no_grad():
        logits = hf(ids).logits  # the first forward decompresses
        want = ir(ids)[0]
    for i, layer in enumerate(ir.layers):
        fused = hf.model.layers[i].mlp.experts
        for e, expert in enumerate(layer.mlp.experts):
            gate_up = torch.cat([expert.gate_proj.dequantize(), expert.up_proj.dequantize()])
            assert torch.equal(fused.gate_up_proj[e], gate_up), (i, e)
            assert torch.equal(fused.down_proj[e], expert.down_proj.dequantize()), (i, e)
    torch.testing.assert_close(logits, want, atol=2e-2 * want.abs().max(), rtol=0)


def test_gguf_runs_in_llama_cpp(tmp_path):
    """llama.cpp runs the GGUF (`llama` with stacked Q4_0 experts) with the IR's logits on
    the file's weights, to the tolerance of its 8-bit activations (test_interop_gguf's)."""
    ckpt = moe_checkpoint(tmp_path / "ckpt", "mixtral", **{**MIXTRAL, "sliding_window": None})
    ir = tmp_path / "ir"
    model = load_model(ckpt)
    quantize_model(model, [quantize_entry(W4)])
    ir.mkdir()
    save_ir(model, ir)
    write_interop("gguf", ir, ckpt, tmp_path / "gguf")
    reader = gguf.GGUFReader(tmp_path / "gguf" / GGUF_FILE)
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["blk.0.ffn_gate_exps.weight"].tensor_type.name == "Q4_0"
    assert list(tensors["blk.0.ffn_down_exps.weight"].shape) == [96, 64, 4]  # K, N, E
    assert tensors["blk.1.ffn_gate_inp.weight"].tensor_type.name == "F32"
    assert reader.fields["llama.expert_used_count"].contents() == 2
    model = load_ir(ir)
    with torch.no_grad():  # the file's weights: fp16 scales and float tensors
        for m in model.modules():
            if isinstance(m, QuantizedLinear):
                m.scales.copy_(m.scales.half().float())
            elif isinstance(m, nn.Linear | nn.Embedding):
                m.weight.copy_(m.weight.half().float())
    ids = torch.randint(2, 320, (48,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.inference_mode():
        want = model(torch.tensor([ids]))[0][0].numpy()
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(
        model_path=str(tmp_path / "gguf" / GGUF_FILE), n_ctx=64, logits_all=True, verbose=False
    )
    llm.eval(ids)
    got = np.array(llm.scores[: len(ids)], dtype=np.float32)  # [T, V]
    err = float(np.abs(got - want).max() / want.std())
    agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    assert err < 0.5 and agree >= 0.85, (err, agree)
