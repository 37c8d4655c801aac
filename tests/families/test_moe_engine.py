"""The mixture of experts on the run side: the exported standard-ONNX block (export/moe.py)
against the IR, ONNX Runtime's engine with the blocks fused into QMoE (engines/onnxruntime/
qmoe.py) checked exactly, the blocks QMoE cannot take left standard, the OpenVINO target
refusing a mixture of experts with one line, and the built engine's greedy tokens against
transformers' (the family harness) for Mixtral and Qwen3-MoE."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import pytest
from test_mixtral import MIXTRAL
from test_qwen3_moe import FEATURES as QWEN3_MOE
from torch import nn

from ingot.pipeline.engines.onnxruntime import PLUGIN as ORT
from ingot.pipeline.engines.onnxruntime import OnnxRuntimeTarget
from ingot.pipeline.engines.openvino import PLUGIN as OPENVINO
from ingot.pipeline.engines.openvino import OpenVinoTarget
from ingot.pipeline.export.check import GraphCheck
from ingot.pipeline.export.decoder import export_onnx
from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qlinear import replace_module
from ingot.pipeline.preflight import check_recipe_against_model
from ingot.pipeline.quantize.rtn import quantize_linear_rtn
from ingot.pipeline.recipe import RecipeError, load_recipe

from fixtures import write_recipe
from harness import WINDOW, engine_and_reference, tiny_checkpoint

EXACT = OnnxRuntimeTarget(engine="onnxruntime", matmul_accuracy_level=0)
INT8_ACTIVATIONS = OnnxRuntimeTarget(engine="onnxruntime", matmul_accuracy_level=4)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("mixtral"), "mixtral", **MIXTRAL)


def _exported(ckpt: Path, out: Path, bits: int | None, symmetric: bool = True):
    """The IR (every layer linear but the router RTN-quantized to `bits`, None: float) and its
    exported graph."""
    model = load_model(ckpt)
    for name, module in list(model.named_modules()):
        quantizable = type(module) is nn.Linear and name.startswith("layers.")
        if bits is not None and quantizable and not name.endswith("router"):
            replace_module(model, name, quantize_linear_rtn(module, bits, 32, symmetric))
    export_onnx(model, out, max_seq_len=128, kv_block_size=8)
    return ModelLayers(model), out / "model.onnx"


def _ops(engine_dir: Path) -> Counter:
    graph = onnx.load(str(engine_dir / "model.onnx"), load_external_data=False).graph
    return Counter(node.op_type for node in graph.node)


def test_float_graph_equals_the_ir(mixtral, tmp_path):
    source, graph = _exported(mixtral, tmp_path / "float", bits=None)
    ops = Counter(node.op_type for node in onnx.load(str(graph)).graph.node)
    assert ops["ScatterND"] >= 2 and "QMoE" not in ops  # the standard block, per layer
    record = {"path": "model.onnx", "session_options": {}}  # the graph as exported
    GraphCheck(source)(ORT.open(graph, graph.parent, record))


@pytest.mark.parametrize("symmetric", [True, False])
def test_onnxruntime_runs_int4_experts_in_qmoe_exactly(mixtral, tmp_path, symmetric):
    source, graph = _exported(mixtral, tmp_path / "graph", bits=4, symmetric=symmetric)
    check = GraphCheck(source)
    record = ORT.build(graph, EXACT, tmp_path / "engine")
    ops = _ops(tmp_path / "engine")
    # One QMoE per sparse layer; the experts' own MatMulNBits and the routing are gone.
    assert ops["QMoE"] == 2 and "TopK" not in ops and "Slice" not in ops
    assert ops["MatMulNBits"] == 4  # q|k|v and o_proj of the two layers
    assert record["build"]["qmoe_blocks"] == 2 and not record["build"]["graph_initializers"]
    report = check(ORT.open(graph, tmp_path / "engine", record))
    assert report["max_rel_logit_diff"] < 1e-5
    assert ORT.describe(record, tmp_path / "engine").endswith("experts in QMoE")

    # At accuracy level 4 the exact variant (fused at level 0) is checked first, exactly.
    exact = ORT.exact(graph, INT8_ACTIVATIONS)
    assert check(exact.runner)["max_rel_logit_diff"] < 1e-5


def test_8bit_experts_stay_the_standard_block(mixtral, tmp_path):
    """CPU QMoE computes 8-bit experts with int8 activations at every level: not exact, so
    those blocks stay as exported (MatMulNBits per expert)."""
    source, graph = _exported(mixtral, tmp_path / "graph", bits=8)
    record = ORT.build(graph, EXACT, tmp_path / "engine")
    ops = _ops(tmp_path / "engine")
    assert "QMoE" not in ops and ops["MatMulNBits"] == 4 + 2 * 4 * 2  # + gate|up, down each
    assert "qmoe_blocks" not in record["build"]
    GraphCheck(source)(ORT.open(graph, tmp_path / "engine", record))


def test_openvino_refuses_a_mixture_of_experts(mixtral, tmp_path):
    cfg = ModelConfig.from_dir(mixtral)
    target = OpenVinoTarget(engine="openvino")
    line = (
        "targets.1: engine openvino does not run a mixture of experts (config.json: 4 experts "
        "in layers [0, 1]); use engine onnxruntime"
    )
    assert OPENVINO.model_problems(target, cfg, "targets.1") == [line]
    assert ORT.model_problems(EXACT, cfg, "targets.0") == []
    targets = [{"engine": "onnxruntime"}, {"engine": "openvino"}]
    kv_cache = {"dtype": "fp32", "block_size": 32}
    recipe = write_recipe(
        tmp_path / "r.yaml", mixtral, targets=targets, kv_cache=kv_cache, quantize=[]
    )
    with pytest.raises(RecipeError, match="engine openvino does not run a mixture of experts"):
        check_recipe_against_model(load_recipe(recipe), cfg)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_engine_greedy_tokens_match_transformers(mixtral, tmp_path, family):
    """`ingot build` (RTN int4 g32; the exact onnxruntime target: QMoE at level 0) and the
    runtime's greedy tokens (paged KV, a prompt past the window) equal transformers' on the
    quantized IR's dequantized weights: Mixtral, and Qwen3-MoE with a dense layer among the
    sparse ones, weights not renormalised and a tied head."""
    ckpt = mixtral
    if family == "qwen3_moe":
        ckpt = tiny_checkpoint(tmp_path / "ckpt", family, **QWEN3_MOE)
    runs = engine_and_reference(ckpt, tmp_path / "work", engines=("onnxruntime",))
    engine_dir = tmp_path / "work" / "artifact" / "engines" / "onnxruntime-cpu"
    assert _ops(engine_dir)["QMoE"] == 2  # Qwen3-MoE: layers 0 and 2 (1 is dense)
    assert max(len(prompt) for prompt, _, _ in runs) > WINDOW
    for prompt, engines, reference in runs:
        assert engines["onnxruntime"] == reference, prompt
