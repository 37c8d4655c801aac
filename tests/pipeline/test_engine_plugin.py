"""A new engine is one package per side and one registration line each (design.md section 2):
the toy engine (tests/toy_engine: the exported graph copied, run unoptimized), registered as
those two lines would register it, goes through the generic code: the recipe's targets, the
plan, the engine stage and its check, engine selection, the runtime's loader and the evaluate
stage's engine perplexity and label."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from ingot.artifacts import EngineInfo, read_manifest
from ingot.pipeline import plan
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.engines import ENGINE_BUILDERS
from ingot.pipeline.engines.onnxruntime import OnnxRuntimeTarget
from ingot.pipeline.evaluate.engine import engine_perplexity
from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.recipe.targets import _target_union
from ingot.pipeline.stages.engine import EngineOutput, run_engine
from ingot.runtime.engine_select import HostInfo, select_engine
from ingot.runtime.engines import ENGINE_RUNTIMES
from ingot.runtime.engines.onnxruntime.session import EngineSession
from ingot.runtime.loader import EngineFiles, open_engine

from fixtures import make_checkpoint, write_recipe

DEMO = Path(__file__).parents[2] / "recipes" / "demo"


@pytest.fixture
def toy(monkeypatch):
    """The toy engine in both registries, as one line in each registry's built-ins adds it
    (`"toy": "<module>"`); gone again after the test."""
    for registry, module in (
        (ENGINE_BUILDERS, "toy_engine.build"),
        (ENGINE_RUNTIMES, "toy_engine.runtime"),
    ):
        registry.names()  # entry points read first: the toy comes after them
        monkeypatch.setitem(registry._modules, "toy", module)
        monkeypatch.setattr(registry, "_loaded", dict(registry._loaded))


def test_a_registered_engine_is_a_recipe_target_with_a_plan(toy):
    targets = TypeAdapter(list[_target_union()])
    toy_target, ort_target = targets.validate_python([{"engine": "toy"}, {"engine": "onnxruntime"}])
    assert type(toy_target) is ENGINE_BUILDERS.get("toy").target_model
    assert toy_target.device == "cpu" and isinstance(ort_target, OnnxRuntimeTarget)
    with pytest.raises(ValidationError, match="expected tags: 'onnxruntime', 'openvino', 'toy'"):
        targets.validate_python([{"engine": "tensorrt"}])
    with pytest.raises(ValidationError, match="optimization_level"):  # the toy's own model
        targets.validate_python([{"engine": "toy", "optimization_level": "all"}])

    config = json.loads((DEMO / "pydoc-tiny" / "config.json").read_text())
    shapes = plan._Shapes(ModelConfig.from_hf(config))
    stage, disk = plan._engine(shapes, toy_target, 10**9)
    assert (stage.stage, stage.seconds, disk) == ("engine:toy-cpu", 1.0, 10**9)
    assert stage.notes == "a copy of the graph"


def test_the_toy_engine_is_built_checked_selected_and_run(toy, tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt", "llama")
    exact = [{"engine": "onnxruntime", "matmul_accuracy_level": 0}]
    recipe = write_recipe(tmp_path / "r.yaml", checkpoint, targets=exact)
    cache = StageCache(tmp_path / "cache")
    result = build(recipe, tmp_path / "a", cache=cache)
    keys = {run.stage: run.key for run in result.stages}
    export_dir = cache.path("export", keys["export"])
    ir_dir = cache.path("quantize", keys["quantize"])

    # The engine stage, generic: the toy builds, the stage opens it and checks it exactly.
    out = tmp_path / "toy"
    out.mkdir()
    run_engine(export_dir, ir_dir, ENGINE_BUILDERS.get("toy").target_model(engine="toy"), out)
    check = EngineOutput(out, "").check()
    assert check["accuracy"] == "exact" and check["rtol"] == 2e-4 and check["greedy_match"]
    assert "exact_check" not in check
    record = EngineOutput(out, "").record()
    assert record["name"] == "toy-cpu" and sorted(p.name for p in out.iterdir()) == [
        "check.json",
        "engine.json",
        "model.onnx",
        "model.onnx.data",
    ]
    label = ENGINE_BUILDERS.get("toy").describe(record, out)
    assert label == "the exported graph, unoptimized"

    # The runtime: selected by its plug-in's problems, opened by the loader through it. The
    # manifest format takes any engine kind (artifacts/manifest.py `EngineInfo`): the toy's
    # record validates as it is.
    toy_info = EngineInfo.model_validate(record)
    manifest = read_manifest(result.artifact)
    candidates = SimpleNamespace(engines=[toy_info, *manifest.engines])
    engine, skipped = select_engine(candidates, HostInfo.detect(("onnxruntime",)))
    assert engine is toy_info and skipped == []
    toy_files = EngineFiles(manifest.graph, toy_info, out / "model.onnx")
    opened = open_engine(toy_files, 4)
    assert isinstance(opened.session, EngineSession) and opened.pool.num_blocks == 4
    del opened
    ort_info = manifest.engines[0]
    ort_files = EngineFiles(manifest.graph, ort_info, result.artifact / ort_info.path)
    windows = np.random.default_rng(0).integers(0, 320, (2, 24))
    # Both compute the exported graph's numbers (fp32 activations): the same perplexity.
    toy_ppl, ort_ppl = (engine_perplexity(f, windows) for f in (toy_files, ort_files))
    assert toy_ppl == pytest.approx(ort_ppl, rel=1e-5)
