"""The axes file: parsing, one-line errors naming the field, the product and a listed subset,
variant names, and setting dotted paths in a recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingot.pipeline.sweep.axes import load_axes
from ingot.pipeline.sweep.errors import SweepError
from ingot.pipeline.sweep.variants import VariantPathError, expand, set_path


def _axes(tmp_path: Path, text: str):
    path = tmp_path / "axes.yaml"
    path.write_text(text)
    return load_axes(path)


PRODUCT = """
axes:
  quantize.0.method: [rtn, gptq]
  quantize.0.group_size: [32, 64, 128]
  speculative: [null, {method: ngram}]
ood_text: other.txt
"""


def test_the_product_in_order_with_unique_safe_names(tmp_path):
    variants = expand(_axes(tmp_path, PRODUCT))
    assert len(variants) == 2 * 3 * 2
    assert variants[0].values == {
        "quantize.0.method": "rtn",
        "quantize.0.group_size": 32,
        "speculative": None,
    }
    assert variants[1].values["speculative"] == {"method": "ngram"}  # the last axis is fastest
    names = [v.name for v in variants]
    assert names[:2] == ["rtn_group_size32_no-speculative", "rtn_group_size32_ngram"]
    assert len(set(names)) == len(names)
    assert all(n.replace("_", "").replace("-", "").replace(".", "").isalnum() for n in names)


def test_names_show_what_differs(tmp_path):
    axes = _axes(
        tmp_path,
        """
axes:
  calibration: [{dataset: calib.txt, samples: 8}]   # one value: not in the names
  quantize.0:
    - {method: rtn, bits: 4, group_size: 32}
    - {method: gptq, bits: 4, group_size: 32}
    - {method: gptq, bits: 8, group_size: 32}
  export.max_seq_len: [128]
ood_text: o.txt
""",
    )
    assert [v.name for v in expand(axes)] == ["rtn-bits4", "gptq-bits4", "gptq-bits8"]


def test_colliding_names_get_a_suffix(tmp_path):
    axes = _axes(tmp_path, "axes:\n  artifact.name: ['a b', 'a/b', a-b]\nood_text: o.txt\n")
    assert [v.name for v in expand(axes)] == ["a-b", "a-b-2", "a-b-3"]


def test_a_listed_subset_instead_of_the_product(tmp_path):
    axes = _axes(
        tmp_path,
        PRODUCT
        + """variants:
  - {quantize.0.method: gptq, quantize.0.group_size: 128, speculative: {method: ngram}}
  - {quantize.0.method: rtn, quantize.0.group_size: 32, speculative: null}
""",
    )
    assert [v.name for v in expand(axes)] == [
        "gptq_group_size128_ngram",
        "rtn_group_size32_no-speculative",
    ]
    assert axes.speed.rounds == 3 and axes.ood_text == "other.txt"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("axes: {a.b: [1]}\n", "ood_text: required field missing"),
        ("axes: {a.b: [1]}\nood_text: o\nspeed: {rounds: 0}\n", "speed.rounds: Input should"),
        ("axes: {a.b: [1]}\nood_text: o\nsped: {}\n", "sped: unknown field"),
        ("axes: {a.b: 1}\nood_text: o\n", "axes.a.b: Input should be a valid list"),
        ("axes: {a.b: []}\nood_text: o\n", "axes.a.b: no values"),
        ("axes: {a.b: [1, 1]}\nood_text: o\n", "axes.a.b: a value is listed twice"),
        ("axes: {'a..b': [1]}\nood_text: o\n", "axes.a..b: not a dotted recipe path"),
        ("axes: {a: [1]}\nood_text: o\nvariants: [{a: 2}]\n", "variants.0.a: 2 is not one"),
        ("axes: {a: [1]}\nood_text: o\nvariants: [{b: 1, a: 1}]\n", "variants.0.b: not an axis"),
        ("axes: {a: [1], b: [2]}\nood_text: o\nvariants: [{a: 1}]\n", "no value for the axis b"),
        ("axes: {a: [1]}\nood_text: o\nvariants: [{a: 1}, {a: 1}]\n", "the same combination"),
        ("axes: {a: [1]}\naxes: {b: [1]}\nood_text: o\n", "duplicate key 'axes'"),
        ("- a\n", "a mapping with an `axes:` section"),
    ],
)
def test_errors_are_one_line_naming_the_field(tmp_path, text, message):
    with pytest.raises(SweepError) as error:
        _axes(tmp_path, text)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(tmp_path / "axes.yaml") in str(error.value)


def test_set_path_into_lists_mappings_and_default_sections():
    data = {"quantize": [{"method": "rtn", "bits": 4}], "artifact": {"name": "x"}}
    defaults = {"targets": [{"engine": "onnxruntime", "device": "cpu"}], "speculative": None}
    set_path(data, "quantize.0.bits", 8, defaults)
    set_path(data, "targets.0.matmul_accuracy_level", 0, defaults)
    set_path(data, "speculative", {"method": "ngram"}, defaults)
    set_path(data, "speculative.num_speculative_tokens", 3, defaults)
    assert data["quantize"] == [{"method": "rtn", "bits": 8}]
    assert data["targets"] == [
        {"engine": "onnxruntime", "device": "cpu", "matmul_accuracy_level": 0}
    ]
    assert data["speculative"] == {"method": "ngram", "num_speculative_tokens": 3}
    assert defaults["targets"][0] == {"engine": "onnxruntime", "device": "cpu"}  # a copy
    with pytest.raises(VariantPathError, match="quantize.1: the recipe's list has 1 entries"):
        set_path(data, "quantize.1.bits", 8, defaults)
    with pytest.raises(VariantPathError, match="artifact.name.x: the recipe has no mapping"):
        set_path(data, "artifact.name.x", 1, defaults)
