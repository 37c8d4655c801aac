"""EngineSession over a hand-built graph with an 8-bit KV interface, as an int8 / fp8 engine
has it: int8 pools, or uint8 pools holding E4M3FN bytes; new K/V as int8 or FLOAT8E4M3FN,
which numpy cannot hold: the session binds uint8 buffers with ONNX's element type, so the
codes come back as the bytes the pool stores."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.runtime.batch import build_inputs
from ingot.runtime.engines.base import SessionError
from ingot.runtime.engines.onnxruntime.session import EngineSession
from ingot.runtime.kv_pool import KVPool, kv_numpy_dtype

onnx = pytest.importorskip("onnx")  # build-time dependency, used here only to write the graph
from onnx import TensorProto, helper  # noqa: E402

V, HKV, D, B = 8, 2, 4, 4
# kv dtype -> (pool input type, new K/V output type)
TYPES = {
    "int8": (TensorProto.INT8, TensorProto.INT8),
    "fp8": (TensorProto.UINT8, TensorProto.FLOAT8E4M3FN),
}


def write_graph(path, kv_dtype: str):
    """One layer. logits[n, :] = the sum of k_pool_0 as numbers (int8 codes, or fp8 bytes read
    as unsigned integers), so a test sees the pool read live; new_k = new_v = QuantizeLinear
    of the positions (scale 0.5: the codes of 2 * position) on every channel."""
    pool_type, new_type = TYPES[kv_dtype]
    t = TensorProto
    inputs = [
        helper.make_tensor_value_info("input_ids", t.INT64, ["S", "Q"]),
        helper.make_tensor_value_info("positions", t.INT64, ["S", "Q"]),
        helper.make_tensor_value_info("k_pool_0", pool_type, ["NB", B, HKV, D]),
        helper.make_tensor_value_info("v_pool_0", pool_type, ["NB", B, HKV, D]),
        helper.make_tensor_value_info("block_tables", t.INT64, ["S", "MB"]),
        helper.make_tensor_value_info("context_lens", t.INT64, ["S"]),
        helper.make_tensor_value_info("attention_mask", t.BOOL, ["S", 1, "Q", "K"]),
        helper.make_tensor_value_info("logits_indices", t.INT64, ["N"]),
    ]
    zero = bytes(HKV * D)
    nodes = [
        helper.make_node("Cast", ["k_pool_0"], ["pool_f"], to=t.FLOAT),
        helper.make_node("ReduceSum", ["pool_f"], ["pool_sum"], keepdims=0),
        helper.make_node("Cast", ["logits_indices"], ["rows_f"], to=t.FLOAT),
        helper.make_node("Unsqueeze", ["rows_f", "axis1"], ["rows_2d"]),
        helper.make_node("Mul", ["rows_2d", "zero_row"], ["zeros"]),
        helper.make_node("Add", ["zeros", "pool_sum"], ["logits"]),
        helper.make_node("Cast", ["positions"], ["pos_f"], to=t.FLOAT),
        helper.make_node("Unsqueeze", ["pos_f", "axis2"], ["pos_3d"]),
        helper.make_node("Expand", ["pos_3d", "kv_shape"], ["kv"]),
        helper.make_node("QuantizeLinear", ["kv", "scale", "zero"], ["new_k_0"], axis=-1),
        helper.make_node("QuantizeLinear", ["kv", "scale", "zero"], ["new_v_0"], axis=-1),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", t.FLOAT, ["N", V]),
        helper.make_tensor_value_info("new_k_0", new_type, ["S", "Q", HKV * D]),
        helper.make_tensor_value_info("new_v_0", new_type, ["S", "Q", HKV * D]),
    ]
    init = [
        helper.make_tensor("axis1", t.INT64, [1], [1]),
        helper.make_tensor("axis2", t.INT64, [1], [2]),
        helper.make_tensor("zero_row", t.FLOAT, [1, V], [0.0] * V),
        helper.make_tensor("kv_shape", t.INT64, [3], [1, 1, HKV * D]),
        helper.make_tensor("scale", t.FLOAT, [HKV * D], [0.5] * (HKV * D)),
        helper.make_tensor("zero", new_type, [HKV * D], zero, raw=True),
    ]
    graph = helper.make_graph(nodes, "fake", inputs, outputs, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=11)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_codes_come_back_and_the_pool_is_read_live(tmp_path, kv_dtype):
    dtype = kv_numpy_dtype(kv_dtype)
    pool = KVPool(1, num_blocks=4, block_size=B, num_kv_heads=HKV, head_dim=D, dtype=dtype)
    session = EngineSession(write_graph(tmp_path / "g.onnx", kv_dtype), pool)
    table = pool.new_block_table()
    slots = table.slots_for(3)
    batch = build_inputs([(table, [1, 2, 3], 0)])
    logits, [(new_k, new_v)] = session.run(batch)
    assert new_k.dtype == dtype and new_k.shape == (1, 3, HKV * D)
    # Positions 0, 1, 2 at scale 0.5: codes 0, 2, 4 (fp8: the E4M3FN bytes of 0.0, 2.0, 4.0)
    want = [0, 2, 4] if kv_dtype == "int8" else [0x00, 0x40, 0x48]
    np.testing.assert_array_equal(new_k[0, :, 0], want)
    assert float(logits[0, 0]) == 0.0  # a zero-filled pool

    batch.write_kv(pool, [(new_k, new_v)])  # the codes, copied byte for byte
    np.testing.assert_array_equal(pool.k[0].reshape(-1, HKV * D)[slots, 0], want)
    logits, _ = session.run(batch)
    assert float(logits[0, 0]) == HKV * D * sum(want)  # the bound pool, read in place


def test_a_pool_of_another_dtype_is_named(tmp_path):
    graph = write_graph(tmp_path / "g.onnx", "fp8")
    pool = KVPool(1, num_blocks=4, block_size=B, num_kv_heads=HKV, head_dim=D, dtype=np.int8)
    with pytest.raises(SessionError, match=r"tensor\(uint8\), the pool is tensor\(int8\)"):
        EngineSession(graph, pool)
