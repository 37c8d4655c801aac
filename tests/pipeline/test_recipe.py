"""Recipe v1: bad recipes fail with the field path and the bad or allowed values; good ones load."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ingot.pipeline.engines.onnxruntime import OnnxRuntimeTarget
from ingot.pipeline.model.config import ConfigError, ModelConfig
from ingot.pipeline.model.selection import module_selected
from ingot.pipeline.preflight import check_recipe_against_model
from ingot.pipeline.recipe import (
    STAGES,
    HubSource,
    KvCache,
    LocalSource,
    Recipe,
    RecipeError,
    load_recipe,
)

MINIMAL = """\
source: {path: ./ckpt}
artifact: {name: tiny}
"""

# A toy Llama config: widths chosen so that 32 divides everything, 64 and 128 do not divide 96.
MODEL_CONFIG = {
    "hidden_size": 96,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def check(recipe: Recipe, config: dict, **kwargs) -> None:
    """The preflight check against a config.json (`config` plus what the IR always needs)."""
    cfg = ModelConfig.from_hf({"model_type": "llama", "vocab_size": 320, **config})
    check_recipe_against_model(recipe, cfg, **kwargs)


def write_recipe(directory: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def recipe_with(section: str) -> str:
    """MINIMAL plus one more section."""
    return MINIMAL + textwrap.dedent(section)


def assert_one_problem_has(err: RecipeError, *fragments: str) -> None:
    # All fragments on the same line: the path and the value must be reported together.
    assert any(all(f in line for f in fragments) for line in err.problems), (
        f"no single problem contains {fragments}:\n{err}"
    )


# (recipe text, fragments one problem line must contain)
BAD_RECIPES = [
    pytest.param(
        recipe_with("kv_cahce: {}"),
        ["recipe.yaml: kv_cahce: unknown field", "allowed: source, calibration, quantize"],
        id="unknown-top-level-key",
    ),
    pytest.param(
        recipe_with("kv_cache: {block_sise: 16}"),
        ["kv_cache.block_sise: unknown field", "allowed: dtype, block_size"],
        id="unknown-nested-key",
    ),
    pytest.param(
        recipe_with("kv_cache: {block_size: big}"),
        ["kv_cache.block_size:", "got 'big'"],
        id="block-size-wrong-type",
    ),
    pytest.param(
        recipe_with("quantize: [{method: rtn, bits: 5, group_size: 32}]"),
        ["recipe.yaml: quantize.0.bits: Input should be 4 or 8 (got 5)"],
        id="bits-5",
    ),
    pytest.param(
        recipe_with("quantize: [{method: rtn, bits: '4', group_size: 32}]"),
        ["quantize.0.bits:", "got '4'"],
        id="bits-as-string",
    ),
    pytest.param(
        recipe_with("quantize: [{method: rtn, bits: 4, group_size: 48}]"),
        ["quantize.0.group_size:", "32, 64, 128 or -1", "got 48"],
        id="group-size-48",
    ),
    pytest.param(
        "artifact: {name: tiny}\n",
        ["recipe.yaml: source: required field missing"],
        id="missing-source",
    ),
    pytest.param(
        "source: {path: ./ckpt, hub: org/name, revision: main}\nartifact: {name: tiny}\n",
        ["source:", "exactly one of `path`", "got {'path': './ckpt', 'hub': 'org/name'"],
        id="source-path-and-hub",
    ),
    pytest.param(
        "source: ./ckpt\nartifact: {name: tiny}\n",
        ["source:", "exactly one of `path`", "got './ckpt'"],
        id="source-not-a-mapping",
    ),
    pytest.param(
        "source: {hub: org/name}\nartifact: {name: tiny}\n",
        ["source.revision: required field missing"],
        id="hub-without-revision",
    ),
    pytest.param(
        "source: {hub: llama, revision: main}\nartifact: {name: tiny}\n",
        ["source.hub:", "got 'llama'"],
        id="hub-id-without-org",
    ),
    pytest.param(
        "source: {path: ./ckpt}\n",
        ["artifact: required field missing"],
        id="missing-artifact",
    ),
    pytest.param(
        "source: {path: ./ckpt}\nartifact: {name: My Model}\n",
        ["artifact.name:", "got 'My Model'", "^[a-z0-9]"],
        id="bad-artifact-name",
    ),
    pytest.param(
        recipe_with("quantize: [{method: hqq, bits: 4, group_size: 128}]"),
        ["quantize.0.method: unknown method", "got 'hqq'", "allowed: ", "gptq", "rtn"],
        id="unknown-method",
    ),
    pytest.param(
        recipe_with("quantize: [{bits: 4, group_size: 128}]"),
        ["quantize.0.method: required field missing", "allowed: rtn"],
        id="missing-method",
    ),
    pytest.param(
        recipe_with("quantize: [rtn]"),
        ["quantize.0:", "got 'rtn'"],
        id="quantize-entry-not-a-mapping",
    ),
    pytest.param(
        recipe_with("targets: [{engine: tensorrt, device: cuda}]"),
        ["targets.0.engine: unknown engine", "got 'tensorrt'", "allowed: onnxruntime"],
        id="unknown-engine",
    ),
    pytest.param(
        recipe_with("targets: [{engine: onnxruntime, device: cuda}]"),
        ["targets.0.device:", "'cpu'", "got 'cuda'"],
        id="onnxruntime-on-cuda",
    ),
    pytest.param(
        recipe_with("targets: [{engine: onnxruntime, intra_op_num_threads: -1}]"),
        ["targets.0.intra_op_num_threads:", "got -1"],
        id="negative-threads",
    ),
    pytest.param(
        recipe_with("targets: [{engine: onnxruntime}, {engine: onnxruntime}]"),
        ["targets:", "targets 0 and 1 are both onnxruntime on cpu"],
        id="duplicate-target",
    ),
    pytest.param(
        recipe_with("targets: []"),
        ["targets:", "at least 1 item", "got []"],
        id="empty-targets",
    ),
    pytest.param(
        recipe_with("export: {opset: 22}"),
        ["export.opset:", "23", "got 22"],
        id="opset-22",
    ),
    pytest.param(
        recipe_with("export: {max_seq_len: 8}"),
        ["export.max_seq_len:", "16", "got 8"],
        id="max-seq-len-8",
    ),
    pytest.param(
        recipe_with("export: {fused_attention: false}"),
        ["export.fused_attention:", "got False"],
        id="unfused-attention",
    ),
    pytest.param(
        recipe_with("kv_cache: {block_size: 24}"),
        ["kv_cache.block_size:", "16, 32", "got 24"],
        id="block-size-24",
    ),
    pytest.param(
        recipe_with("kv_cache: {block_size: 0}"),
        ["kv_cache.block_size:", "1, 2, 4", "got 0"],
        id="block-size-0",
    ),
    pytest.param(
        recipe_with("kv_cache: {dtype: int3}"),
        ["kv_cache.dtype:", "'fp32', 'fp16', 'int8' or 'fp8'", "got 'int3'"],
        id="kv-dtype-int3",
    ),
    pytest.param(
        recipe_with(
            "quantize: [{method: rtn, bits: 4, group_size: 32, ignore: [lm_head, 're:layers.(']}]"
        ),
        ["quantize.0.ignore.1: invalid regular expression", "got 're:layers.('"],
        id="bad-regex-in-ignore",
    ),
    pytest.param(
        recipe_with("quantize: [{method: rtn, bits: 4, group_size: 32, targets: []}]"),
        ["quantize.0.targets:", "at least 1 item"],
        id="empty-quantize-targets",
    ),
    pytest.param(
        recipe_with("quantize: [{method: rtn, bits: 4, group_size: 32, symmetric: 'yes'}]"),
        ["quantize.0.symmetric:", "got 'yes'"],
        id="symmetric-as-string",
    ),
    pytest.param(
        recipe_with("calibration: {dataset: wikitext, samples: 0}"),
        ["calibration.samples:", "greater than 0", "got 0"],
        id="calibration-samples-0",
    ),
    pytest.param(
        recipe_with("calibration: {dataset: wikitext, seq_len: 8}"),
        ["calibration.seq_len:", "16", "got 8"],
        id="calibration-seq-len-8",
    ),
    pytest.param(
        recipe_with("calibration: {samples: 16}"),
        ["calibration.dataset: required field missing"],
        id="calibration-without-dataset",
    ),
    pytest.param(
        recipe_with("trust_remote_code: true"),
        ["trust_remote_code: unknown field", "allowed: source"],
        id="trust-remote-code-top-level",
    ),
    pytest.param(
        "source: {path: ./ckpt, trust_remote_code: true}\nartifact: {name: tiny}\n",
        ["source.trust_remote_code: unknown field", "allowed: path"],
        id="trust-remote-code-in-source",
    ),
    pytest.param(
        "source: {path: ./ckpt\nartifact: {name: tiny}\n",
        ["recipe.yaml: not valid YAML: line 2"],
        id="yaml-syntax-error",
    ),
    pytest.param(
        "source: {path: ./ckpt}\nsource: {path: ./other}\nartifact: {name: tiny}\n",
        ["recipe.yaml: not valid YAML: line 2", "duplicate key 'source'"],
        id="yaml-duplicate-key",
    ),
    pytest.param(
        "- source: {path: ./ckpt}\n- artifact: {name: tiny}\n",
        ["recipe.yaml: a recipe must be a YAML mapping", "got a list"],
        id="yaml-list-not-mapping",
    ),
    pytest.param(
        "", ["recipe.yaml: a recipe must be a YAML mapping", "got empty"], id="empty-file"
    ),
]


@pytest.mark.parametrize(("text", "fragments"), BAD_RECIPES)
def test_bad_recipe_names_field_and_value(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write_recipe(tmp_path, text)
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert_one_problem_has(caught.value, *fragments)


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(RecipeError) as caught:
        load_recipe(missing)
    assert_one_problem_has(caught.value, str(missing), "no such recipe file")


def test_every_problem_is_reported_one_per_line(tmp_path: Path) -> None:
    text = """\
    source: {path: ./ckpt}
    quantize: [{method: rtn, bits: 5, group_size: 48}]
    kv_cache: {block_size: 24}
    artifact: {name: tiny}
    """
    with pytest.raises(RecipeError) as caught:
        load_recipe(write_recipe(tmp_path, text))
    problems = caught.value.problems
    assert len(problems) == 3
    assert str(caught.value).splitlines() == problems
    assert all(p.startswith(f"{tmp_path / 'recipe.yaml'}: ") for p in problems)


# -- checks against the source model's config.json ---------------------------------------------


def rtn(group_size: int = 32, **extra: object) -> dict:
    return {"method": "rtn", "bits": 4, "group_size": group_size, **extra}


def recipe_from(quantize: list[dict], **sections: dict) -> Recipe:
    data = {"source": {"path": "/ckpt"}, "artifact": {"name": "tiny"}, "quantize": quantize}
    return Recipe.model_validate({**data, **sections})


MODEL_MISMATCHES = [
    pytest.param(
        recipe_from([rtn(128)]),
        MODEL_CONFIG,
        [
            "quantize.0.group_size: 128 does not divide hidden_size 96 of the source model "
            "(use one of: 32, -1)"
        ],
        id="group-size-vs-hidden-size",
    ),
    pytest.param(
        recipe_from([rtn(64)]),
        {**MODEL_CONFIG, "hidden_size": 128, "intermediate_size": 96},
        ["quantize.0.group_size: 64 does not divide intermediate_size 96", "use one of: 32, -1"],
        id="group-size-vs-intermediate-size",
    ),
    pytest.param(
        recipe_from([rtn(64)]),
        {**MODEL_CONFIG, "hidden_size": 128, "num_attention_heads": 2, "head_dim": 80},
        ["quantize.0.group_size: 64 does not divide num_attention_heads * head_dim 160"],
        id="group-size-vs-explicit-head-dim",
    ),
    pytest.param(
        recipe_from([], export={"max_seq_len": 8192}),
        MODEL_CONFIG,
        ["export.max_seq_len: exceeds max_position_embeddings 4096", "got 8192", "<= 4096"],
        id="max-seq-len-beyond-positions",
    ),
    pytest.param(
        recipe_from([rtn(targets=["layers.0.atn.q_proj"])]),
        MODEL_CONFIG,
        ["quantize.0.targets.0: matches no module", "got 'layers.0.atn.q_proj'", "lm_head"],
        id="target-matches-no-module",
    ),
    pytest.param(
        recipe_from([rtn(targets=[r"re:layers\.7\..*"])]),
        MODEL_CONFIG,
        ["quantize.0.targets.0: matches no module", "re:layers"],
        id="regex-target-matches-no-module",
    ),
    pytest.param(
        recipe_from([rtn(ignore=["lm_haed"])]),
        MODEL_CONFIG,
        ["quantize.0.ignore.0: matches no module", "got 'lm_haed'"],
        id="ignore-matches-no-module",
    ),
    pytest.param(
        recipe_from([rtn(targets=["lm_head"], ignore=["lm_head"])]),
        MODEL_CONFIG,
        ["quantize.0: selects no module"],
        id="ignore-covers-targets",
    ),
    pytest.param(
        recipe_from([rtn(), rtn(targets=["layers.1.mlp.up_proj"], ignore=[])]),
        MODEL_CONFIG,
        ["quantize.1.targets:", "already selected by quantize.0", "layers.1.mlp.up_proj"],
        id="overlapping-quantize-entries",
    ),
]


@pytest.mark.parametrize(("recipe", "config", "fragments"), MODEL_MISMATCHES)
def test_recipe_that_does_not_fit_the_model(recipe: Recipe, config: dict, fragments) -> None:
    with pytest.raises(RecipeError) as caught:
        check(recipe, config)
    assert_one_problem_has(caught.value, *fragments)


def test_config_without_sizes_is_refused_naming_them() -> None:
    with pytest.raises(ConfigError, match="config.json lacks integer.*num_hidden_layers"):
        ModelConfig.from_hf({"model_type": "llama", "hidden_size": 96})


def test_model_check_passes_a_fitting_recipe() -> None:
    recipe = recipe_from(
        [rtn(32, ignore=["lm_head", "re:.*mlp.*"]), rtn(-1, bits=8, targets=["re:.*mlp.*"])]
    )
    assert check(recipe, MODEL_CONFIG) is None


def test_group_size_only_checked_against_selected_modules() -> None:
    # 64 divides the MLP input widths (256) but not hidden_size (96): fine if only down_proj.
    recipe = recipe_from([rtn(64, targets=[r"re:layers\.\d+\.mlp\.down_proj"], ignore=[])])
    check(recipe, MODEL_CONFIG)


def test_model_check_prefixes_recipe_file() -> None:
    with pytest.raises(RecipeError) as caught:
        check(recipe_from([rtn(128)]), MODEL_CONFIG, recipe_file="r.yaml")
    assert caught.value.problems[0].startswith("r.yaml: quantize.0.group_size: 128")


@pytest.mark.parametrize(
    ("name", "targets", "ignore", "selected"),
    [
        ("layers.0.attn.q_proj", ["layers.0.attn.q_proj"], [], True),
        ("layers.0.attn.q_proj", ["layers.0.attn"], [], False),  # exact names are not prefixes
        ("layers.0.attn.q_proj", ["re:.*q_proj"], [], True),
        ("layers.10.attn.q_proj", [r"re:layers\.1\..*"], [], False),  # regexes match whole names
        ("layers.0.attn.q_proj", ["re:.*"], ["re:.*attn.*"], False),  # ignore wins
        ("lm_head", ["re:.*"], ["lm_head"], False),
        ("embed_tokens", ["re:.*"], ["lm_head"], True),
    ],
)
def test_module_selected(name: str, targets: list[str], ignore: list[str], selected: bool) -> None:
    assert module_selected(name, targets, ignore) is selected


# -- good recipes --------------------------------------------------------------------------------


def test_minimal_recipe_gets_defaults(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, MINIMAL))
    assert recipe.calibration is None
    assert recipe.quantize == []
    assert recipe.kv_cache == KvCache(dtype="fp32", block_size=16)
    assert (recipe.export.opset, recipe.export.max_seq_len) == (23, 2048)
    assert recipe.export.fused_attention is True
    assert recipe.targets == [OnnxRuntimeTarget(engine="onnxruntime")]
    assert recipe.targets[0].optimization_level == "extended"
    assert (recipe.artifact.name, recipe.artifact.version) == ("tiny", "0.1.0")


def test_full_recipe_loads(tmp_path: Path) -> None:
    text = """\
    source: {hub: meta-llama/Llama-3.2-1B, revision: 4e20de362430cd3b72f300e6b0f18e50e7166e08}
    calibration: {dataset: wikitext, split: validation, samples: 64, seq_len: 256, seed: 3}
    quantize:
      - {method: rtn, bits: 4, group_size: 128, symmetric: false, ignore: [lm_head, embed_tokens]}
    kv_cache: {dtype: fp16, block_size: 32}
    export: {max_seq_len: 4096}
    targets: [{engine: onnxruntime, optimization_level: basic, intra_op_num_threads: 4}]
    artifact: {name: llama-3.2-1b-rtn4, version: "1.2.0"}
    """
    recipe = load_recipe(write_recipe(tmp_path, text))
    assert recipe.source == HubSource(
        hub="meta-llama/Llama-3.2-1B", revision="4e20de362430cd3b72f300e6b0f18e50e7166e08"
    )
    assert recipe.calibration is not None and recipe.calibration.text_field == "text"
    assert recipe.quantize[0].targets == ["re:.*"]
    assert recipe.quantize[0].symmetric is False
    assert recipe.targets[0].intra_op_num_threads == 4


def test_relative_source_path_resolves_against_recipe_dir(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, MINIMAL.replace("./ckpt", "../models/ckpt"), "recipes/r.yaml")
    recipe = load_recipe(path)
    assert recipe.source == LocalSource(path=str(tmp_path / "models" / "ckpt"))
    assert isinstance(recipe.source.path, str)


def test_absolute_source_path_is_kept(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, MINIMAL.replace("./ckpt", "/data/ckpt")))
    assert recipe.source == LocalSource(path="/data/ckpt")


def test_stage_slice(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, MINIMAL))
    assert set(recipe.stage_slice("source")) == {"source"}
    assert recipe.stage_slice("quantize") == {"quantize": []}
    assert recipe.stage_slice("export") == {
        "export": {"opset": 23, "max_seq_len": 2048, "fused_attention": True, "dtype": "fp32"},
        "kv_cache": {"dtype": "fp32", "block_size": 16},
    }
    assert recipe.stage_slice("engine")["targets"][0]["engine"] == "onnxruntime"
    package = {
        "artifact": {
            "name": "tiny",
            "version": "0.1.0",
            "sign": None,
            "portable": False,
            "chat_template": None,
        }
    }
    assert recipe.stage_slice("package") == package
    for stage in STAGES:
        json.dumps(recipe.stage_slice(stage))  # cache keys hash the JSON form
    with pytest.raises(ValueError, match="unknown stage 'lint'"):
        recipe.stage_slice("lint")


def test_stage_slice_changes_only_with_its_sections(tmp_path: Path) -> None:
    base = load_recipe(write_recipe(tmp_path, MINIMAL, "a.yaml"))
    changed = load_recipe(
        write_recipe(tmp_path, recipe_with("kv_cache: {block_size: 32}"), "b.yaml")
    )
    assert base.stage_slice("export") != changed.stage_slice("export")
    for stage in ("source", "quantize", "engine", "package"):
        assert base.stage_slice(stage) == changed.stage_slice(stage)


def test_recipe_is_immutable(tmp_path: Path) -> None:
    # Stage cache keys are computed from the recipe; nothing may change it after loading.
    recipe = load_recipe(write_recipe(tmp_path, MINIMAL))
    with pytest.raises(ValueError, match="frozen"):
        recipe.artifact.name = "other"  # type: ignore[misc]
