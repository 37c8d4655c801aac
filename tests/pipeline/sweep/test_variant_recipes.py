"""Each variant written as a full recipe under DIR/recipes/, its relative paths rewritten so it
builds from anywhere, and checked before any build: an invalid one keeps its one-line reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ingot.pipeline.stages.prepare import prepare
from ingot.pipeline.sweep.errors import SweepError
from ingot.pipeline.sweep.recipes import write_variants
from ingot.pipeline.sweep.variants import Variant

from fixtures import CHAT_TEMPLATE, make_checkpoint, write_recipe

TEXT = " ".join(f"def f{i}(a, b):\n    return a * {i} + b" for i in range(40))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A recipe naming its checkpoint, evaluation text, calibration text and chat template
    relative to itself."""
    root = tmp_path_factory.mktemp("base")
    make_checkpoint(root / "ckpt")
    (root / "data").mkdir()
    (root / "data" / "eval.txt").write_text(TEXT)
    (root / "template.jinja").write_text(CHAT_TEMPLATE)
    recipe = write_recipe(
        root / "base.yaml",
        Path("ckpt"),
        evaluate={"perplexity": {"dataset": "data/eval.txt", "seq_len": 16, "max_windows": 2}},
        calibration={"dataset": "data/eval.txt", "samples": 2, "seq_len": 16},
        artifact={"name": "tiny", "chat_template": "template.jinja"},
    )
    return recipe


def test_variants_build_from_their_own_directory(base, tmp_path, monkeypatch):
    variants = [Variant("g64", {"quantize.0.group_size": 64, "kv_cache.dtype": "int8"})]
    (written,) = write_variants(base, variants, tmp_path / "sweep")
    assert written.error is None and written.path == tmp_path / "sweep" / "recipes" / "g64.yaml"
    data = yaml.safe_load(written.path.read_text())
    root = base.parent
    assert data["source"]["path"] == str(root / "ckpt")
    assert data["evaluate"]["perplexity"]["dataset"] == str(root / "data" / "eval.txt")
    assert data["calibration"]["dataset"] == str(root / "data" / "eval.txt")
    assert data["artifact"]["chat_template"] == str(root / "template.jinja")
    assert data["quantize"][0]["group_size"] == 64 and data["kv_cache"]["dtype"] == "int8"
    assert written.path.read_text().startswith("# ingot sweep: variant g64 of base.yaml")
    monkeypatch.chdir(tmp_path)  # from elsewhere, the written file still finds everything
    assert prepare(written.path).evaluation.windows.shape == (2, 16)
    assert (written.seq_len, written.max_windows) == (16, 2)
    assert written.tokenizer == root / "ckpt" / "tokenizer.json"


def test_an_invalid_variant_is_listed_with_its_reason(base, tmp_path):
    variants = [
        Variant("ok", {"quantize.0.group_size": 32}),
        Variant("g128", {"quantize.0.group_size": 128}),  # does not divide the hidden 64
        Variant("bits3", {"quantize.0.bits": 3}),
        Variant("second", {"quantize.1.bits": 8}),
    ]
    ok, g128, bits3, second = write_variants(base, variants, tmp_path / "sweep")
    assert ok.error is None
    assert g128.error.startswith("quantize.0.group_size: 128 does not divide")
    assert bits3.error.startswith("quantize.0.bits:") and "\n" not in bits3.error
    assert str(bits3.path) not in bits3.error  # the row names the recipe; its reason need not
    assert second.error == "quantize.1: the recipe's list has 1 entries"
    assert g128.path.is_file() and not second.path.exists()


def test_a_base_recipe_without_perplexity_is_refused(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "ckpt")
    with pytest.raises(SweepError, match=r"r.yaml: evaluate.perplexity: required by ingot sweep"):
        write_variants(recipe, [Variant("a", {})], tmp_path / "out")
