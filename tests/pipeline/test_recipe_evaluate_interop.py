"""The recipe's `evaluate` and `interop` sections: validation, and the interop checks against
the source model that run before any build work."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.preflight import check_recipe_against_model
from ingot.pipeline.recipe import Recipe, RecipeError, load_recipe

MODEL_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 320,
    "max_position_embeddings": 4096,
}


def _load(tmp_path: Path, text: str) -> Recipe:
    path = tmp_path / "r.yaml"
    base = "source: {path: ./ckpt}\nartifact: {name: tiny}\n"
    path.write_text(base + textwrap.dedent(text))
    return load_recipe(path)


def _problems(recipe: Recipe) -> list[str]:
    try:
        check_recipe_against_model(recipe, ModelConfig.from_hf(MODEL_CONFIG))
    except RecipeError as err:
        return err.problems
    return []


def _rtn(**fields) -> str:
    spec = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": False, **fields}
    inner = ", ".join(
        f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in spec.items()
    )
    return f"quantize: [{{{inner}}}]\n"


def test_evaluate_defaults(tmp_path):
    recipe = _load(tmp_path, "evaluate: {perplexity: {dataset: eval.txt}}\n")
    ppl = recipe.evaluate.perplexity
    assert (ppl.seq_len, ppl.max_windows, ppl.max_delta, ppl.text_field) == (
        256,
        None,
        None,
        "text",
    )
    assert recipe.stage_slice("evaluate")["evaluate"]["perplexity"]["dataset"] == "eval.txt"


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ("evaluate: {perplexity: {dataset: e.txt, seq_len: 4}}", "evaluate.perplexity.seq_len"),
        (
            "evaluate: {perplexity: {dataset: e.txt, max_delta: -1.0}}",
            "evaluate.perplexity.max_delta",
        ),
        ("evaluate: {perplexity: {dataset: e.txt, windows: 3}}", "evaluate.perplexity.windows"),
        ("evaluate: {perplexity: {seq_len: 64}}", "evaluate.perplexity.dataset"),
        ("interop: [exl2]", "interop.0"),
        ("interop: [gptq, gptq]", "interop"),
    ],
)
def test_bad_sections_name_the_field(tmp_path, section, fragment):
    with pytest.raises(RecipeError) as err:
        _load(tmp_path, section + "\n")
    assert any(fragment in line for line in err.value.problems), err.value


def test_interop_formats_fit_an_asymmetric_int4_recipe(tmp_path):
    recipe = _load(tmp_path, _rtn() + "interop: [gptq, awq, compressed-tensors]\n")
    assert _problems(recipe) == []


@pytest.mark.parametrize(
    ("quantize", "fragment"),
    [
        (_rtn(symmetric=True), "quantize.0.symmetric"),
        (_rtn(bits=8), "quantize.0.bits"),
        (_rtn(group_size=-1), "quantize.0.group_size"),
        (_rtn(ignore="[]"), "lm_head"),
    ],
)
def test_awq_refuses_what_awq_gemm_cannot_hold(tmp_path, quantize, fragment):
    problems = _problems(_load(tmp_path, quantize + "interop: [awq]\n"))
    assert any(fragment in p and "awq" in p for p in problems), problems


def test_gptq_needs_every_decoder_linear_quantized(tmp_path):
    recipe = _load(tmp_path, _rtn(targets='["re:layers\\\\.0\\\\..*"]') + "interop: [gptq]\n")
    problems = _problems(recipe)
    assert any("interop.0" in p and "layers.1.attn.q_proj" in p for p in problems), problems
    # compressed-tensors stores a partly quantized model with an ignore list
    recipe = _load(
        tmp_path, _rtn(targets='["re:layers\\\\.0\\\\..*"]') + "interop: [compressed-tensors]\n"
    )
    assert _problems(recipe) == []


def test_interop_needs_quantized_weights(tmp_path):
    problems = _problems(_load(tmp_path, "interop: [gptq]\n"))
    assert any(p.startswith("interop:") for p in problems), problems


def test_a_model_mixing_local_and_global_layers_builds_but_not_with_fp8_kv(tmp_path):
    """Its local layers read inputs of their own, which only a graph that writes its pool
    has: fp8 KV (whose graph returns its K/V) is refused at once, naming the field."""
    mixed = {**MODEL_CONFIG, "model_type": "qwen2", "use_sliding_window": True}
    cfg = ModelConfig.from_hf({**mixed, "sliding_window": 64, "max_window_layers": 1})
    check_recipe_against_model(_load(tmp_path, ""), cfg)
    with pytest.raises(RecipeError) as err:
        fp8 = "kv_cache: {dtype: fp8}\ncalibration: {dataset: c.txt, samples: 4, seq_len: 32}\n"
        check_recipe_against_model(_load(tmp_path, fp8), cfg)
    [problem] = err.value.problems
    assert problem.startswith("kv_cache.dtype: fp8") and "layers [1] of 2 slide" in problem
