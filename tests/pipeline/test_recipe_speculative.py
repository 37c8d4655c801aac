"""The `speculative` section: one member per method, errors naming the field, the draft's
path resolved like the source's, its quantize list inherited from the target's when omitted."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from ingot.pipeline.recipe import (
    DraftModelSpeculative,
    NgramSpeculative,
    RecipeError,
    load_recipe,
)

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """\
source: {path: ./ckpt}
artifact: {name: tiny}
quantize: [{method: rtn, bits: 4, group_size: 32}]
"""


def load(tmp_path: Path, speculative: str, extra: str = "") -> object:
    path = tmp_path / "recipes" / "r.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MINIMAL + extra + textwrap.dedent(speculative))
    return load_recipe(path)


BAD = [
    pytest.param(
        "speculative: {method: mtp, num_speculative_tokens: 4}",
        [
            "speculative.method: unknown method",
            "got 'mtp'",
            "allowed: ngram, draft_model, medusa, eagle",
        ],
        id="unknown-method",
    ),
    pytest.param(
        "speculative: {method: medusa, num_speculative_tokens: 4}",
        ["speculative.heads: required field missing"],
        id="medusa-without-heads",
    ),
    pytest.param(
        "speculative: {num_speculative_tokens: 4}",
        ["speculative.method: required field missing", "allowed: ngram, draft_model"],
        id="no-method",
    ),
    pytest.param(
        "speculative: {method: ngram}",
        ["speculative.num_speculative_tokens: required field missing"],
        id="no-token-count",
    ),
    pytest.param(
        "speculative: {method: ngram, num_speculative_tokens: 0}",
        ["speculative.num_speculative_tokens:", "greater than or equal to 1", "got 0"],
        id="zero-tokens",
    ),
    pytest.param(
        "speculative: {method: ngram, num_speculative_tokens: 17}",
        ["speculative.num_speculative_tokens:", "less than or equal to 16", "got 17"],
        id="too-many-tokens",
    ),
    pytest.param(
        "speculative: {method: ngram, num_speculative_tokens: '4'}",
        ["speculative.num_speculative_tokens:", "got '4'"],
        id="strict-int",
    ),
    pytest.param(
        "speculative: {method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 5}",
        ["speculative.prompt_lookup_max: below prompt_lookup_min", "got 4", "allowed: >= 5"],
        id="min-above-default-max",
    ),
    pytest.param(
        "speculative: {method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 0}",
        ["speculative.prompt_lookup_min:", "got 0"],
        id="min-zero",
    ),
    pytest.param(
        "speculative: {method: ngram, num_speculative_tokens: 4, draft: {source: {path: d}}}",
        ["speculative.draft: unknown field for method ngram", "allowed: method"],
        id="draft-under-ngram",
    ),
    pytest.param(
        "speculative: {method: draft_model, num_speculative_tokens: 4}",
        ["speculative.draft: required field missing"],
        id="draft-model-without-draft",
    ),
    pytest.param(
        """\
        speculative:
          method: draft_model
          num_speculative_tokens: 4
          prompt_lookup_max: 3
          draft: {source: {path: d}}
        """,
        ["speculative.prompt_lookup_max: unknown field for method draft_model"],
        id="lookup-under-draft-model",
    ),
    pytest.param(
        "speculative: {method: draft_model, num_speculative_tokens: 4, draft: {source: {}}}",
        ["speculative.draft.source: needs exactly one of `path`"],
        id="draft-source-kind",
    ),
    pytest.param(
        """\
        speculative:
          method: draft_model
          num_speculative_tokens: 4
          draft:
            source: {path: d}
            quantize: [{method: rtn, bits: 3, group_size: 32}]
        """,
        ["speculative.draft.quantize.0.bits:", "got 3"],
        id="draft-quantize-entry",
    ),
    pytest.param(
        """\
        speculative:
          method: draft_model
          num_speculative_tokens: 4
          draft:
            source: {path: d}
            quantize: [{method: gptq, bits: 4, group_size: 32}]
        """,
        ["calibration: required field missing", "speculative.draft.quantize.0 (method gptq)"],
        id="draft-gptq-needs-calibration",
    ),
]


@pytest.mark.parametrize(("speculative", "fragments"), BAD)
def test_bad_speculative_section_names_the_field(tmp_path, speculative, fragments):
    with pytest.raises(RecipeError) as err:
        load(tmp_path, speculative)
    assert any(all(f in line for f in fragments) for line in err.value.problems), err.value


def test_ngram_defaults(tmp_path):
    recipe = load(tmp_path, "speculative: {method: ngram, num_speculative_tokens: 4}")
    assert recipe.speculative == NgramSpeculative(
        method="ngram", num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=4
    )
    assert recipe.draft() is None
    assert list(recipe.quantize_lists()) == ["quantize"]


def test_draft_path_is_resolved_and_quantize_inherited(tmp_path):
    section = """\
    speculative:
      method: draft_model
      num_speculative_tokens: 2
      draft: {source: {path: ../models/draft}}
    """
    recipe = load(tmp_path, section)
    assert isinstance(recipe.speculative, DraftModelSpeculative)
    assert recipe.draft().source.path == str(tmp_path / "models" / "draft")
    assert recipe.draft_quantize() == recipe.quantize  # omitted: the target's list
    own = load(tmp_path, section.replace("path: ../models/draft}", "path: d}, quantize: []"))
    assert own.draft_quantize() == []  # []: a float draft
    assert list(own.quantize_lists()) == ["quantize", "speculative.draft.quantize"]


def test_speculative_is_in_no_target_stage_slice(tmp_path):
    plain = load(tmp_path, "")
    ngram = load(tmp_path, "speculative: {method: ngram, num_speculative_tokens: 4}")
    for stage in ("source", "calibrate", "quantize", "export", "engine", "package"):
        assert plain.stage_slice(stage) == ngram.stage_slice(stage)


def test_demo_speculative_recipe_is_demo_with_ngram():
    demo = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    speculative = yaml.safe_load((REPO / "recipes" / "demo-speculative.yaml").read_text())
    assert speculative.pop("speculative")["method"] == "ngram"
    assert speculative.pop("artifact")["name"] == "demo-speculative"
    demo.pop("artifact")
    assert speculative == demo  # the same stages: a build after demo.yaml's is all cached
    recipe = load_recipe(REPO / "recipes" / "demo-speculative.yaml")
    assert recipe.speculative.num_speculative_tokens == 4
