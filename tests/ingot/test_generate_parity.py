"""The runtime's greedy output equals the PyTorch IR running the same quantized weights, token
for token (64 tokens), on random fixtures of each architecture and on the embedded demo model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.recipe import load_recipe
from ingot.runtime import LoadedModel, SamplingParams

from fixtures import ARCHS, make_checkpoint, write_recipe

REPO = Path(__file__).resolve().parents[2]
GREEDY_64 = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
# fp32 activations: the engine computes the IR's numbers (the default, 4, quantizes them).
EXACT = [{"engine": "onnxruntime", "matmul_accuracy_level": 0}]


def _ir_reference(recipe_path: Path, prompts: list[list[int]]) -> list[list[int]]:
    recipe = load_recipe(recipe_path)
    model = load_model(recipe.source.path)
    quantize_model(model, recipe.quantize)
    return [model.generate_greedy(p, 64, stop_at_eos=False) for p in prompts]


@pytest.mark.parametrize("variant", sorted(ARCHS))
def test_runtime_greedy_matches_ir(tmp_path, variant):
    arch, overrides = ARCHS[variant]
    ckpt = make_checkpoint(tmp_path / "ckpt", arch, **overrides)
    recipe = write_recipe(tmp_path / "r.yaml", ckpt, targets=EXACT)
    artifact = build(recipe, tmp_path / "art", cache=StageCache(tmp_path / "cache")).artifact
    generator = LoadedModel.load(artifact).generator()
    prompts = ["def add(a, b):", "The quick brown fox", "import os"]
    completions = generator.generate(prompts, GREEDY_64)  # batched: three sequences at once
    expected = _ir_reference(recipe, [c.prompt_token_ids for c in completions])
    for completion, want in zip(completions, expected, strict=True):
        assert completion.token_ids == want


@pytest.mark.slow
def test_demo_artifact_greedy_matches_ir(tmp_path):
    demo = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    demo["source"]["path"] = str(REPO / "recipes" / "demo" / "pydoc-tiny")
    demo["artifact"]["chat_template"] = str(REPO / "recipes" / "demo" / "chat_template.jinja")
    demo["targets"] = EXACT
    del demo["evaluate"]
    recipe = tmp_path / "demo.yaml"
    recipe.write_text(yaml.safe_dump(demo))
    artifact = build(recipe, tmp_path / "demo", cache=StageCache(tmp_path / "cache")).artifact
    generator = LoadedModel.load(artifact).generator()
    prompts = ["The os module provides", ".. function:: iskeyword(s)\n\n   Return"]
    completions = generator.generate(prompts, GREEDY_64)
    expected = _ir_reference(recipe, [c.prompt_token_ids for c in completions])
    for completion, want in zip(completions, expected, strict=True):
        assert completion.token_ids == want
        assert len(want) == 64
