"""The OpenVINO engine's build half: its recipe checks, its record (no file of its own: the
portable graph is the engine's), its check against the IR through the runtime's session (fp32,
fp16 and int8 KV, int4 weights), a wrong engine failing the build, the plan's estimate."""

import json
from pathlib import Path

import numpy as np
import openvino.opset16 as ops
import pytest

from ingot.artifacts import read_manifest, verify_artifact
from ingot.pipeline import plan
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.engines import ENGINE_BUILDERS
from ingot.pipeline.engines.base import EngineSizing
from ingot.pipeline.engines.openvino import OpenVinoTarget
from ingot.pipeline.export.errors import ExportError
from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.recipe import RecipeError, load_recipe
from ingot.pipeline.stages.engine import EngineOutput, run_engine
from ingot.runtime.engines.openvino import weights as ov_weights

from fixtures import make_checkpoint, write_recipe

REPO = Path(__file__).resolve().parents[2]
OV = {"engine": "openvino"}
EXACT = {"engine": "openvino", "dynamic_quantization": False}  # f32, checked exactly
KV32 = {"dtype": "fp32", "block_size": 32}
CALIBRATION = {"dataset": str(REPO / "recipes/demo/pydoc-heldin.txt"), "samples": 2, "seq_len": 32}


def _problems(tmp_path: Path, **overrides) -> str:
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "ckpt", **overrides)
    with pytest.raises(RecipeError) as error:
        load_recipe(recipe)
    return str(error.value)


def test_the_recipe_must_fit_the_engine(tmp_path):
    # One line: every problem names its field, before any stage (load_recipe: build and plan).
    message = _problems(
        tmp_path,
        kv_cache={"dtype": "fp8", "block_size": 16},
        quantize=[{"method": "smoothquant", "targets": ["re:layers\\..*"], "ignore": []}],
        calibration=CALIBRATION,
        targets=[{"engine": "onnxruntime"}, OV],
    )
    assert len(message.splitlines()) == 1
    assert "kv_cache.block_size: 16, but targets.1 (openvino) needs 32" in message
    assert "kv_cache.dtype: fp8 cannot run on targets.1" in message
    assert "quantize.0.method: smoothquant cannot run on targets.1" in message
    fp8 = _problems(tmp_path, kv_cache=KV32, quantize=[{"method": "fp8"}], targets=[OV])
    assert "quantize.0.method: fp8 cannot run on targets.0: FP8 weights" in fp8
    kv16 = {"dtype": "fp16", "block_size": 32}
    bf16 = _problems(tmp_path, kv_cache=kv16, targets=[{**OV, "inference_precision": "bf16"}])
    assert "targets.0.inference_precision: bf16 keeps a float KV cache in bf16" in bf16
    assert "inference_precision" in _problems(
        tmp_path, kv_cache=KV32, targets=[{**OV, "inference_precision": "f16"}]
    )
    assert "num_threads" in _problems(tmp_path, kv_cache=KV32, targets=[{**OV, "num_threads": -1}])
    # A fitting recipe loads; asymmetric int4 has zero points, which the engine runs.
    asym = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": False}
    write_recipe(tmp_path / "ok.yaml", tmp_path, kv_cache=KV32, quantize=[asym], targets=[OV])
    assert load_recipe(tmp_path / "ok.yaml").targets == [OpenVinoTarget(engine="openvino")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama checkpoint and a stage cache its builds share."""
    tmp = tmp_path_factory.mktemp("openvino")
    return make_checkpoint(tmp / "ckpt", "llama"), StageCache(tmp / "cache")


@pytest.fixture(scope="module")
def fp32_build(tiny, tmp_path_factory):
    """RTN int4 g32, fp32 KV in blocks of 32, built for OpenVINO then ONNX Runtime."""
    tmp, (ckpt, cache) = tmp_path_factory.mktemp("fp32"), tiny
    targets = [OV, {"engine": "onnxruntime"}]
    recipe = write_recipe(tmp / "r.yaml", ckpt, kv_cache=KV32, targets=targets)
    result = build(recipe, tmp / "artifact", cache=cache)
    keys = {run.stage: run.key for run in result.stages}
    dirs = (cache.path("export", keys["export"]), cache.path("quantize", keys["quantize"]))
    return result.artifact, dirs


def test_the_engine_is_the_graph_checked_against_the_ir(fp32_build):
    artifact, _ = fp32_build
    manifest = json.loads((artifact / "manifest.json").read_text())
    engine = manifest["engines"][0]
    check = engine["build"].pop("check")
    # Loose (int8 dynamic quantization) after an exact check of the same model at f32.
    assert check["accuracy"] == "int8_activations" and check["greedy_match"]
    assert check["exact_check"]["accuracy"] == "exact"
    assert check["exact_check"]["max_rel_logit_diff"] < 2e-4
    assert engine == {
        "name": "openvino-cpu",
        "engine": "openvino",
        "device": "cpu",
        # the onnxruntime engine's graph: the artifact's one copy of the weights
        "path": "engines/onnxruntime-cpu/model.onnx",
        "requires": {"openvino": ">=2026.4,<2026.5"},
        "session_options": {
            "inference_precision": "f32",
            "kv_cache_precision": "f32",
            "dynamic_quantization_group_size": 32,
            "num_threads": 0,
        },
        "build": {
            "openvino": engine["build"]["openvino"],
            "weights": "the exported graph's initializers",
        },
        "reads": ["engine:onnxruntime-cpu"],  # the weights' one copy, which a pull fetches
    }
    files = {f["path"] for f in manifest["files"]}
    assert not any(f.startswith("engines/openvino-cpu") for f in files)
    assert not (artifact / "engines" / "openvino-cpu").exists()
    assert verify_artifact(artifact).engines[0].path == "engines/onnxruntime-cpu/model.onnx"
    assert not (artifact / "model.onnx").exists()  # no second copy
    label = ENGINE_BUILDERS.get("openvino").describe(engine, artifact)
    assert label == "f32 activations, int8 dynamic quantization (groups of 32), f32 KV"


def test_an_exact_target_is_checked_exactly(fp32_build, tmp_path):
    _, (export_dir, ir_dir) = fp32_build
    run_engine(export_dir, ir_dir, OpenVinoTarget(**EXACT), tmp_path)
    check = EngineOutput(tmp_path, "").check()
    assert check["accuracy"] == "exact" and check["rtol"] == 2e-4 and check["greedy_match"]
    assert "exact_check" not in check
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check.json", "engine.json"]


def test_the_check_sees_what_the_op_stored_where_it_stored_it(fp32_build):
    """The check's pools go into the session's head-major blocks and back: the slots a call
    writes change, in every head; other blocks keep the check's garbage, and so do the keys of
    the block's later rows (the op zeroes an f32 value block's later rows itself)."""
    _, (export_dir, _) = fp32_build
    graph = export_dir / "model.onnx"
    record = ENGINE_BUILDERS.get("openvino").build(graph, OpenVinoTarget(**EXACT), export_dir)
    runner = ENGINE_BUILDERS.get("openvino").open(graph, export_dir, record)
    (_, block, hkv, d), dtype = runner.inputs["k_pool_0"]
    rng = np.random.default_rng(0)
    positions = np.array([[0, 1, 2]])  # one sequence, three new tokens in its block 2
    feed = {
        "input_ids": np.array([[5, 6, 7]]),
        "positions": positions,
        "block_tables": np.array([[2]]),
        "context_lens": np.array([0]),
        "attention_mask": np.arange(block)[None, None, None, :] <= positions[..., None],
        "logits_indices": np.arange(3),
        "kv_slots": np.stack([np.full((1, 3), 2), positions], axis=-1),
    }
    pools = {f"{kind}_pool_{i}": None for i in range(2) for kind in "kv"}
    for name in pools:
        pools[name] = rng.normal(size=(4, block, hkv, d)).astype(dtype)
    out = runner.run(feed | pools)
    assert out["logits"].shape[0] == 3 and np.isfinite(out["logits"]).all()
    for name, before in pools.items():
        changed = (out[name.replace("_pool_", "_pool_out_")] != before).any(axis=3)  # [NB, B, Hkv]
        assert changed[2, :3].all() and not changed[[0, 1, 3]].any()
        if name.startswith("k"):
            assert not changed[2, 3:].any()


def test_a_wrong_engine_fails_the_build(fp32_build, tmp_path, monkeypatch):
    """One linear's weights 1% off in the model the runtime builds: the build raises, naming
    the engine (its exact check catches what the loose one could not)."""
    _, (export_dir, ir_dir) = fp32_build
    linear = ov_weights.GraphWeights.linear

    def off(self, x, name):
        y = linear(self, x, name)
        if name != "layers.1.attn.o_proj":
            return y
        return ops.multiply(y, ops.constant(np.float32(1.01))).output(0)

    monkeypatch.setattr(ov_weights.GraphWeights, "linear", off)
    with pytest.raises(ExportError, match="engine openvino-cpu: the exact check .* failed"):
        run_engine(export_dir, ir_dir, OpenVinoTarget(**OV), tmp_path / "a")
    with pytest.raises(ExportError, match="engine openvino-cpu: exported graph disagrees"):
        run_engine(export_dir, ir_dir, OpenVinoTarget(**EXACT), tmp_path / "b")


@pytest.mark.parametrize(
    ("kv_dtype", "target", "accuracy"),
    [
        ("fp16", OV, "int8_activations"),
        ("int8", {**OV, "inference_precision": "bf16"}, "int8_activations"),
        ("int8", EXACT, "int8_activations"),  # u8: the engine's own form, checked loosely
    ],
)
def test_16_and_8_bit_caches_are_checked(tiny, tmp_path, kv_dtype, target, accuracy):
    ckpt, cache = tiny
    kv_cache = {"dtype": kv_dtype, "block_size": 32}
    recipe = write_recipe(
        tmp_path / "r.yaml", ckpt, kv_cache=kv_cache, calibration=CALIBRATION, targets=[target]
    )
    engine = read_manifest(build(recipe, tmp_path / "artifact", cache=cache).artifact).engines[0]
    check = engine.build["check"]
    assert check["accuracy"] == accuracy and check["greedy_match"]
    # The exact variant: f32, no dynamic quantization; for int8 an f32 cache, the IR unrounded.
    assert check["exact_check"]["max_rel_logit_diff"] < 2e-4
    assert check["exact_check"]["kv_dtype"] == ("fp16" if kv_dtype == "fp16" else "fp32")
    if kv_dtype == "fp16":  # the K/V the op stored, read back: ties adopted as ORT's are
        assert check["exact_check"]["kv_rounding_ties"] > 0
    expected = {"fp16": "f16", "int8": "u8"}[kv_dtype]
    assert engine.session_options["kv_cache_precision"] == expected


def test_a_draft_models_openvino_engine_reads_its_onnxruntime_engine(tiny, tmp_path):
    ckpt, cache = tiny
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    draft = make_checkpoint(tmp_path / "draft", "llama", seed=1, num_key_value_heads=1, **shape)
    speculative = {"method": "draft_model", "num_speculative_tokens": 3}
    speculative["draft"] = {"source": {"path": str(draft)}}
    targets = [EXACT, {"engine": "onnxruntime", "matmul_accuracy_level": 0}]
    recipe = write_recipe(
        tmp_path / "r.yaml", ckpt, kv_cache=KV32, targets=targets, speculative=speculative
    )
    artifact = build(recipe, tmp_path / "artifact", cache=cache).artifact
    spec = verify_artifact(artifact).speculative.draft
    engine = "draft/engines/onnxruntime-cpu/model.onnx"  # the draft's one copy
    assert spec.graph.path == engine  # its first engine's file
    assert [(e.name, e.path) for e in spec.engines] == [
        ("openvino-cpu", engine),
        ("onnxruntime-cpu", engine),
    ]
    assert not (artifact / "draft" / "model.onnx.data").exists()
    # Alone, the draft's openvino engine reads the draft's portable graph, shipped for it.
    recipe = write_recipe(
        tmp_path / "ov.yaml", ckpt, kv_cache=KV32, targets=[EXACT], speculative=speculative
    )
    artifact = build(recipe, tmp_path / "ov", cache=cache).artifact
    spec = verify_artifact(artifact).speculative.draft
    assert [(e.name, e.path) for e in spec.engines] == [("openvino-cpu", "draft/model.onnx")]
    assert (artifact / "draft" / "model.onnx.data").is_file()


def test_plan_estimates_the_stage():
    config = json.loads((REPO / "recipes/demo/pydoc-tiny/config.json").read_text())
    shapes = plan._Shapes(ModelConfig.from_hf(config))
    stage, disk = plan._engine(shapes, OpenVinoTarget(**OV), 10**8)
    assert stage.stage == "engine:openvino-cpu" and disk == 0  # no engine file
    assert "an f32 compile is checked exactly first" in stage.notes
    builder = ENGINE_BUILDERS.get("openvino")
    sizing = EngineSizing(graph_bytes=10**8, tied_embedding_bytes=0, baseline_bytes=0)
    loose, exact = (
        builder.estimate(OpenVinoTarget(**OV), sizing),
        builder.estimate(OpenVinoTarget(**EXACT), sizing),
    )
    assert exact.seconds < loose.seconds and exact.peak_bytes == loose.peak_bytes
