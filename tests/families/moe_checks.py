"""Checks the mixture-of-experts families share (test_mixtral, test_qwen3_moe): the
calibration rule for an expert no token reaches, every method on experts, the interop files
in their consumers (transformers' fused experts, llama.cpp's stacked ones)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.interop import write_interop
from ingot.pipeline.interop.gguf import GGUF_FILE
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.layers import SparseMoE
from ingot.pipeline.model.llama import LlamaModel
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qlinear import QuantizedLinear
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.checkpoint import load_ir, save_ir
from ingot.pipeline.quantize.driver import quantize_in_place, quantize_layers
from ingot.pipeline.quantize.ir_layers import IRLayers
from ingot.pipeline.quantize.method import method_of
from ingot.pipeline.quantize.moe_calibration import ALL_TOKENS, ROUTED, min_routed_tokens
from ingot.pipeline.recipe.quantize import quantize_entry

W4 = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True, "ignore": ["lm_head"]}
# The calibrated methods on experts (GPTQ: `assert_starved_expert_is_sane`).
CALIBRATED = {
    "awq": {"method": "awq", "bits": 4, "group_size": 32, "symmetric": False},
    "smoothquant": {"method": "smoothquant"},
    "fp8-static": {"method": "fp8", "activations": "static"},
}


def calibration(vocab: int, seed: int = 0) -> CalibrationSet:
    """8 windows of 32 random tokens: 256 tokens, top-2 of 4 experts ~128 each."""
    tokens = np.random.default_rng(seed).integers(2, vocab, size=(8, 32)).astype(np.int64)
    return CalibrationSet(tokens, list(range(8)), "sha256:test")


def sparse(model: LlamaModel) -> list[int]:
    return [i for i, layer in enumerate(model.layers) if isinstance(layer.mlp, SparseMoE)]


class Starved(nn.Linear):
    """The router `router` (its weight, saved as its own) never choosing expert `starved`:
    that logit is -inf."""

    def __init__(self, router: nn.Linear, starved: int) -> None:
        super().__init__(router.in_features, router.out_features, bias=False)
        self.weight, self.starved = router.weight, starved

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        logits[..., self.starved] = float("-inf")
        return logits


def assert_starved_expert_is_sane(ckpt: Path, work: Path) -> None:
    """GPTQ W4 on the model whose first sparse layer never routes a token to expert 3: that
    expert is calibrated on every token (the `all_tokens` rule, recorded in the summary),
    the others by the rule; its quantized weights are finite and near the float ones."""
    model = load_model(ckpt)
    first = sparse(model)[0]
    moe = model.layers[first].mlp
    moe.router = Starved(moe.router, 3)
    floats = {n: m.weight.detach().clone() for n, m in moe.experts[3].named_children()}
    (work / "ir").mkdir(parents=True)
    [summary] = quantize_layers(
        ModelLayers(model),
        [quantize_entry({**W4, "method": "gptq"})],
        work / "ir",
        work / "layers",
        calibration(model.cfg.vocab_size),
    )
    starved = f"layers.{first}.mlp.experts.3"
    assert summary["experts"][starved] == {"routed_tokens": 0, "statistics": ALL_TOKENS}
    least = min_routed_tokens(model.cfg)
    for record in summary["experts"].values():
        assert record["statistics"] == (ROUTED if record["routed_tokens"] >= least else ALL_TOKENS)
    experts = [f"layers.{i}.mlp.experts.{e}" for i in sparse(model) for e in range(4)]
    assert sorted(summary["experts"]) == experts  # every expert of the sparse layers
    layer = IRLayers(work / "ir").layer(first)
    for name, weight in floats.items():
        got = layer.mlp.experts[3].get_submodule(name).dequantize()
        assert torch.isfinite(got).all()
        # GPTQ trades weight error for output error (~1.6x RTN's here); fitted to an empty
        # Hessian every channel is dead and zeroed (error 1.0 of the weight).
        assert (got - weight).norm() < 2.5 * (_nearest(weight) - weight).norm(), name


def _nearest(weight: torch.Tensor) -> torch.Tensor:
    """`weight` rounded to nearest (RTN) in the W4 scheme, dequantized."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    rtn = quantize_entry(W4)
    with torch.no_grad():
        return method_of(rtn).round(linear, rtn).dequantize()


def assert_method_quantizes_the_experts(ckpt: Path, spec: dict) -> None:
    """The method quantizes every expert's linears (but expert 0's, ignored by pattern) on
    its routed tokens, records each calibrated expert, and leaves the routers float."""
    model = load_model(ckpt)
    data = calibration(model.cfg.vocab_size, seed=1)
    entry = quantize_entry({**spec, "ignore": ["lm_head", r"re:.*\.experts\.0\..*"]})
    [summary] = quantize_in_place(model, [entry], data)
    for i in sparse(model):
        moe = model.layers[i].mlp
        assert type(moe.router) is nn.Linear
        assert all(type(m) is nn.Linear for m in moe.experts[0].children())
        for expert in moe.experts[1:]:
            assert all(isinstance(m, QuantizedLinear) for m in expert.children())
    experts = [f"layers.{i}.mlp.experts.{e}" for i in sparse(model) for e in range(1, 4)]
    assert sorted(summary["experts"]) == experts
    with torch.no_grad():
        assert torch.isfinite(model(torch.as_tensor(data.tokens[:2]))[0]).all()


def rtn_ir(ckpt: Path, out: Path) -> Path:
    """The IR of `ckpt`, every linear but lm_head RTN int4 g32 (the routers float)."""
    model = load_model(ckpt)
    quantize_model(model, [quantize_entry(W4)])
    out.mkdir(parents=True)
    save_ir(model, out)
    return out


def assert_transformers_loads_compressed_tensors(ckpt: Path, ir: Path, out: Path) -> None:
    """transformers reads the per-expert checkpoint into its fused experts: the IR's weights
    exactly; the logits differ only by the fp16 float tensors."""
    write_interop("compressed-tensors", ir, ckpt, out)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    model = load_ir(ir)
    ids = torch.tensor([[5, 9, 40, 7, 100, 3, 77, 12]])
    with torch.no_grad():
        logits = hf(ids).logits  # the first forward decompresses
        want = model(ids)[0]
    for i in sparse(model):
        fused = hf.model.layers[i].mlp.experts
        for e, expert in enumerate(model.layers[i].mlp.experts):
            gate_up = torch.cat([expert.gate_proj.dequantize(), expert.up_proj.dequantize()])
            assert torch.equal(fused.gate_up_proj[e], gate_up), (i, e)
            assert torch.equal(fused.down_proj[e], expert.down_proj.dequantize()), (i, e)
    torch.testing.assert_close(logits, want, atol=2e-2 * want.abs().max(), rtol=0)


def assert_llama_cpp_runs_the_gguf(ckpt: Path, work: Path, arch: str) -> None:
    """llama.cpp runs the GGUF (`arch` with stacked Q4_0 experts, F32 routers) with the IR's
    logits on the file's weights. llama.cpp rounds activations to 8 bits for its Q4_0
    products (test_interop_gguf's tolerance: 0.5 of the logits' deviation), which at a
    near-tie of the router picks another expert: the position's logits then move by a few
    deviations. So: 90% of positions within the tolerance, the argmax agreeing at 85%; a
    writer error (an expert's rows misplaced, the routing or its renormalisation wrong)
    moves every position."""
    ir = rtn_ir(ckpt, work / "ir")
    write_interop("gguf", ir, ckpt, work / "gguf")
    import gguf  # a build extra, as interop/gguf.py imports it

    reader = gguf.GGUFReader(work / "gguf" / GGUF_FILE)
    tensors = {t.name: t for t in reader.tensors}
    model = load_ir(ir)
    cfg = model.cfg
    down = tensors["blk.0.ffn_down_exps.weight"]
    assert down.tensor_type.name == "Q4_0"
    assert list(down.shape) == [cfg.expert_intermediate_size, cfg.hidden_size, cfg.num_experts]
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"
    assert reader.fields[f"{arch}.expert_used_count"].contents() == cfg.top_k
    with torch.no_grad():  # the file's weights: fp16 scales and float tensors
        for m in model.modules():
            if isinstance(m, QuantizedLinear):
                m.scales.copy_(m.scales.half().float())
            elif isinstance(m, nn.Linear | nn.Embedding):
                m.weight.copy_(m.weight.half().float())
    ids = torch.randint(2, cfg.vocab_size, (48,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want = model(ids[None])[0][0].numpy()
    llama_cpp = pytest.importorskip("llama_cpp")
    path = str(work / "gguf" / GGUF_FILE)
    llm = llama_cpp.Llama(model_path=path, n_ctx=64, logits_all=True, verbose=False)
    llm.eval(ids.tolist())
    got = np.array(llm.scores[: len(ids)], dtype=np.float32)  # [T, V]
    err = np.abs(got - want).max(-1) / want.std()  # [T]
    agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    assert (err < 0.5).mean() >= 0.9 and agree >= 0.85, (np.round(err, 2), agree)
