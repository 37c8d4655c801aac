"""The engine stage checks the engine it builds against the IR, on the engine as the runtime
loads it; at MatMulNBits accuracy level 4 it first checks the same graph at level 0 exactly.
The manifest records both checks."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ingot.artifacts import verify_artifact
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.engines.onnxruntime import (
    OnnxRuntimeTarget,
    OrtGraph,
    build_onnxruntime_engine,
    load_onnxruntime_engine,
)
from ingot.pipeline.engines.onnxruntime import builder as ort_builder
from ingot.pipeline.export import ExportError
from ingot.pipeline.export import check as check_module
from ingot.pipeline.export.check import GraphCheck, check_graph
from ingot.pipeline.quantize.ir_layers import IRLayers
from ingot.pipeline.stages import engine as engine_stage

from fixtures import write_recipe

# q|k|v stays float (the wrong graph below edits its weight); the MLP's int4 linears become
# MatMulNBits, so a level-4 engine really computes with int8 activations.
MLP_INT4 = [
    {"method": "rtn", "bits": 4, "group_size": 32, "targets": ["re:layers\\..*\\.mlp\\..*"]}
]


def _entry(cache: StageCache, result, stage: str) -> Path:
    run = next(s for s in result.stages if s.stage == stage)
    return cache.path(stage.split(":")[0], run.key)


def test_the_check_moves_to_the_engine_and_into_the_manifest(tmp_path, tiny_checkpoint):
    cache = StageCache(tmp_path / "cache")
    target = {"engine": "onnxruntime", "matmul_accuracy_level": 0}
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, targets=[target])
    result = build(recipe, tmp_path / "a", cache=cache)

    export_dir = _entry(cache, result, "export")
    engine_dir = _entry(cache, result, "engine:onnxruntime-cpu")
    assert sorted(p.name for p in export_dir.iterdir() if not p.name.startswith(".")) == [
        "graph.json",
        "model.onnx",
        "model.onnx.data",
    ]
    check = json.loads((engine_dir / "check.json").read_text())
    assert check["greedy_match"] and check["tokens_checked"] == 24 + 16
    assert check["accuracy"] == "exact"
    assert "exact_check" not in check  # the engine's own check is exact already

    manifest = verify_artifact(result.artifact)
    assert manifest.eval["export_check"] == check
    assert manifest.engines[0].build["check"] == check
    assert manifest.engines[0].build["optimization_level"] == "extended"
    # Bookkeeping stays out of the artifact.
    assert not list(result.artifact.rglob("check.json"))
    assert not list(result.artifact.rglob("engine.json"))


def test_level_4_is_checked_exactly_first_then_as_the_runtime_loads_it(
    tmp_path, tiny_checkpoint, monkeypatch
):
    import onnxruntime as ort

    seen, sessions, references = [], [], []
    real, real_reference = GraphCheck.__call__, check_module._reference

    def spy(self, runner, **kwargs):
        session = runner.session  # the ORT session the plug-in checks (OrtGraph)
        options = session.get_session_options()
        seen.append((self, str(session._model_path), options, kwargs))
        sessions.append(weakref.ref(session))
        return real(self, runner, **kwargs)

    def reference(*args, **kwargs):
        references.append(len(args))  # not the args: they hold the session's pool
        return real_reference(*args, **kwargs)

    def load(*args, **kwargs):
        gc.collect()
        assert all(ref() is None for ref in sessions)  # the exact check's session is gone
        return load_onnxruntime_engine(*args, **kwargs)

    monkeypatch.setattr(GraphCheck, "__call__", spy)
    monkeypatch.setattr(check_module, "_reference", reference)
    monkeypatch.setattr(ort_builder, "load_onnxruntime_engine", load)
    cache = StageCache(tmp_path / "cache")
    target = {"engine": "onnxruntime", "matmul_accuracy_level": 4}
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, targets=[target])
    result = build(recipe, tmp_path / "a", cache=cache)
    (exact_check, exact_file, exact_options, exact_kwargs), engine_call = seen
    # First the exported graph, optimized in memory at the target's level, fp32 activations.
    assert isinstance(exact_check.source, IRLayers) and exact_kwargs == {"accuracy": "exact"}
    assert Path(exact_file) == _entry(cache, result, "export") / "model.onnx"
    assert exact_options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    key = "session.qdq_matmulnbits_accuracy_level"
    assert exact_options.get_session_config_entry(key) == "0"
    assert not exact_options.optimized_model_filepath  # nothing written
    # Then the engine that ships, as the runtime opens it (no re-optimization).
    engine_check, engine_file, options, kwargs = engine_call
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # against the same IR reference, computed once (by the exact check)
    assert engine_check is exact_check and len(references) == 1
    assert Path(engine_file).name == "model.onnx" and "/stages/engine/.tmp-" in engine_file
    assert kwargs == {"accuracy": "int8_activations"}

    check = json.loads((_entry(cache, result, "engine:onnxruntime-cpu") / "check.json").read_text())
    assert check["accuracy"] == "int8_activations" and check["rtol"] == 0.5
    exact = check["exact_check"]
    assert exact["accuracy"] == "exact" and exact["rtol"] == 2e-4 and exact["greedy_match"]
    manifest = verify_artifact(result.artifact)
    assert manifest.engines[0].build["check"] == check == manifest.eval["export_check"]
    assert manifest.engines[0].build["matmul_accuracy_level"] == 4


def _swap_query_heads(src: Path, dst: Path, layer: int = 1, a: int = 1, b: int = 3) -> Path:
    """The export in ``src`` with query heads a and b of one layer trading places in the fused
    q|k|v weight (o_proj unchanged), saved with its weights inline in ``dst``."""
    proto = onnx.load(str(src / "model.onnx"))
    head_dim = 16  # the tiny checkpoint: hidden 64, 4 heads
    [init] = [
        t for t in proto.graph.initializer if t.name == f"layers.{layer}.attn.qkv_proj.weight_t"
    ]
    w = numpy_helper.to_array(init).copy()  # [K, (Hq + 2 Hkv) * D]
    ca, cb = slice(a * head_dim, (a + 1) * head_dim), slice(b * head_dim, (b + 1) * head_dim)
    w[:, ca], w[:, cb] = w[:, cb].copy(), w[:, ca].copy()
    init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(w), init.name))
    dst.mkdir()
    onnx.save(proto, str(dst / "model.onnx"))
    return dst


def test_swapped_heads_fail_the_exact_check_of_a_level_4_build(tmp_path, tiny_checkpoint):
    cache = StageCache(tmp_path / "cache")
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, quantize=MLP_INT4)
    result = build(recipe, tmp_path / "a", cache=cache)
    q_dir = _entry(cache, result, "quantize")
    bad = _swap_query_heads(_entry(cache, result, "export"), tmp_path / "bad")

    # The level-4 engine of the wrong graph passes the int8-activation tolerance (these heads:
    # ~36% of the logits' scale, 43% of hidden's, under 0.5): only gross errors exceed it.
    engine = tmp_path / "engine"
    record = build_onnxruntime_engine(
        bad / "model.onnx", engine, optimization_level="extended", matmul_accuracy_level=4
    )
    session = load_onnxruntime_engine(engine / "model.onnx", record["session_options"])
    graph = onnx.load(str(engine / "model.onnx"), load_external_data=False).graph
    assert "MatMulNBits" in {n.op_type for n in graph.node}
    runner = OrtGraph(session)
    assert check_graph(IRLayers(q_dir), runner, accuracy="int8_activations")["greedy_match"]
    del session, runner

    # The stage's exact check of the same graph at level 0 catches it; nothing is written.
    target = OnnxRuntimeTarget(engine="onnxruntime", matmul_accuracy_level=4)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ExportError, match="exact check.*disagrees with the IR"):
        engine_stage.run_engine(bad, q_dir, target, out)
    assert not list(out.iterdir())
