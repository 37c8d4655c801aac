"""End to end on the embedded demo model: the repository's GPTQ, AWQ, SmoothQuant W8A8, FP8
and mixed recipes (with fewer calibration samples) build, and the runtime's greedy output
equals the quantized IR's, token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.quantize.checkpoint import load_ir
from ingot.runtime import LoadedModel, SamplingParams

REPO = Path(__file__).resolve().parents[2]
GREEDY_24 = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


# recipe -> the methods of its quantize entries
RECIPES = {
    "gptq": ["gptq", "rtn"],
    "awq": ["awq", "rtn"],
    "w8a8": ["smoothquant", "rtn"],
    "fp8": ["fp8"],
    "mixed": ["awq", "smoothquant", "rtn"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_demo_calibrated_build_matches_ir(tmp_path, name):
    recipe = yaml.safe_load((REPO / "recipes" / f"demo-{name}.yaml").read_text())
    assert [q["method"] for q in recipe["quantize"]] == RECIPES[name]
    demo = REPO / "recipes" / "demo"
    recipe["source"]["path"] = str(demo / "pydoc-tiny")
    if "calibration" in recipe:
        recipe["calibration"].update(
            dataset=str(demo / "pydoc-heldin.txt"), samples=4, seq_len=64
        )  # fast settings
    recipe["evaluate"]["perplexity"]["dataset"] = str(demo / "pydoc-heldin.txt")
    recipe["targets"][0]["matmul_accuracy_level"] = 0  # fp32 activations: the IR's numbers
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    cache = StageCache(tmp_path / "cache")
    result = build(path, tmp_path / "artifact", cache=cache)
    stages = {s.stage: s for s in result.stages}
    assert ("calibrate" in stages) == ("calibration" in recipe)
    assert "quantize" in stages

    ir = load_ir(cache.path("quantize", stages["quantize"].key))
    generator = LoadedModel.load(result.artifact).generator()
    prompts = ["The os module provides", ".. function:: iskeyword(s)\n\n   Return"]
    for completion in generator.generate(prompts, GREEDY_24):
        want = ir.generate_greedy(completion.prompt_token_ids, 24, stop_at_eos=False)
        assert completion.token_ids == want
