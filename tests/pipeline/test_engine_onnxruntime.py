"""The ONNX Runtime CPU engine: optimized once, loaded without re-optimizing, same logits."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from torch import nn

from ingot.pipeline.engines import ENGINE_BUILDERS
from ingot.pipeline.engines.onnxruntime import (
    build_onnxruntime_engine,
    host_cpu_isa,
    load_onnxruntime_engine,
)
from ingot.pipeline.export import export_onnx
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.rtn import quantize_linear_rtn

from fixtures import make_checkpoint

BLOCK = 8


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny llama with int4 g32 symmetric decoder linears, exported."""
    root = tmp_path_factory.mktemp("engine")
    model = load_model(make_checkpoint(root / "ckpt", "llama"))
    for name, linear in list(model.named_modules()):
        if isinstance(linear, nn.Linear) and name.startswith("layers."):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, quantize_linear_rtn(linear, 4, 32, True))
    export_onnx(model, root / "export", max_seq_len=64, kv_block_size=BLOCK)
    return root / "export" / "model.onnx"


def _feed(num_layers: int = 2, context: int = 5, q: int = 3) -> dict[str, np.ndarray]:
    """Two sequences, each with `context` tokens already in (scattered) pool blocks; the graph
    writes the call's `q` tokens into the same blocks and attends to all of them."""
    rng = np.random.default_rng(0)
    tables = np.array([[3, 0], [1, 4]], dtype=np.int64)  # [S, MB]: positions 0 .. 15
    positions = np.tile(context + np.arange(q), (2, 1))  # [S, Q]
    key = np.arange(tables.shape[1] * BLOCK)
    mask = key[None, None, None, :] <= positions[:, None, :, None]  # [S, 1, Q, MB*B]: causal
    kv_slots = np.stack([tables[[[0], [1]], positions // BLOCK], positions % BLOCK], axis=-1)
    feed = {
        "input_ids": rng.integers(0, 320, (2, q)),
        "positions": positions,
        "block_tables": tables,
        "context_lens": np.full(2, context, dtype=np.int64),
        "attention_mask": mask,
        "logits_indices": np.arange(2 * q, dtype=np.int64),  # every row
        "kv_slots": kv_slots,  # [S, Q, 2]: block, offset
    }
    for layer in range(num_layers):
        for kind in "kv":
            feed[f"{kind}_pool_{layer}"] = rng.normal(size=(6, BLOCK, 2, 16)).astype(np.float32)
    return feed


def _run(path, feed) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(["logits"], feed)[0]


def _op_counts(path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("level", ["basic", "extended", "all"])
def test_optimized_engine_matches_the_graph(exported, tmp_path, level):
    out = tmp_path / "engines" / "onnxruntime-cpu"
    record = build_onnxruntime_engine(exported, out, optimization_level=level)
    assert (out / "model.onnx").is_file() and (out / "model.onnx.data").is_file()
    feed = _feed()
    np.testing.assert_allclose(_run(out / "model.onnx", feed), _run(exported, feed), atol=1e-4)

    ops = _op_counts(out / "model.onnx")
    # 2 layers x (q|k|v, o, gate|up, down): linears sharing an input are one weight.
    if level == "basic":
        assert ops["DequantizeLinear"] == 8
    else:  # ORT fuses every int4 DequantizeLinear -> MatMul into MatMulNBits
        assert ops["MatMulNBits"] == 8 and "DequantizeLinear" not in ops

    assert record["name"] == "onnxruntime-cpu" and record["engine"] == "onnxruntime"
    assert record["device"] == "cpu"
    assert record["path"] == "engines/onnxruntime-cpu/model.onnx"
    major, minor = (int(p) for p in ort.__version__.split(".")[:2])
    assert record["requires"]["onnxruntime"] == f">={major}.{minor},<{major + 1}"
    assert record["requires"]["cpu_isa"] == (host_cpu_isa() if level == "all" else [])
    assert record["session_options"] == {
        "graph_optimization_level": "disable_all",
        "intra_op_num_threads": 0,
    }
    assert record["build"] == {
        "optimization_level": level,
        "matmul_accuracy_level": 0,
        "graph_initializers": True,
    }


def test_optimized_weights_are_external_and_relative(exported, tmp_path):
    build_onnxruntime_engine(exported, tmp_path, optimization_level="all")
    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    external = [t for t in graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert len(external) >= 8
    for tensor in external:
        assert {e.key: e.value for e in tensor.external_data}["location"] == "model.onnx.data"
    inline = sum(len(t.raw_data) for t in graph.initializer)
    assert inline < 16 * 1024  # only shape constants stay in the .onnx
    assert [i.name for i in graph.input][-4:] == [
        "context_lens",
        "attention_mask",
        "logits_indices",
        "kv_slots",
    ]


def test_engine_build_is_byte_deterministic(exported, tmp_path):
    for out in ("a", "b"):
        build_onnxruntime_engine(exported, tmp_path / out, optimization_level="all")
    for name in ("model.onnx", "model.onnx.data"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_int8_activations_are_opt_in(exported, tmp_path):
    # ORT's default accuracy level 4 quantizes activations: faster, but not the graph's numbers.
    record = build_onnxruntime_engine(
        exported, tmp_path, optimization_level="extended", matmul_accuracy_level=4
    )
    assert record["build"]["matmul_accuracy_level"] == 4
    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    levels = {
        a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute
        if a.name == "accuracy_level"
    }  # fmt: skip
    assert levels == {4}


def test_the_build_session_writes_what_a_prepacking_session_writes(exported, tmp_path):
    # The optimizing session skips prepacking (it never runs): the engine is the same bytes.
    build_onnxruntime_engine(exported, tmp_path / "built", optimization_level="all")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.optimized_model_filepath = str(tmp_path / "default" / "model.onnx")
    for key, value in (
        ("session.optimized_model_external_initializers_file_name", "model.onnx.data"),
        ("session.optimized_model_external_initializers_min_size_in_bytes", "1024"),
        ("session.qdq_matmulnbits_accuracy_level", "0"),
    ):
        options.add_session_config_entry(key, value)
    (tmp_path / "default").mkdir()
    ort.InferenceSession(str(exported), options, providers=["CPUExecutionProvider"])
    for name in ("model.onnx", "model.onnx.data"):
        built, default = (tmp_path / d / name for d in ("built", "default"))
        assert built.read_bytes() == default.read_bytes()


def test_loaded_engine_runs_the_int8_kernels(exported, tmp_path):
    # The checked session is the runtime's: with prepacked weights, level 4 computes int8
    # activations (not fp32, as MatMulNBits does without prepacking).
    feed, logits = _feed(), {}
    for level in (0, 4):
        out = tmp_path / str(level)
        record = build_onnxruntime_engine(
            exported, out, optimization_level="extended", matmul_accuracy_level=level
        )
        session = load_onnxruntime_engine(out / "model.onnx", record["session_options"])
        logits[level] = session.run(["logits"], feed)[0]
        label = f"MatMulNBits accuracy level {level}, {'int8' if level else 'fp32'} activations"
        assert ENGINE_BUILDERS.get("onnxruntime").describe(record, out) == label  # report.md's
    np.testing.assert_allclose(logits[4], logits[0], atol=0.2)
    assert np.abs(logits[4] - logits[0]).max() > 1e-4
    np.testing.assert_allclose(logits[0], _run(exported, feed), atol=1e-4)


def test_rejects_unknown_level(exported, tmp_path):
    with pytest.raises(ValueError, match="optimization_level: 'max'"):
        build_onnxruntime_engine(exported, tmp_path, optimization_level="max")


def test_host_cpu_isa_parsing():
    x86 = "processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni amx_tile\n"
    assert host_cpu_isa(x86) == [
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "avx512f",
        "avx512_vnni",
        "amx_tile",
    ]
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm sve\n"
    assert host_cpu_isa(arm) == ["asimd", "sve"]
    assert host_cpu_isa("") == []
