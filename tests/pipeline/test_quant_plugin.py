"""Quantization methods are plug-ins (pipeline/quantize/method.py).

- The built-in plug-ins, and the recipe assembled from them, import no torch: `ingot inspect`
  describes a quantize record on a runtime install.
- A method added from outside the repository (quant_toy/ternary.py, registered by its
  distribution's entry point and nothing else) goes through the recipe, the layer walk (data
  free and calibrated), quantize.json, the IR (2-bit codes), the export, the engine and
  `ingot inspect`: the runtime's greedy output equals the IR's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ingot.pipeline.quantize.method import QUANT_METHODS, Observation, method_of
from ingot.pipeline.recipe import RecipeError, load_recipe
from ingot.pipeline.recipe.quantize import quantize_entry

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo"
TOY = Path(__file__).parent / "quant_toy"

_NO_TORCH = """
import sys
import ingot.pipeline.recipe
from ingot.pipeline.quantize.method import QUANT_METHODS
for method in QUANT_METHODS:
    method.entry
assert QUANT_METHODS.get("rtn").describe({"method": "rtn", "bits": 4, "group_size": 32,
                                          "symmetric": True}) == "rtn int4 g32 sym"
heavy = [m for m in ("torch", "onnx", "transformers") if m in sys.modules]
assert not heavy, heavy
"""


def test_plugins_and_the_recipe_import_no_torch():
    result = subprocess.run([sys.executable, "-c", _NO_TORCH], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_builtins_are_registered_in_order():
    assert QUANT_METHODS.names()[:5] == ("rtn", "gptq", "awq", "smoothquant", "fp8")
    for name in QUANT_METHODS.names():
        method = QUANT_METHODS.get(name)
        assert method.name == name
        assert method.entry.model_fields["method"].annotation.__args__ == (name,)


@pytest.mark.parametrize(
    ("spec", "observes"),
    [
        ({"method": "rtn", "bits": 4, "group_size": 32}, Observation.NONE),
        ({"method": "gptq", "bits": 4, "group_size": 32}, Observation.HESSIAN),
        ({"method": "awq", "bits": 4, "group_size": 32}, Observation.CHANNELS),
        # SmoothQuant observes its ranges plus what its weights' method observes
        ({"method": "smoothquant"}, Observation.ABSMAX | Observation.HESSIAN),
        ({"method": "smoothquant", "weights": "rtn"}, Observation.ABSMAX),
        ({"method": "fp8"}, Observation.NONE),
        ({"method": "fp8", "activations": "static"}, Observation.ABSMAX),
    ],
)
def test_an_entry_is_calibrated_when_its_method_observes_something(spec, observes):
    entry = quantize_entry(spec)
    assert method_of(entry).observes(entry) == observes
    assert entry.calibrated == bool(observes)


def test_an_unknown_method_names_the_plugins(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "source: {path: ./ckpt}\nartifact: {name: tiny}\n"
        "quantize: [{method: ternary, targets: ['re:.*']}]\n"
    )
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    assert "quantize.0.method: unknown method" in str(error.value)
    assert "rtn, gptq, awq, smoothquant, fp8" in str(error.value)


_TOY_BUILD = """
import json, sys
from pathlib import Path
from click.testing import CliRunner
from ingot.cli import main
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.quantize.checkpoint import load_ir
from ingot.runtime import LoadedModel, SamplingParams

tmp = Path(sys.argv[1])
cache = StageCache(tmp / "cache")
result = build(tmp / "recipe.yaml", tmp / "artifact", cache=cache)
quantize = next(s for s in result.stages if s.stage == "quantize")
ir_dir = cache.path("quantize", quantize.key)
ir = load_ir(ir_dir)
generator = LoadedModel.load(result.artifact).generator()
greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
same = [
    c.token_ids == ir.generate_greedy(c.prompt_token_ids, 16, stop_at_eos=False)
    for c in generator.generate(["The os module provides", "Return the"], greedy)
]
print(json.dumps({
    "stages": [s.stage for s in result.stages],
    "quantize_json": json.loads((ir_dir / "quantize.json").read_text()),
    "ir": json.loads((ir_dir / "ir_config.json").read_text())["quantized"],
    "same": same,
    "inspect": CliRunner().invoke(main, ["inspect", str(result.artifact)]).output,
}))
"""


def _toy_distribution(root: Path) -> None:
    """What `pip install` of a distribution shipping quant_toy/ternary.py would leave on the
    path: its metadata, with the one registration line."""
    info = root / "ingot_toy_ternary-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ingot-toy-ternary\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ingot.quant_methods]\nternary = ternary\n")


@pytest.mark.slow
def test_a_toy_method_from_another_distribution_builds_end_to_end(tmp_path):
    _toy_distribution(tmp_path / "site")
    recipe = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    recipe["source"]["path"] = str(DEMO / "pydoc-tiny")
    recipe["artifact"]["chat_template"] = str(DEMO / "chat_template.jinja")
    recipe["calibration"] = {"dataset": str(DEMO / "pydoc-heldin.txt"), "samples": 4, "seq_len": 64}
    recipe["quantize"] = [
        {"method": "ternary", "targets": ["re:layers\\..*\\.attn\\..*"], "ignore": []},
        {"method": "ternary", "weighted": True, "targets": ["re:layers\\..*\\.mlp\\..*"]},
    ]
    recipe["targets"][0]["matmul_accuracy_level"] = 0  # fp32 activations: the IR's numbers
    del recipe["evaluate"]  # ternary weights on a 4-layer model: no perplexity to gate on
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    env_path = f"{tmp_path / 'site'}:{TOY}"
    result = subprocess.run(
        [sys.executable, "-c", _TOY_BUILD, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": env_path},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.splitlines()[-1])

    assert "calibrate" in out["stages"]  # the weighted entry observes the Hessian
    records = out["quantize_json"]
    assert [(r["method"], r["weighted"], r["bits"], r["modules"]) for r in records] == [
        ("ternary", False, 2, 16),
        ("ternary", True, 2, 12),
    ]
    assert len(out["ir"]) == 28 and {q["bits"] for q in out["ir"].values()} == {2}
    assert out["same"] == [True, True]
    assert "ternary int2 g-1 sym: 16 modules" in out["inspect"]
