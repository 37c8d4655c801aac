"""Recipe entries for GPTQ, AWQ, SmoothQuant and FP8: defaults, the calibration they need, and
the combinations refused before any work."""

from __future__ import annotations

import textwrap

import pytest

from ingot.pipeline.interop.checks import interop_problems
from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.preflight import check_recipe_against_model
from ingot.pipeline.quantize.methods.awq import AwqQuantize
from ingot.pipeline.quantize.methods.fp8 import Fp8Quantize
from ingot.pipeline.quantize.methods.gptq import GptqQuantize
from ingot.pipeline.quantize.methods.smoothquant import SmoothQuantQuantize
from ingot.pipeline.recipe import RecipeError, load_recipe

CALIBRATION = "calibration: {dataset: calib.txt, samples: 16, seq_len: 64}\n"
MODEL_CONFIG = {
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 96,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 4096,
}


def load(tmp_path, quantize: str, calibration: str = CALIBRATION):
    text = (
        f"source: {{path: ./ckpt}}\nartifact: {{name: tiny}}\n{calibration}quantize: {quantize}\n"
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(text))
    return load_recipe(path)


def test_defaults(tmp_path):
    recipe = load(
        tmp_path,
        "[{method: gptq, bits: 4, group_size: 128, targets: ['re:layers\\..*\\.attn\\..*']},"
        " {method: awq, bits: 4, group_size: 32, targets: ['re:layers\\..*\\.mlp\\..*']}]",
    )
    gptq, awq = recipe.quantize
    assert isinstance(gptq, GptqQuantize) and isinstance(awq, AwqQuantize)
    defaults = (gptq.actorder, gptq.static_groups, gptq.dampening_frac, gptq.block_size)
    assert defaults == (True, True, 0.01, 128)
    assert (gptq.group_scales, gptq.true_sequential) == ("best", True)
    assert gptq.symmetric and not awq.symmetric  # AWQ is asymmetric unless told otherwise
    assert recipe.calibration.seed == 0 and recipe.calibration.split == "train"


@pytest.mark.parametrize(
    ("quantize", "calibration", "fragments"),
    [
        (
            "[{method: gptq, bits: 4, group_size: 128}]",
            "",
            ["calibration: required field missing", "quantize.0 (method gptq)"],
        ),
        (
            "[{method: rtn, bits: 4, group_size: 32}, {method: awq, bits: 4, group_size: 32}]",
            "",
            ["calibration:", "quantize.1 (method awq)"],
        ),
        (
            "[{method: gptq, bits: 4, group_size: 64, static_groups: false}]",
            CALIBRATION,
            ["quantize.0.static_groups", "g_idx", "got False"],
        ),
        ("[{method: awq, bits: 8, group_size: 32}]", CALIBRATION, ["quantize.0.bits", "got 8"]),
        (
            "[{method: gptq, bits: 4, group_size: 32, dampening_frac: 0}]",
            CALIBRATION,
            ["quantize.0.dampening_frac"],
        ),
        (
            "[{method: gptq, bits: 4, group_size: 32, group_scales: mean}]",
            CALIBRATION,
            ["quantize.0.group_scales", "'best', 'minmax' or 'mse'", "mean"],
        ),
        (
            "[{method: gptq, bits: 4, group_size: 32, blocksize: 64}]",
            CALIBRATION,
            ["quantize.0.blocksize: unknown field", "block_size"],
        ),
        (
            "[{method: smoothquant}]",
            "",
            ["calibration: required field missing", "quantize.0 (method smoothquant)"],
        ),
        (
            "[{method: fp8, activations: static}]",
            "",
            ["calibration: required field missing", "quantize.0 (method fp8)"],
        ),
        ("[{method: smoothquant, alpha: 1.5}]", CALIBRATION, ["quantize.0.alpha", "1.5"]),
        ("[{method: smoothquant, bits: 4}]", CALIBRATION, ["quantize.0.bits: unknown field"]),
        ("[{method: fp8, weights: group}]", "", ["quantize.0.weights", "'channel' or 'tensor'"]),
        ("[{method: smoothquant, activations: token}]", CALIBRATION, ["quantize.0.activations"]),
    ],
)
def test_refused(tmp_path, quantize, calibration, fragments):
    with pytest.raises(RecipeError) as err:
        load(tmp_path, quantize, calibration)
    assert any(all(f in line for f in fragments) for line in err.value.problems), err.value


def test_act_order_per_channel_needs_no_static_groups(tmp_path):
    # One group per row: the order of the columns cannot scatter it.
    recipe = load(tmp_path, "[{method: gptq, bits: 4, group_size: -1, static_groups: false}]")
    assert not recipe.quantize[0].static_groups


def test_calibrated_methods_refuse_lm_head(tmp_path):
    recipe = load(tmp_path, "[{method: gptq, bits: 8, group_size: 32, ignore: []}]")
    with pytest.raises(RecipeError, match=r"quantize\.0\.ignore: gptq quantizes decoder-layer"):
        check_recipe_against_model(recipe, ModelConfig.from_hf(MODEL_CONFIG))
    mixed = load(
        tmp_path,
        "[{method: awq, bits: 4, group_size: 32},"
        " {method: rtn, bits: 8, group_size: 32, targets: [lm_head], ignore: []}]",
    )
    check_recipe_against_model(
        mixed, ModelConfig.from_hf(MODEL_CONFIG)
    )  # lm_head by RTN, the layers by AWQ


def test_smoothquant_and_fp8_defaults(tmp_path):
    recipe = load(
        tmp_path,
        "[{method: smoothquant, targets: ['re:layers\\..*\\.attn\\..*']},"
        " {method: fp8, targets: ['re:layers\\..*\\.mlp\\..*']}]",
    )
    w8a8, fp8 = recipe.quantize
    assert isinstance(w8a8, SmoothQuantQuantize) and isinstance(fp8, Fp8Quantize)
    assert (w8a8.alpha, w8a8.weights, w8a8.activations) == (0.5, "gptq", "dynamic")
    assert (fp8.weights, fp8.activations) == ("channel", "dynamic")
    assert w8a8.calibrated and not fp8.calibrated  # dynamic FP8 scales need no data
    no_calibration = load(tmp_path, "[{method: fp8, ignore: []}]", calibration="")
    check_recipe_against_model(no_calibration, ModelConfig.from_hf(MODEL_CONFIG))  # lm_head too


def test_smoothquant_and_static_fp8_refuse_lm_head(tmp_path):
    cfg = ModelConfig.from_hf(MODEL_CONFIG)
    for entry in (
        "{method: smoothquant, ignore: []}",
        "{method: fp8, activations: static, ignore: []}",
    ):
        recipe = load(tmp_path, f"[{entry}]")
        with pytest.raises(RecipeError, match=r"quantize\.0\.ignore: .* decoder-layer linears"):
            check_recipe_against_model(recipe, cfg)


def test_interop_formats_refuse_activation_quantization(tmp_path):
    """compressed-tensors holds W8A8 and FP8 (alone or beside integer entries); the weight-only
    formats refuse each such entry once per format, naming the field and the format."""
    cfg = ModelConfig.from_hf(MODEL_CONFIG)
    mixed = (
        "[{method: awq, bits: 4, group_size: 32, targets: ['re:.*mlp.*']}, "
        "{method: smoothquant, targets: ['re:.*attn.*']}, "
        "{method: fp8, activations: none, targets: [lm_head], ignore: []}]"
    )
    for quantize in ("[{method: smoothquant}]", "[{method: fp8, weights: tensor}]", mixed):
        recipe = load(tmp_path, f"{quantize}\ninterop: [compressed-tensors]")
        assert interop_problems(recipe, cfg) == [], quantize
    recipe = load(tmp_path, f"{mixed}\ninterop: [compressed-tensors, awq, gptq, gguf]")
    problems = interop_problems(recipe, cfg)
    refused = [p for p in problems if p.startswith(("quantize.1.method:", "quantize.2.method:"))]
    assert len(refused) == 6, problems  # two entries x three formats
    for j, fmt in enumerate(("awq", "gptq", "gguf"), start=1):
        line = next(p for p in refused if f"interop {fmt} (interop.{j})" in p)
        assert line.startswith("quantize.1.method: ") and "got 'smoothquant'" in line
        assert "\n" not in line and "compressed-tensors" in line
    # The integer entry is no refused method; the weight-only formats' own checks still run.
    assert not any(p.startswith("quantize.0.") for p in problems)
    assert any(p.startswith("quantize.2.ignore: interop awq keeps lm_head float") for p in problems)


def test_smoothquant_selects_whole_norm_fed_groups(tmp_path):
    cfg = ModelConfig.from_hf(MODEL_CONFIG)
    part = load(tmp_path, "[{method: smoothquant, targets: ['re:layers\\..*\\.attn\\.q_proj']}]")
    with pytest.raises(
        RecipeError,
        match=r"quantize\.0\.targets: smoothquant folds one scale "
        r"into attn_norm .*missing layers\.0\.attn\.k_proj",
    ):
        check_recipe_against_model(part, cfg)
    unsmoothed = load(
        tmp_path, "[{method: smoothquant, alpha: null, targets: ['re:layers\\..*\\.q_proj']}]"
    )
    check_recipe_against_model(unsmoothed, cfg)  # no smoothing: any selection
