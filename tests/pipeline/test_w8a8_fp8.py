"""SmoothQuant W8A8 and FP8: smoothing leaves the float model unchanged and lowers the int8
error where activations have outlier channels; the IR's quantized inputs are what the formula
says; every scheme exports to a graph the IR check passes exactly, that ONNX Runtime runs with
the intended kernels; the IR round-trips through its checkpoint; recipes are validated."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.engines import ENGINE_BUILDERS
from ingot.pipeline.engines.onnxruntime import build_onnxruntime_engine
from ingot.pipeline.engines.onnxruntime.check import check_export
from ingot.pipeline.export import ExportError, export_onnx
from ingot.pipeline.export.check import QUANTIZED_INPUTS_RTOL, RTOL
from ingot.pipeline.model.architecture import scaling_groups
from ingot.pipeline.model.input_quant import InputQuant
from ingot.pipeline.model.layers import RMSNorm
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qlinear import QuantizedLinear
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.awq import apply_scales
from ingot.pipeline.quantize.checkpoint import load_ir, save_ir
from ingot.pipeline.quantize.rtn import quantize_linear_rtn
from ingot.pipeline.quantize.smoothquant import smoothing_scales
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint

SCHEMES = {
    "w8a8-dynamic-gptq": {"method": "smoothquant"},
    "w8a8-static-rtn": {"method": "smoothquant", "weights": "rtn", "activations": "static"},
    "w8a8-no-smoothing": {"method": "smoothquant", "alpha": None},
    "fp8-dynamic": {"method": "fp8"},
    "fp8-static-tensor": {"method": "fp8", "weights": "tensor", "activations": "static"},
    "fp8-weight-only": {"method": "fp8", "activations": "none", "ignore": []},
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "m", "llama")


@pytest.fixture(scope="module")
def calibration():
    tokens = np.random.default_rng(0).integers(2, 320, size=(8, 32)).astype(np.int64)
    return CalibrationSet(tokens, list(range(8)), "sha256:x")


def test_smoothing_leaves_the_float_model_unchanged(checkpoint):
    model, reference = load_model(checkpoint), load_model(checkpoint)
    g = torch.Generator().manual_seed(0)
    smoothed = 0
    for layer in model.layers:
        for prev, group in scaling_groups(model.cfg):
            norm = layer.get_submodule(prev)
            if not isinstance(norm, RMSNorm):  # SmoothQuant folds into the norms only
                continue
            linears = [layer.get_submodule(n) for n in group]
            act_max = torch.rand(norm.weight.shape[0], generator=g) * 20 + 0.1
            s = smoothing_scales(act_max, [m.weight.data for m in linears], 0.5)
            with torch.no_grad():
                apply_scales(norm, linears, s)
            smoothed += 1
    assert smoothed == 2 * len(model.layers)
    assert not torch.equal(model.layers[0].attn_norm.weight, reference.layers[0].attn_norm.weight)
    ids = torch.randint(0, 320, (2, 24), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[0], reference(ids)[0], rtol=0, atol=1e-5)


def test_smoothing_scales_follow_the_formula():
    act = torch.tensor([4.0, 1.0, 0.0])
    w = torch.tensor([[2.0, 0.5, 1.0], [-1.0, 0.25, 0.0]])
    s = smoothing_scales(act, [w], 0.5)
    # s_j = max|X_j|^0.5 / max|W_j|^0.5; a channel never active keeps the floor, not 0.
    torch.testing.assert_close(s[:2], torch.tensor([(4 / 2) ** 0.5, (1 / 0.5) ** 0.5]))
    assert s[2] > 0


def test_smoothing_lowers_the_w8a8_error_with_outlier_channels():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=g)
    x[:, ::16] *= 50  # a few activation channels 50x larger, as in LLMs
    linear = nn.Linear(64, 32, bias=False)
    nn.init.normal_(linear.weight, std=0.05, generator=g)
    reference = linear(x).detach()

    def w8a8_error(s: torch.Tensor) -> float:
        scaled = nn.Linear(64, 32, bias=False)
        scaled.weight = nn.Parameter(linear.weight.detach() * s, requires_grad=False)
        q = quantize_linear_rtn(scaled, 8, -1, True)
        q.set_input_quant(InputQuant("int8"))
        with torch.no_grad():
            return float((q(x / s) - reference).pow(2).mean())

    plain = w8a8_error(torch.ones(64))
    smooth = w8a8_error(smoothing_scales(x.abs().amax(0), [linear.weight.detach()], 0.5))
    assert smooth < plain / 4


def test_int8_dynamic_inputs_are_rounded_per_token_and_multiplied_exactly():
    g = torch.Generator().manual_seed(1)
    q = quantize_linear_rtn(nn.Linear(48, 8), 8, -1, True)
    q.set_input_quant(InputQuant("int8"))
    x = torch.randn(3, 5, 48, generator=g)
    s = x.abs().amax(-1, keepdim=True) / 127  # [3, 5, 1]
    codes = torch.round(x / s)
    assert codes.abs().max() <= 127
    acc = (codes.double() @ q.codes.double().T).float()  # exact integer sums
    want = acc * s * q.scales[:, 0] + q.bias
    with torch.no_grad():
        assert torch.equal(q(x), want)


def test_fp8_codes_and_a_static_scale_saturate():
    q = QuantizedLinear(
        torch.tensor([[448.0, -2.0]]).to(torch.float8_e4m3fn), torch.ones(1, 1), None, 8, 2
    )
    q.set_input_quant(InputQuant("fp8", static=True, scale=0.5))
    with torch.no_grad():
        # x / s = [1000, 1] saturates at 448: y = 448 * 0.5 * 448 - 2 * 0.5
        assert q(torch.tensor([[500.0, 0.5]])).item() == 448 * 0.5 * 448 - 1.0


def test_weight_and_input_schemes_must_agree():
    for bits, group_size in ((4, -1), (8, 32)):  # int8 inputs: 8-bit per-channel weights
        weights = quantize_linear_rtn(nn.Linear(64, 8), bits, group_size, True)
        with pytest.raises(ValueError, match="int8 inputs need symmetric per-channel 8-bit"):
            weights.set_input_quant(InputQuant("int8"))
    with pytest.raises(ValueError, match="fp8 inputs need"):
        quantize_linear_rtn(nn.Linear(64, 8), 8, -1, True).set_input_quant(InputQuant("fp8"))
    with pytest.raises(ValueError, match="static"):
        InputQuant("int8", scale=0.1)  # a scale belongs to a static scheme


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_scheme_exports_a_graph_the_ir_check_passes_exactly(
    tmp_path, checkpoint, calibration, scheme
):
    model = load_model(checkpoint)
    [summary] = quantize_model(model, [quantize_entry(SCHEMES[scheme])], calibration)
    quantized = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert len(quantized) == summary["modules"] > 0
    export_onnx(model, tmp_path, max_seq_len=64, kv_block_size=8)
    report = check_export(model, tmp_path / "model.onnx")
    assert report["max_rel_logit_diff"] < 1e-5  # the same roundings, operator for operator
    quantizes_inputs = SCHEMES[scheme].get("activations") != "none"
    dtype = "int8" if SCHEMES[scheme]["method"] == "smoothquant" else "fp8"
    assert report["quantized_inputs"] == ([dtype] if quantizes_inputs else [])
    assert report["rtol"] == (QUANTIZED_INPUTS_RTOL[dtype] if quantizes_inputs else RTOL["exact"])

    # The checkpoint keeps codes, scales and input schemes: same logits after a round trip.
    save_ir(model, tmp_path)
    ids = torch.randint(0, 320, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(load_ir(tmp_path)(ids)[0], model(ids)[0])


def test_the_check_still_catches_a_wrong_w8a8_graph(tmp_path, checkpoint, calibration):
    model = load_model(checkpoint)
    quantize_model(model, [quantize_entry(SCHEMES["w8a8-dynamic-gptq"])], calibration)
    export_onnx(model, tmp_path, max_seq_len=64, kv_block_size=8)
    o_proj = model.layers[0].attn.o_proj
    with torch.no_grad():  # the IR now disagrees with the graph by one layer's output scale
        o_proj.scales.mul_(1.5)
    with pytest.raises(ExportError, match="disagrees with the IR"):
        check_export(model, tmp_path / "model.onnx")


# What the optimized engine runs for each scheme (ORT 1.32, level "all"): int8 inputs on
# integer GEMMs over int8 weights; FP8 on float MatMuls over weights dequantized at build time
# (ORT's CPU FP8 DequantizeLinear is scalar, 30x slower than the MatMul), the portable graph
# keeping the FP8 weights.
ENGINE_KERNELS = {
    "w8a8-dynamic-gptq": ("MatMulInteger", onnx.TensorProto.INT8),
    "w8a8-static-rtn": ("MatMulIntegerToFloat", onnx.TensorProto.INT8),
    "fp8-dynamic": ("MatMul", onnx.TensorProto.FLOAT),
}
ENGINE_LABELS = {
    "w8a8": "no MatMulNBits: integer MatMul, int8 weights and activations",
    "fp8": "no MatMulNBits: fp32 MatMul, FP8 weights dequantized to fp32 at build",
}


def _initializer_types(path) -> Counter:
    graph = onnx.load(path, load_external_data=False).graph
    return Counter(i.data_type for i in graph.initializer if len(i.dims) == 2)


@pytest.mark.parametrize("scheme", sorted(ENGINE_KERNELS))
def test_engine_runs_the_intended_kernels(tmp_path, checkpoint, calibration, scheme):
    model = load_model(checkpoint)
    quantize_model(model, [quantize_entry(SCHEMES[scheme])], calibration)
    export_onnx(model, tmp_path / "graph", max_seq_len=64, kv_block_size=8)
    record = build_onnxruntime_engine(
        tmp_path / "graph" / "model.onnx", tmp_path / "engine", optimization_level="all"
    )
    graph = onnx.load(tmp_path / "engine" / "model.onnx", load_external_data=False).graph
    ops = Counter(n.op_type for n in graph.node)
    kernel, weight_type = ENGINE_KERNELS[scheme]
    layers = len(model.layers)
    assert ops[kernel] >= 4 * layers  # qkv, o, gate_up, down in every layer
    weights = _initializer_types(tmp_path / "engine" / "model.onnx")
    assert weights[weight_type] >= 4 * layers
    label = ENGINE_BUILDERS.get("onnxruntime").describe(record, tmp_path / "engine")
    assert label == ENGINE_LABELS[scheme.split("-")[0]]  # eval/report.md's (lm_head float)
    if scheme.startswith("fp8"):
        assert record["build"]["fp8_weights_dequantized"] == 4 * layers
        assert ops["DequantizeLinear"] == ops["QuantizeLinear"] == 4 * layers  # inputs only
        portable = _initializer_types(tmp_path / "graph" / "model.onnx")
        assert portable[onnx.TensorProto.FLOAT8E4M3FN] == 4 * layers
    else:
        assert ops["MatMul"] <= 1 and "fp8_weights_dequantized" not in record["build"]
