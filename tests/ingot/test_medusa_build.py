"""speculative.method: medusa end to end on the embedded demo model: heads trained in the build
(recipes/demo-medusa.yaml, fewer steps and windows), shipped under draft/heads/, drafting in the
runtime with greedy output identical to plain decoding; the same heads attached from vLLM's
layout; the recipe's and the checkpoint's mistakes refused before any stage runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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
    recipe = yaml.safe_load((REPO / "recipes" / "demo-medusa.yaml").read_text())
    recipe["source"]["path"] = str(DEMO / "pydoc-tiny")
    recipe["calibration"].update(dataset=str(DEMO / "pydoc-heldin.txt"), samples=16, seq_len=128)
    recipe["evaluate"]["perplexity"]["dataset"] = str(DEMO / "pydoc-heldin.txt")
    recipe["targets"][0]["matmul_accuracy_level"] = 0  # exact: greedy parity is token for token
    recipe["speculative"]["heads"]["train"].update(steps=200)
    recipe["speculative"].update(speculative)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("medusa")
    cache = StageCache(tmp / "cache")
    result = build(_recipe(tmp), tmp / "artifact", cache=cache)
    return result, cache


def _heads_dir(result, cache: StageCache) -> Path:
    run = next(s for s in result.stages if s.stage == "heads")
    return cache.path("heads", run.key)


def test_trained_heads_are_built_and_shipped(trained):
    result, cache = trained
    stages = [s.stage for s in result.stages]
    assert stages.index("calibrate") < stages.index("quantize") < stages.index("heads")
    manifest = verify_artifact(result.artifact)
    heads = manifest.speculative.heads
    assert manifest.speculative.method == "medusa" and manifest.speculative.draft is None
    assert (heads.origin, heads.num_heads, heads.num_layers) == ("train", 4, 1)
    assert heads.path == "draft/heads/model.onnx"
    assert {"draft/heads/model.onnx", "draft/heads/model.onnx.data"} <= {
        f.path for f in manifest.files
    }
    assert heads.training["loss_last"] < heads.training["loss_first"]
    assert heads.check["mismatches"] == 0
    # vLLM's layout stays in the stage cache (for attach), not in the artifact.
    assert (_heads_dir(result, cache) / "vllm" / "config.json").is_file()
    assert not (result.artifact / "draft" / "heads" / "heads.json").exists()


def test_medusa_decoding_equals_plain_decoding(trained):
    result, _ = trained
    plain = LoadedModel.load(result.artifact, speculative_config=False).generator()
    want = [c.token_ids for c in plain.generate(PROMPTS, GREEDY)]
    config = {"method": "medusa", "adaptive": False}  # draft at every step it can
    generator = LoadedModel.load(result.artifact, speculative_config=config).generator()
    got = [c.token_ids for c in generator.generate(PROMPTS, GREEDY)]
    assert got == want
    stats = generator.speculation.stats
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0  # accepted and rejected


def test_attached_heads_are_the_trained_ones(trained, tmp_path):
    result, cache = trained
    checkpoint = tmp_path / "medusa-heads"
    shutil.copytree(_heads_dir(result, cache) / "vllm", checkpoint)
    recipe = _recipe(tmp_path, heads={"attach": "medusa-heads"})  # relative to the recipe
    data = yaml.safe_load(recipe.read_text())
    del data["calibration"]  # attached heads need no training windows (RTN needs none either)
    recipe.write_text(yaml.safe_dump(data))
    attached = build(recipe, tmp_path / "artifact", cache=cache)
    heads = verify_artifact(attached.artifact).speculative.heads
    assert heads.origin == "attach" and heads.training is None
    cached = {s.stage: s.cached for s in attached.stages}
    assert cached["quantize"] and not cached["heads"]
    shipped = [
        (p / "draft" / "heads" / "model.onnx.data").read_bytes()
        for p in (result.artifact, attached.artifact)
    ]
    assert shipped[0] == shipped[1]  # the same weights, exported the same way


def test_attached_heads_of_another_model_are_refused_before_any_work(trained, tmp_path):
    result, cache = trained
    checkpoint = tmp_path / "medusa-heads"
    shutil.copytree(_heads_dir(result, cache) / "vllm", checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    other = {**config, "vocab_size": 32000, "truncated_vocab_size": 32000}  # another model's
    (checkpoint / "config.json").write_text(json.dumps(other))
    recipe = _recipe(tmp_path, heads={"attach": str(checkpoint)}, num_speculative_tokens=5)
    empty = StageCache(tmp_path / "empty")
    with pytest.raises(RecipeError) as e:
        build(recipe, tmp_path / "artifact", cache=empty)
    assert "speculative.heads.attach: vocab_size 32000 differs from the target's 4096" in str(
        e.value
    )
    assert "4 heads cannot propose num_speculative_tokens 5" in str(e.value)
    assert not (tmp_path / "empty" / "stages").exists()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r.pop("calibration"), "speculative.heads.train: needs calibration data"),
        (
            lambda r: r["calibration"].update(samples=1),
            "calibration.samples: 1 is too few to train Medusa heads",
        ),
        (
            lambda r: (
                r["calibration"].update(seq_len=16),
                r["speculative"]["heads"]["train"].update(num_heads=16),
            ),
            "calibration.seq_len: 16 is too short for 16 Medusa heads",
        ),
        (
            lambda r: r["speculative"]["heads"].update(attach="x"),
            "give exactly one of `train` and `attach`",
        ),
        (
            lambda r: r["speculative"].update(num_speculative_tokens=5),
            "num_speculative_tokens \\(5\\) exceeds speculative.heads.train.num_heads \\(4\\)",
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
