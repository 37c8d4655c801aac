"""A recipe with `method: auto` builds end to end on a tiny checkpoint: the precision stage
measures, the quantize stage resolves and runs the chosen candidates; the stored weights of the
selected linears in the artifact's graph are what the search counted and within the budget;
the resolved per-module recipe is in ingot.lock and the manifest; another budget reuses the
measurement, the same budget every stage; the runtime's greedy output equals the IR's."""

from __future__ import annotations

import json

import pytest

from benchmarks.quantize.auto_scoring import layer_weight_bytes
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.model.architecture import linear_names, linear_shape
from ingot.pipeline.quantize.checkpoint import load_ir
from ingot.runtime import LoadedModel, SamplingParams

from fixtures import make_checkpoint, model_config, write_recipe

CANDIDATES = [
    {"method": "rtn", "bits": 4, "group_size": 32},
    {"method": "gptq", "bits": 4, "group_size": 32},
    {"method": "rtn", "bits": 8, "group_size": -1},
]
BUDGET = 6.0  # between int4 g32 (5.0 stored bits per weight) and int8 per channel (~8.3)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Three builds sharing a cache: budget 6.0, 7.0, then 6.0 again."""
    tmp = tmp_path_factory.mktemp("auto")
    checkpoint = make_checkpoint(tmp / "ckpt")
    (tmp / "calib.txt").write_text("def f(a, b):\n    return a + b\n" * 200)
    cache = StageCache(tmp / "cache")
    results = []
    for i, budget in enumerate((BUDGET, 7.0, BUDGET)):
        auto = {"method": "auto", "budget_bits": budget, "candidates": CANDIDATES}
        recipe = write_recipe(
            tmp / f"recipe{i}.yaml",
            checkpoint,
            calibration={"dataset": "calib.txt", "samples": 4, "seq_len": 32},
            quantize=[auto],
            targets=[{"engine": "onnxruntime", "device": "cpu", "matmul_accuracy_level": 0}],
            # the budget counts the exported graph's bytes, read from it below
            artifact={"name": "tiny", "portable": True},
        )
        results.append(build(recipe, tmp / f"out{i}", cache=cache))
    return results, cache


def _runs(result) -> dict[str, bool]:
    return {run.stage: run.cached for run in result.stages}


def test_the_budget_holds_in_the_artifacts_bytes(built):
    result = built[0][0]
    manifest = json.loads((result.artifact / "manifest.json").read_text())
    [record] = manifest["model"]["quantization"]
    cfg = model_config()
    selected = [n for n in linear_names(cfg) if n != "lm_head"]
    weights = sum(k * n for k, n in (linear_shape(cfg, m) for m in selected))
    stored = layer_weight_bytes(result.artifact / "model.onnx")
    assert stored == record["stored_bytes"] <= BUDGET * weights / 8
    assert record["stored_bits"] == pytest.approx(8 * stored / weights)
    assert record["modules"] == len(selected)


def test_the_resolved_recipe_is_in_the_lock_and_the_manifest(built):
    result = built[0][0]
    manifest = json.loads((result.artifact / "manifest.json").read_text())
    lock = json.loads((result.artifact / "ingot.lock").read_text())
    resolved = lock["quantize_resolved"]["0"]
    [record] = manifest["model"]["quantization"]
    assert [e["targets"] for e in resolved] == [r["targets"] for r in record["resolved"]]
    modules = [m for e in resolved for m in e["targets"]]
    selected = [n for n in linear_names(model_config()) if n != "lm_head"]
    assert sorted(modules) == sorted(selected)  # every selected linear exactly once
    assert {e["method"] for e in resolved} <= {"rtn", "gptq"}
    assert "precision" in lock["stages"] and "quantize" in lock["stages"]


def test_another_budget_reuses_the_measurement_and_the_same_one_everything(built):
    (first, other, again), _ = built
    assert _runs(first)["precision"] is False
    assert _runs(other)["precision"] is True and _runs(other)["quantize"] is False
    assert all(cached for stage, cached in _runs(again).items() if stage != "package")
    assert again.digest == first.digest


def test_the_runtime_greedy_output_equals_the_irs(built):
    (first, _, _), cache = built
    quantize = next(s for s in first.stages if s.stage == "quantize")
    ir = load_ir(cache.path("quantize", quantize.key))
    generator = LoadedModel.load(first.artifact).generator()
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[0, 5, 17, 42, 9], [0, 100, 3]]
    for completion in generator.generate(prompts, greedy):
        expected = ir.generate_greedy(completion.prompt_token_ids, 12, stop_at_eos=False)
        assert completion.token_ids == expected


def test_a_larger_budget_buys_more_int8(built):
    (first, other, _), _ = built
    int8 = []
    for result, budget in ((first, BUDGET), (other, 7.0)):
        manifest = json.loads((result.artifact / "manifest.json").read_text())
        [record] = manifest["model"]["quantization"]
        assert budget - 0.25 < record["stored_bits"] <= budget  # a mix, not one candidate
        int8.append(sum(r["modules"] for r in record["resolved"] if r["bits"] == 8))
    assert 0 < int8[0] < int8[1]
