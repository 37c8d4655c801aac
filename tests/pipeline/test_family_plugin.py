"""A model family from outside ingot (tests/pipeline/toyllama_family.py, one module) is found
through the entry-point group ``ingot.model_families`` and goes through every stage the built-in
families do: config.json -> ModelConfig, the IR (its logits equal transformers'), quantize,
export and the export's check, the engine, the runtime (its greedy tokens equal the IR's past
the sliding window), and the recipe checks (GGUF refused: llama.cpp has no such architecture).

The registry reads entry points once per process, so the checks run in a child interpreter
whose path holds the toy's distribution metadata, as `pip install` would leave it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.model.config import ConfigError, ModelConfig
from ingot.pipeline.model.family import MODEL_FAMILIES
from ingot.pipeline.model.load import load_model
from ingot.pipeline.preflight import check_recipe_against_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.recipe import RecipeError, load_recipe
from ingot.runtime import LoadedModel, SamplingParams

from fixtures import make_checkpoint, write_recipe

HERE = Path(__file__).parent
WINDOW = 6  # tokens: the prompts below are longer, so the window bites
# fp32 activations: the engine computes the IR's numbers (the default, 4, quantizes them).
EXACT = [{"engine": "onnxruntime", "matmul_accuracy_level": 0}]


def make_toy_checkpoint(path: Path) -> tuple[Path, Path]:
    """(the toy checkpoint, the same weights as transformers' Qwen2 for reference): Qwen2 with
    a sliding window on every layer is Llama with q/k/v biases and a window."""
    reference = make_checkpoint(
        path / "qwen2",
        "qwen2",
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=0,
    )
    toy = path / "toy"
    toy.mkdir(parents=True)
    for file in reference.iterdir():
        (toy / file.name).write_bytes(file.read_bytes())
    config = json.loads((toy / "config.json").read_text())
    config.update(model_type="toyllama", architectures=["ToyLlamaForCausalLM"])
    (toy / "config.json").write_text(json.dumps(config, indent=2))
    return toy, reference


def _declare_entry_point(site: Path) -> None:
    """What installing a distribution with ``[project.entry-points."ingot.model_families"]
    toyllama = "toyllama_family"`` leaves on the path."""
    info = site / "toyllama_family-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyllama-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ingot.model_families]\ntoyllama = toyllama_family\n")


def test_a_plugged_in_family_builds_and_runs(tmp_path):
    toy, reference = make_toy_checkpoint(tmp_path / "ckpt")
    _declare_entry_point(tmp_path / "site")
    path = os.pathsep.join(map(str, (HERE, HERE.parent, tmp_path / "site")))
    child = (
        "import sys; from pathlib import Path; import test_family_plugin as t; "
        "t.child_checks(*map(Path, sys.argv[1:]))"
    )
    args = [sys.executable, "-c", child, str(toy), str(reference), str(tmp_path / "work")]
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_without_its_entry_point_the_family_is_unsupported(tmp_path):
    toy, _ = make_toy_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="model_type 'toyllama' is not supported"):
        ModelConfig.from_dir(toy)


def child_checks(toy: Path, reference: Path, work: Path) -> None:
    """Run in the child interpreter, where the toy family is registered."""
    assert MODEL_FAMILIES.names()[-1] == "toyllama"
    cfg = ModelConfig.from_dir(toy)
    assert cfg.family.hf_class == "ToyLlamaForCausalLM"
    assert (cfg.qkv_bias, cfg.o_bias, cfg.sliding_window) == (True, False, WINDOW)

    ir = load_model(toy)
    ref = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ir(ids)[0], ref(ids).logits, atol=1e-4, rtol=0)

    work.mkdir()
    _build_and_generate(toy, work)
    _gguf_refused(toy, work)


def _build_and_generate(toy: Path, work: Path) -> None:
    """The build (quantize, export + its check, engine) and the runtime's greedy tokens
    against the quantized IR's, on prompts longer than the window."""
    recipe = write_recipe(work / "r.yaml", toy, targets=EXACT)
    artifact = build(recipe, work / "art", cache=StageCache(work / "cache")).artifact
    generator = LoadedModel.load(artifact).generator()
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    completions = generator.generate(["def add(a, b):", "The quick brown fox"], greedy)
    model = load_model(toy)
    quantize_model(model, load_recipe(recipe).quantize)
    for completion in completions:
        want = model.generate_greedy(completion.prompt_token_ids, 24, stop_at_eos=False)
        assert completion.token_ids == want


def _gguf_refused(toy: Path, work: Path) -> None:
    recipe = load_recipe(write_recipe(work / "gguf.yaml", toy, interop=["gguf"]))
    try:
        check_recipe_against_model(recipe, ModelConfig.from_dir(toy))
    except RecipeError as e:
        assert "llama.cpp has no architecture for model_type 'toyllama'" in str(e), e
    else:
        raise AssertionError("a GGUF export of the toy family was not refused")
