"""speculative.method: eagle end to end on the embedded demo model: an EAGLE-3 draft trained in
the build (recipes/demo-eagle.yaml, fewer steps and windows), shipped under draft/eagle/,
measured by evaluate, drafting in the runtime with greedy output identical to plain decoding;
the same draft attached from the speculators copy; mistakes refused before any stage runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
import yaml

from ingot.artifacts import verify_artifact
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.recipe import RecipeError, load_recipe
from ingot.runtime import LoadedModel, SamplingParams

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo"
GREEDY = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
PROMPTS = [
    ".. function:: iskeyword(s)\n\n   Return",
    "The os module provides a portable way of",
    "   >>> import math\n   >>> math.",
]


def _recipe(tmp_path: Path, **speculative) -> Path:
    recipe = yaml.safe_load((REPO / "recipes" / "demo-eagle.yaml").read_text())
    recipe["source"]["path"] = str(DEMO / "pydoc-tiny")
    recipe["calibration"].update(dataset=str(DEMO / "pydoc-heldin.txt"), samples=16, seq_len=128)
    recipe["evaluate"]["perplexity"]["dataset"] = str(DEMO / "pydoc-heldin.txt")
    recipe["evaluate"]["speculative"] = {"prompts": 3, "prompt_tokens": 32, "max_tokens": 32}
    recipe["targets"][0]["matmul_accuracy_level"] = 0  # exact: greedy parity is token for token
    recipe["speculative"]["heads"]["train"].update(steps=60, span=64)
    recipe["speculative"].update(speculative)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eagle")
    cache = StageCache(tmp / "cache")
    result = build(_recipe(tmp), tmp / "artifact", cache=cache)
    return result, cache


def _eagle_dir(result, cache: StageCache) -> Path:
    run = next(s for s in result.stages if s.stage == "eagle")
    return cache.path("eagle", run.key)


def test_trained_draft_is_built_measured_and_shipped(trained):
    result, cache = trained
    stages = [s.stage for s in result.stages]
    assert stages.index("calibrate") < stages.index("export") < stages.index("eagle")
    assert stages.index("eagle") < stages.index("evaluate")
    manifest = verify_artifact(result.artifact)
    spec, eagle = manifest.speculative, manifest.speculative.eagle
    assert (spec.method, spec.heads, spec.draft) == ("eagle", None, None)
    # 4 layers: vLLM's default (2, 2, 1) is not 3 distinct layers; spread out instead
    assert (eagle.origin, eagle.aux_layers) == ("train", [1, 2, 3])
    assert (eagle.hidden_size, eagle.vocab_size) == (manifest.model.hidden_size, 4096)
    shipped = {f.path for f in manifest.files}
    assert {"draft/eagle/model.onnx", "draft/eagle/fc.onnx.data"} <= shipped
    assert eagle.training["loss_last"] < eagle.training["loss_first"]
    assert len(eagle.training["held_out_acceptance"]) == 3  # ttt_steps
    assert eagle.check["mismatches"] == 0
    # The target's engine (the artifact's one graph) outputs the draft's features.
    engine = result.artifact / manifest.engines[0].path
    graph = onnx.load(str(engine), load_external_data=False)
    assert "aux_hidden" in {o.name for o in graph.graph.output}
    assert "aux_hidden" in {o.name for o in manifest.graph.outputs}
    # Evaluate measured the drafter through the runtime.
    measured = manifest.eval["speculative"]
    assert measured["method"] == "eagle" and measured["mean_accepted_length"] > 1.0
    # The speculators copy stays in the stage cache (for attach, for vLLM), not in the artifact.
    assert (_eagle_dir(result, cache) / "speculators" / "config.json").is_file()
    assert not (result.artifact / "draft" / "eagle" / "eagle.json").exists()


@pytest.mark.parametrize("method", ["eagle", "eagle3"])  # vLLM's name for an EAGLE-3 drafter
def test_eagle_decoding_equals_plain_decoding(trained, method):
    result, _ = trained
    plain = LoadedModel.load(result.artifact, speculative_config=False).generator()
    want = [c.token_ids for c in plain.generate(PROMPTS, GREEDY)]
    config = {"method": method, "adaptive": False}  # draft at every step it can
    generator = LoadedModel.load(result.artifact, speculative_config=config).generator()
    got = [c.token_ids for c in generator.generate(PROMPTS, GREEDY)]
    assert got == want
    stats = generator.speculation.stats
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0  # accepted and rejected


def test_attached_draft_is_the_trained_one(trained, tmp_path):
    result, cache = trained
    shutil.copytree(_eagle_dir(result, cache) / "speculators", tmp_path / "eagle3")
    recipe = _recipe(tmp_path, heads={"attach": "eagle3"})  # relative to the recipe
    data = yaml.safe_load(recipe.read_text())
    del data["calibration"]  # an attached draft needs no training windows (RTN needs none)
    recipe.write_text(yaml.safe_dump(data))
    attached = build(recipe, tmp_path / "artifact", cache=cache)
    eagle = verify_artifact(attached.artifact).speculative.eagle
    assert eagle.origin == "attach" and eagle.training is None
    cached = {s.stage: s.cached for s in attached.stages}
    assert cached["quantize"] and cached["export"] and not cached["eagle"]
    for name in ("model.onnx.data", "fc.onnx.data"):
        files = [p / "draft" / "eagle" / name for p in (result.artifact, attached.artifact)]
        assert files[0].read_bytes() == files[1].read_bytes()  # the same weights, exported alike


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"transformer_layer_config": {"vocab_size": 32000}},
            "speculative.heads.attach: vocab_size 32000 differs from the target's 4096",
        ),
        ({"speculators_model_type": "eagle"}, "speculators_model_type 'eagle'"),
        ({"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}, r"\[1, 2, 9\]: must be 3 layers in"),
        ({"eagle_aux_hidden_state_layer_ids": [2, 2, 1]}, "must be distinct and ascending"),
    ],
)
def test_attached_draft_that_cannot_serve_is_refused_before_any_work(
    trained, tmp_path, change, message
):
    result, cache = trained
    checkpoint = tmp_path / "eagle3"
    shutil.copytree(_eagle_dir(result, cache) / "speculators", checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    (checkpoint / "config.json").write_text(json.dumps(config))
    recipe = _recipe(tmp_path, heads={"attach": str(checkpoint)})
    empty = StageCache(tmp_path / "empty")
    with pytest.raises(RecipeError, match=message):
        build(recipe, tmp_path / "artifact", cache=empty)
    assert not (tmp_path / "empty" / "stages").exists()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r.pop("calibration"), "needs calibration data, the text an EAGLE-3 draft"),
        (
            lambda r: r["speculative"]["heads"]["train"].update(span=256),
            "speculative.heads.train.span: 256 exceeds calibration.seq_len 128",
        ),
        (
            lambda r: r["speculative"]["heads"].update(attach="x"),
            "give exactly one of `train` and `attach`",
        ),
    ],
)
def test_recipe_mistakes_are_named(tmp_path, edit, message):
    path = _recipe(tmp_path)
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeError, match=message):
        load_recipe(path)
