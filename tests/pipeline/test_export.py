"""ONNX export: the paged-KV graph matches the IR (float and quantized), bit-exact weights,
reproducible bytes, safe external data, and clear refusals."""

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from torch import nn

from ingot.pipeline.engines.onnxruntime.check import check_export
from ingot.pipeline.export import ExportError, export_onnx
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qlinear import QuantizedLinear
from ingot.pipeline.quantize.rtn import quantize_linear_rtn

from fixtures import make_checkpoint

ARCHS = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "mistral": ("mistral", {"sliding_window": 4096}),  # longer than any test sequence
    "qwen2": ("qwen2", {}),
}
# name -> (bits, group_size, symmetric); group sizes divide hidden 64 and ffn 128.
SCHEMES = {
    "float": None,
    "int4-g32-sym": (4, 32, True),
    "int4-g32-asym": (4, 32, False),
    "int8-perchannel-sym": (8, -1, True),
    "int4-g16-sym": (4, 16, True),
    "int4-g64-asym": (4, 64, False),
    "int4-perchannel-sym": (4, -1, True),
    "int8-g32-asym": (8, 32, False),
    "int3-g32-asym": (3, 32, False),  # any width the IR records: stored as UINT4
}


def rtn_quantize(model, bits: int, group_size: int, symmetric: bool, lm_head: bool = False):
    """Replace every decoder-layer linear (and optionally lm_head) by its RTN quantization."""
    for name, linear in list(model.named_modules()):
        if isinstance(linear, nn.Linear) and (name.startswith("layers.") or lm_head):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, quantize_linear_rtn(linear, bits, group_size, symmetric))
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {name: make_checkpoint(root / name, arch, **kw) for name, (arch, kw) in ARCHS.items()}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_export_matches_ir(checkpoints, tmp_path, arch, scheme):
    model = load_model(checkpoints[arch])
    if SCHEMES[scheme]:
        rtn_quantize(model, *SCHEMES[scheme])
    export_onnx(model, tmp_path, max_seq_len=64)
    report = check_export(model, tmp_path / "model.onnx")
    assert report["greedy_match"] and report["tokens_checked"] == 24 + 16
    assert report["max_rel_logit_diff"] <= report["rtol"]


def test_sliding_window_that_bites(tmp_path):
    # The window lives in the runtime's mask; the check's mask applies it like the IR does.
    model = load_model(make_checkpoint(tmp_path / "ckpt", "mistral", sliding_window=6))
    export_onnx(model, tmp_path / "out", max_seq_len=64)
    assert check_export(model, tmp_path / "out" / "model.onnx")["greedy_match"]


def test_quantized_lm_head_while_tied(checkpoints, tmp_path):
    model = rtn_quantize(load_model(checkpoints["llama-tied"]), 4, 32, True, lm_head=True)
    export_onnx(model, tmp_path, max_seq_len=64)
    check_export(model, tmp_path / "model.onnx")


def test_fp16_kv_cache(checkpoints, tmp_path):
    model = load_model(checkpoints["llama"])
    info = export_onnx(model, tmp_path, max_seq_len=64, kv_dtype="fp16", kv_block_size=8)
    pools = [i for i in info["inputs"] if i["name"].startswith(("k_pool", "v_pool"))]
    assert {p["dtype"] for p in pools} == {"float16"} and pools[0]["shape"][1] == 8
    # The check's reference rounds its K/V to fp16 as the pool does: the exact bound holds.
    report = check_export(model, tmp_path / "model.onnx")
    assert report["kv_dtype"] == "fp16" and report["greedy_match"]


def test_graph_is_valid_and_interface_exact(checkpoints, tmp_path):
    model = load_model(checkpoints["qwen2"])
    info = export_onnx(model, tmp_path, max_seq_len=64, kv_block_size=16)
    path = tmp_path / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)  # path form: reads external data
    onnx.shape_inference.infer_shapes_path(
        str(path), str(tmp_path / "inferred.onnx"), strict_mode=True
    )

    names = [i["name"] for i in info["inputs"]]
    assert names == [
        "input_ids", "positions", "k_pool_0", "v_pool_0", "k_pool_1", "v_pool_1",
        "block_tables", "context_lens", "attention_mask", "logits_indices", "kv_slots",
    ]  # fmt: skip
    outputs = [o["name"] for o in info["outputs"]]
    assert outputs == [
        "logits", "hidden", "k_pool_out_0", "v_pool_out_0", "k_pool_out_1", "v_pool_out_1",
    ]  # fmt: skip
    assert info["inputs"][2]["shape"] == ["NB", 16, 2, 16]
    assert info["inputs"][-3] == {
        "name": "attention_mask",
        "dtype": "bool",
        "shape": ["S", 1, "Q", "KV"],
    }
    assert info["inputs"][-2] == {"name": "logits_indices", "dtype": "int64", "shape": ["N"]}
    assert info["inputs"][-1] == {"name": "kv_slots", "dtype": "int64", "shape": ["S", "Q", 2]}
    shapes = {o["name"]: o["shape"] for o in info["outputs"]}
    assert shapes["logits"] == ["N", model.cfg.vocab_size]
    assert shapes["k_pool_out_0"] == ["NB", 16, 2, 16]  # the pool, the call's K/V written in
    assert {k: info[k] for k in ("path", "opset", "num_layers", "kv_block_size", "kv_dtype")} == {
        "path": "model.onnx",
        "opset": 23,
        "num_layers": 2,
        "kv_block_size": 16,
        "kv_dtype": "fp32",
    }
    assert (info["num_kv_heads"], info["head_dim"]) == (2, 16)

    graph = onnx.load(str(path), load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    assert {"Attention", "RMSNormalization", "RotaryEmbedding"} <= ops
    for node in graph.node:
        if node.op_type == "Attention":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            assert "is_causal" not in attrs and len(node.input) == 4
            assert attrs["scale"] == pytest.approx(1 / math.sqrt(16))
            # 3-D [S, T, H*D] inputs: the heads are attributes, no layer transposes.
            assert (attrs["q_num_heads"], attrs["kv_num_heads"]) == (4, 2)
    assert "Transpose" not in ops
    assert "Concat" not in ops  # the graph writes its K/V into the pool, then gathers them


def test_external_data_is_relative_and_complete(checkpoints, tmp_path):
    model = rtn_quantize(load_model(checkpoints["llama"]), 4, 32, False)
    export_onnx(model, tmp_path, max_seq_len=64)
    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    assert graph.initializer
    for tensor in graph.initializer:
        assert tensor.data_location == TensorProto.EXTERNAL, tensor.name
        location = {e.key: e.value for e in tensor.external_data}["location"]
        assert location == "model.onnx.data"
        assert not Path(location).is_absolute() and ".." not in Path(location).parts
    assert (tmp_path / "model.onnx").stat().st_size < 64 * 1024


def test_exports_are_byte_identical(checkpoints, tmp_path):
    model = rtn_quantize(load_model(checkpoints["llama-tied"]), 4, 32, True)
    for out in ("a", "b"):
        export_onnx(model, tmp_path / out, max_seq_len=64)
    for name in ("model.onnx", "model.onnx.data"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize(
    "bits,group_size,symmetric",
    [
        (4, 32, True),
        (4, 32, False),
        (8, -1, True),
        (4, -1, False),
        (8, 16, False),
        (2, -1, True),
        (3, 32, False),
        (6, 16, True),
    ],
)
def test_dequantize_linear_is_bitwise_the_ir_dequantize(
    checkpoints, tmp_path, bits, group_size, symmetric
):
    model = rtn_quantize(load_model(checkpoints["llama"]), bits, group_size, symmetric)
    export_onnx(model, tmp_path, max_seq_len=64)
    proto = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    inits = {t.name: t for t in proto.graph.initializer}
    checked = 0
    for node in proto.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        module_name = node.name.split("/")[0]  # "layers.0.attn.qkv_proj/DequantizeLinear"
        members = [model.get_submodule(m) for m in _fused_members(module_name)]
        assert all(isinstance(m, QuantizedLinear) for m in members)
        tensors = [numpy_helper.to_array(inits[i], base_dir=str(tmp_path)) for i in node.input]
        weight_type = inits[node.input[0]].data_type
        expected_type = {
            (4, True): TensorProto.INT4,
            (4, False): TensorProto.UINT4,
            (8, True): TensorProto.INT8,
            (8, False): TensorProto.UINT8,
        }[(4 if bits <= 4 else 8, symmetric)]  # the narrowest type holding the IR's bits
        assert weight_type == expected_type
        (dq_out,) = ReferenceEvaluator(_single_dq(node, proto.graph.initializer)).run(
            None, dict(zip(node.input, tensors, strict=True))
        )
        # Linears that share an input are one weight, stacked along N.
        want = torch.cat([m.dequantize() for m in members]).T.contiguous().numpy()  # [K, N]
        assert dq_out.dtype == np.float32
        assert np.array_equal(dq_out.view(np.uint32), want.view(np.uint32))
        checked += 1
    assert checked == 8  # qkv, o, gate_up, down x 2 layers


def _fused_members(name: str) -> list[str]:
    """The IR linears behind an exported weight: layers.0.attn.qkv_proj -> q, k, v_proj."""
    fused = {"attn.qkv_proj": ["attn.q_proj", "attn.k_proj", "attn.v_proj"]}
    fused["mlp.gate_up_proj"] = ["mlp.gate_proj", "mlp.up_proj"]
    for suffix, members in fused.items():
        if name.endswith(suffix):
            return [name.removesuffix(suffix) + m for m in members]
    return [name]


def _single_dq(node, initializers) -> onnx.ModelProto:
    types = {t.name: t.data_type for t in initializers}
    inputs = [helper.make_tensor_value_info(n, types[n], None) for n in node.input]
    out = helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "dq", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_check_export_catches_a_mismatch(checkpoints, tmp_path):
    export_onnx(load_model(checkpoints["llama"]), tmp_path, max_seq_len=64)
    other = load_model(checkpoints["llama"])
    with torch.no_grad():
        other.layers[1].mlp.down_proj.weight.mul_(1.5)
    with pytest.raises(ExportError, match="disagrees with the IR"):
        check_export(other, tmp_path / "model.onnx")


def test_refuses_dynamic_rope(tmp_path):
    rope = {"rope_type": "dynamic", "factor": 2.0}
    model = load_model(make_checkpoint(tmp_path / "ckpt", "llama", rope_scaling=rope))
    with pytest.raises(ExportError, match="dynamic NTK RoPE.*paged KV cache"):
        export_onnx(model, tmp_path / "out", max_seq_len=64)


def test_refuses_g_idx(checkpoints, tmp_path):
    model = rtn_quantize(load_model(checkpoints["llama"]), 4, 32, True)
    q = model.layers[0].mlp.up_proj
    q.g_idx = torch.arange(q.in_features) // q.group_size
    with pytest.raises(ExportError, match=r"layers\.0\.mlp\.up_proj: g_idx is set \(act-order"):
        export_onnx(model, tmp_path, max_seq_len=64)


def test_refuses_max_seq_len_beyond_the_model(checkpoints, tmp_path):
    model = load_model(checkpoints["llama"])  # max_position_embeddings 256
    with pytest.raises(ExportError, match=r"max_seq_len: 512 must be in \[1, 256\]"):
        export_onnx(model, tmp_path, max_seq_len=512)


class _OnePartAtATime:
    """A LayerSource handing out fresh copies and asserting that no part it handed out earlier
    is still alive when the next is asked for (what lets a disk source cost one layer)."""

    def __init__(self, model) -> None:
        import copy
        import weakref

        self.model, self._copy, self._ref = model, copy.deepcopy, weakref.ref
        self.alive: list = []
        self.asked: list[str] = []

    @property
    def cfg(self):
        return self.model.cfg

    @property
    def lm_head_tied(self):
        return self.model.lm_head_tied

    def _give(self, what: str, part):
        import gc

        gc.collect()
        still = [name for name, ref in self.alive if ref() is not None]
        assert not still, f"{what} asked for while {still} still alive"
        self.asked.append(what)
        self.alive.append((what, self._ref(part)))
        return part

    def embedding(self):
        return self._give("embedding", self.model.embed_tokens.weight.detach().float().clone())

    def quantized_embedding(self):
        return None  # a float embedding

    def layer(self, i):
        return self._give(f"layer {i}", self._copy(self.model.layers[i]))

    def final_norm(self):
        return self._give("norm", self._copy(self.model.norm))

    def lm_head(self):
        return self._give("lm_head", self._copy(self.model.lm_head))


@pytest.mark.parametrize("tied", [False, True])
def test_export_holds_one_part_of_the_model_at_a_time(checkpoints, tmp_path, tied):
    model = rtn_quantize(load_model(checkpoints["llama-tied" if tied else "llama"]), 4, 32, True)
    source = _OnePartAtATime(model)
    info = export_onnx(source, tmp_path / "parts", max_seq_len=64)
    parts = ["embedding", "layer 0", "layer 1", "norm"] + ([] if tied else ["lm_head"])
    assert source.asked == parts
    # The same bytes as exporting the model itself.
    assert export_onnx(model, tmp_path / "model", max_seq_len=64) == info
    for name in ("model.onnx", "model.onnx.data"):
        a, b = (tmp_path / d / name for d in ("parts", "model"))
        assert a.read_bytes() == b.read_bytes()


def test_large_tensors_are_written_in_row_blocks(checkpoints, tmp_path, monkeypatch):
    # Blocks of a few rows: transposes and int4 packing written block by block are the same
    # bytes as written whole.
    from ingot.pipeline.export import graph

    for bits, group, sym in ((4, 32, False), (8, 32, True)):
        model = rtn_quantize(load_model(checkpoints["llama"]), bits, group, sym)
        out = tmp_path / f"int{bits}"
        export_onnx(model, out / "whole", max_seq_len=64)
        monkeypatch.setattr(graph, "_BLOCK_BYTES", 100)  # 2 rows of 64 bytes for int8 codes
        export_onnx(model, out / "blocks", max_seq_len=64)
        monkeypatch.undo()
        for name in ("model.onnx", "model.onnx.data"):
            a, b = (out / d / name for d in ("whole", "blocks"))
            assert a.read_bytes() == b.read_bytes()
