"""An int8 / fp8 KV pool in the exported graph: its interface (8-bit pools and new K/V, the
scales as initializers and in the interface record), the export check against the IR rounding
its K/V the same way (passes; fails for an IR that does not round or a graph with other
scales), and ONNX Runtime's optimized engine still running the QuantizeLinear /
DequantizeLinear nodes."""

from __future__ import annotations

from collections import Counter

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.engines.onnxruntime import build_onnxruntime_engine
from ingot.pipeline.engines.onnxruntime.check import check_export
from ingot.pipeline.export import ExportError, export_onnx
from ingot.pipeline.model.kv_quant import KVScales, attach_kv_scales
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.kv_scales import calibrate_kv_scales
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint

INT4 = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True, "ignore": ["lm_head"]}
ARCHS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),  # q/k/v biases
    "mistral": ("mistral", {"sliding_window": 6}),  # a window that bites
}
POOL_TYPES = {"int8": ("int8", "int8"), "fp8": ("uint8", "float8e4m3fn")}  # pool, new K/V


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {name: make_checkpoint(root / name, arch, **kw) for name, (arch, kw) in ARCHS.items()}


def _calibrated(path, dtype: str, tmp_path, weights: str = "int4"):
    """The IR of ``path`` (int4 or float) and its KV scales on random windows."""
    model = load_model(path)
    if weights == "int4":
        quantize_model(model, [quantize_entry(INT4)])
    tokens = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (4, 32))
    windows = CalibrationSet(tokens, list(range(4)), "sha256:test")
    return model, calibrate_kv_scales(ModelLayers(model), windows, dtype, tmp_path)


@pytest.mark.parametrize("weights", ["float", "int4"])
@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_graph_matches_the_ir_rounding_its_kv(checkpoints, tmp_path, dtype, arch, weights):
    model, scales = _calibrated(checkpoints[arch], dtype, tmp_path, weights)
    export_onnx(model, tmp_path, max_seq_len=64, kv_dtype=dtype, kv_block_size=8, kv_scales=scales)
    report = check_export(attach_kv_scales(model, scales), tmp_path / "model.onnx")
    assert report["kv_dtype"] == dtype and report["greedy_match"]
    assert report["max_rel_logit_diff"] <= report["rtol"] == 2e-4  # the exact bound


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_interface_and_scales(checkpoints, tmp_path, dtype):
    model, scales = _calibrated(checkpoints["llama"], dtype, tmp_path)
    info = export_onnx(
        model, tmp_path, max_seq_len=64, kv_dtype=dtype, kv_block_size=8, kv_scales=scales
    )
    types = {t["name"]: t["dtype"] for t in info["inputs"] + info["outputs"]}
    pool, new = POOL_TYPES[dtype]
    assert types["k_pool_1"] == types["v_pool_0"] == pool
    if dtype == "int8":  # the graph writes its codes into the pool: its outputs are the pools
        assert types["k_pool_out_0"] == types["v_pool_out_1"] == pool == new
    else:  # fp8 codes cannot be scattered into a uint8 pool: the runtime stores them
        assert types["new_k_0"] == types["new_v_1"] == new
    assert info["kv_dtype"] == dtype and info["kv_scales"] == scales.to_json()
    assert np.array(info["kv_scales"]["k"]).shape == (2, 2)  # [layers, kv heads]
    graph = onnx.load(str(tmp_path / "model.onnx"))  # with its data
    inits = {t.name: numpy_helper.to_array(t) for t in graph.graph.initializer}
    d = model.cfg.head_dim
    # Per-head scales, one per channel of [.., Hkv*D]
    assert np.array_equal(inits["layers.1.attn.v_scale"], np.repeat(scales.v[1].numpy(), d))
    assert not inits["layers.0.attn.k_zero_point"].astype(np.float32).any()  # symmetric


def test_fp8_byte_table_is_every_e4m3fn_value(checkpoints, tmp_path):
    model, scales = _calibrated(checkpoints["llama"], "fp8", tmp_path)
    export_onnx(model, tmp_path, max_seq_len=64, kv_dtype="fp8", kv_block_size=8, kv_scales=scales)
    graph = onnx.load(str(tmp_path / "model.onnx"))
    table = next(
        numpy_helper.to_array(t) for t in graph.graph.initializer if t.name == "kv.fp8_values"
    )
    decoded = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    real = ~np.isnan(decoded)  # 0x7F and 0xFF: never written (QuantizeLinear saturates)
    assert np.array_equal(table[real], decoded[real]) and np.isnan(table[~real]).all()
    assert np.array_equal(
        table,
        np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32),
        equal_nan=True,
    )


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_check_fails_against_an_ir_that_does_not_round(checkpoints, tmp_path, dtype):
    model, scales = _calibrated(checkpoints["llama"], dtype, tmp_path)
    export_onnx(model, tmp_path, max_seq_len=64, kv_dtype=dtype, kv_block_size=8, kv_scales=scales)
    with pytest.raises(ExportError, match=f"KV pool is {dtype} but the IR's layer 0 rounds"):
        check_export(model, tmp_path / "model.onnx")


def test_check_fails_for_a_graph_with_other_scales(checkpoints, tmp_path):
    # The graph stores K/V with scales 1.5x the IR's: codes many steps apart, not ties.
    model, scales = _calibrated(checkpoints["llama"], "int8", tmp_path)
    wrong = KVScales("int8", scales.k * 1.5, scales.v * 1.5)
    export_onnx(model, tmp_path, max_seq_len=64, kv_dtype="int8", kv_block_size=8, kv_scales=wrong)
    with pytest.raises(ExportError, match="disagrees with the IR"):
        check_export(attach_kv_scales(model, scales), tmp_path / "model.onnx")


def test_refuses_missing_or_mismatched_scales(checkpoints, tmp_path):
    model, scales = _calibrated(checkpoints["llama"], "int8", tmp_path)
    with pytest.raises(ExportError, match="kv_cache.dtype: fp8 needs per-head K/V scales"):
        export_onnx(model, tmp_path, max_seq_len=64, kv_dtype="fp8")
    with pytest.raises(ExportError, match="kv_cache.dtype: fp8 with int8 scales"):
        export_onnx(model, tmp_path, max_seq_len=64, kv_dtype="fp8", kv_scales=scales)
    one_layer = KVScales("int8", scales.k[:1], scales.v[:1])
    with pytest.raises(ExportError, match=r"expected int8 scales \[layers, kv heads\] = \(2, 2\)"):
        export_onnx(model, tmp_path, max_seq_len=64, kv_dtype="int8", kv_scales=one_layer)


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_optimized_engine_keeps_the_quantize_and_dequantize_nodes(checkpoints, tmp_path, dtype):
    model, scales = _calibrated(checkpoints["llama"], dtype, tmp_path)
    export_onnx(model, tmp_path, max_seq_len=64, kv_dtype=dtype, kv_block_size=8, kv_scales=scales)
    engine = tmp_path / "engine"
    build_onnxruntime_engine(tmp_path / "model.onnx", engine, optimization_level="all")
    graph = onnx.load(str(engine / "model.onnx"), load_external_data=False).graph
    ops = Counter(n.op_type for n in graph.node)
    layers = model.cfg.num_layers
    # Per layer: K and V quantized (int8: the codes the graph writes into the pool; fp8: the
    # outputs the runtime stores) and dequantized for Attention (int8: every slot gathered
    # from the pool at once; fp8: the new values, the past by byte table).
    assert ops["QuantizeLinear"] == ops["DequantizeLinear"] == 2 * layers
    kinds = {o.name: o.type.tensor_type.elem_type for o in graph.output}
    if dtype == "int8":
        assert kinds["k_pool_out_0"] == kinds["v_pool_out_1"] == onnx.TensorProto.INT8
    else:
        assert kinds["new_k_0"] == kinds["new_v_1"] == onnx.TensorProto.FLOAT8E4M3FN
    attach_kv_scales(model, scales)
    report = check_export(model, engine / "model.onnx")  # ORT's kernels, the optimized graph
    assert report["greedy_match"] and report["max_rel_logit_diff"] <= 2e-4
