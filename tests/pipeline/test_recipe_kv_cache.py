"""kv_cache.dtype int8 / fp8: accepted with calibration data (their per-head scales are
measured on it), refused without it in one line naming the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ingot.pipeline.recipe import RecipeError, load_recipe

CALIBRATION = "calibration: {dataset: calib.txt, samples: 16, seq_len: 64}\n"


def load(tmp_path: Path, kv_cache: str, extra: str = "", quantize: str = "[]"):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        textwrap.dedent(f"""\
            source: {{path: ckpt}}
            quantize: {quantize}
            kv_cache: {kv_cache}
            artifact: {{name: kv}}
            """)
        + extra
    )
    return load_recipe(path)


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_quantized_kv_cache_with_calibration(tmp_path, dtype):
    recipe = load(tmp_path, f"{{dtype: {dtype}}}", CALIBRATION)
    assert recipe.kv_cache.dtype == dtype and recipe.kv_cache.quantized
    assert not load(tmp_path, "{dtype: fp16}").kv_cache.quantized


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_quantized_kv_cache_needs_calibration(tmp_path, dtype):
    with pytest.raises(RecipeError) as err:
        load(tmp_path, f"{{dtype: {dtype}, block_size: 8}}")
    [line] = err.value.problems
    assert line == (
        f"{tmp_path / 'recipe.yaml'}: kv_cache.dtype: {dtype} needs calibration data for its "
        "per-head K/V scales (add a `calibration:` section with dataset, samples, seq_len, "
        "or use fp16)"
    )
