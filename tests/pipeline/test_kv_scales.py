"""A quantized KV cache in the IR: its rounding is ONNX QuantizeLinear's bit for bit, and the
per-head scales calibrated layer by layer are what a direct computation over the model's own
forward pass gives."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.model.kv_quant import KVScales, attach_kv_scales
from ingot.pipeline.model.kv_rounding import KV_QMAX, quantize_kv
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.rope import apply_rotary, cos_sin
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.kv_scales import calibrate_kv_scales
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint

INT4 = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True, "ignore": ["lm_head"]}
_ONNX_CODE = {"int8": TensorProto.INT8, "fp8": TensorProto.FLOAT8E4M3FN}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """An int4 IR (the scales are measured on the model the engine runs); qwen2: qkv biases."""
    ir = load_model(make_checkpoint(tmp_path_factory.mktemp("ckpt") / "qwen2", "qwen2"))
    quantize_model(ir, [quantize_entry(INT4)])
    return ir


@pytest.fixture(scope="module")
def windows():
    tokens = np.random.default_rng(0).integers(0, 320, (6, 40))  # [N, T]
    return CalibrationSet(tokens, list(range(6)), "sha256:test")


def _onnx_quantize(x: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    """ONNX Runtime's QuantizeLinear of x [n, C] with a per-channel scale [C] (zero point 0),
    the op the graph quantizes new K/V with; codes as raw bytes."""
    code = _ONNX_CODE[dtype]
    zero = helper.make_tensor("zero", code, [x.shape[1]], bytes(x.shape[1]), raw=True)
    node = helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], axis=-1)
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("q", code, list(x.shape))],
        [helper.make_tensor("scale", TensorProto.FLOAT, [x.shape[1]], scale), zero],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=11)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0].view(np.uint8)  # fp8 arrives as its bytes


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_rounding_is_quantize_linear_bit_for_bit(dtype):
    rng = np.random.default_rng(1)
    scale = rng.uniform(0.01, 0.5, 16).astype(np.float32)  # [C]
    qmax = KV_QMAX[dtype]
    x = (rng.normal(0, 1, (512, 16)) * scale * qmax / 3).astype(np.float32)
    x[0] = (np.arange(16) - 8 + 0.5) * scale  # exact halves: ties round to even
    x[1] = scale * qmax * 3  # saturates
    x[2] = -x[1]
    ours = quantize_kv(torch.from_numpy(x), torch.from_numpy(scale), dtype)
    assert ours.dtype == (torch.int8 if dtype == "int8" else torch.float8_e4m3fn)
    assert np.array_equal(ours.view(torch.uint8).numpy(), _onnx_quantize(x, scale, dtype))
    assert float(ours[1].float().max()) == qmax  # saturated to the largest code, not NaN


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_scales_per_layer_and_head_match_a_direct_computation(model, windows, tmp_path, dtype):
    scales = calibrate_kv_scales(ModelLayers(model), windows, dtype, tmp_path)
    cfg = model.cfg
    assert scales.k.shape == scales.v.shape == (cfg.num_layers, cfg.num_kv_heads)
    assert bool((scales.k > 0).all() and (scales.v > 0).all())
    assert all(layer.attn.kv_quant is None for layer in model.layers)  # left as it was

    # Directly: the whole model's forward over the windows, each layer's K/V rounded with
    # these scales (as the engine runs it); each attention's input captured, its K (after RoPE)
    # and V projected here, max |.| per head over every token.
    inputs = {}
    hooks = [
        layer.attn.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a[0]))
        for i, layer in enumerate(model.layers)
    ]
    try:
        attach_kv_scales(model, scales)
        with torch.no_grad():
            model(torch.as_tensor(windows.tokens))
    finally:
        attach_kv_scales(model, None)
        for hook in hooks:
            hook.remove()
    n, t = windows.tokens.shape
    cos, sin = cos_sin(cfg, torch.arange(t)[None], seq_len=t)
    for i, layer in enumerate(model.layers):
        x, attn = inputs[i], layer.attn
        with torch.no_grad():
            k = attn.k_proj(x).view(n, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(n, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
            k = apply_rotary(k, cos, sin)
        amax_k, amax_v = k.abs().amax(dim=(0, 2, 3)), v.abs().amax(dim=(0, 2, 3))  # [Hkv]
        torch.testing.assert_close(scales.k[i], amax_k / KV_QMAX[dtype], rtol=1e-5, atol=0)
        torch.testing.assert_close(scales.v[i], amax_v / KV_QMAX[dtype], rtol=1e-5, atol=0)


def test_later_layers_see_the_earlier_layers_rounding(model, windows, tmp_path):
    # Layer 0 is measured on embeddings alone; layer 1 on what layer 0 computes with its K/V
    # rounded: coarse int8 rounding moves layer 1's scales, fp8 and int8 differ there.
    int8 = calibrate_kv_scales(ModelLayers(model), windows, "int8", tmp_path)
    fp8 = calibrate_kv_scales(ModelLayers(model), windows, "fp8", tmp_path)
    torch.testing.assert_close(int8.k[0] * 127, fp8.k[0] * 448)  # the same amax
    assert not torch.allclose(int8.k[1] * 127, fp8.k[1] * 448, rtol=1e-7, atol=0)


def test_spilled_activations_give_the_same_scales(model, windows, tmp_path):
    in_memory = calibrate_kv_scales(ModelLayers(model), windows, "int8", tmp_path / "a")
    (tmp_path / "b").mkdir()
    on_disk = calibrate_kv_scales(
        ModelLayers(model), windows, "int8", tmp_path / "b", budget_bytes=0
    )
    assert torch.equal(in_memory.k, on_disk.k) and torch.equal(in_memory.v, on_disk.v)
    assert list((tmp_path / "b").iterdir()) == []  # spill files removed


def test_scales_round_trip_and_refuse_nonsense():
    scales = KVScales("fp8", torch.tensor([[0.5, 0.25]]), torch.tensor([[1.0, 0.125]]))
    again = KVScales.from_json("fp8", scales.to_json())
    assert torch.equal(again.k, scales.k) and torch.equal(again.v, scales.v)
    with pytest.raises(ValueError, match="finite and > 0"):
        KVScales("int8", torch.tensor([[0.0]]), torch.tensor([[1.0]]))
    with pytest.raises(ValueError, match="'fp16' is not a quantized KV dtype"):
        KVScales("fp16", torch.tensor([[1.0]]), torch.tensor([[1.0]]))
