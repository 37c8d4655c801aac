"""What `ingot plan` says of a KV cache dtype: bytes per token, the calibrate stage an int8 /
fp8 cache needs even for RTN, and the scales' pass in the export stage."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_recipe_kv_cache import CALIBRATION, load

from ingot.pipeline.plan import plan_build

from fixtures import BASE

REPO = Path(__file__).resolve().parents[2]

CONFIG = {"model_type": "llama", **BASE}  # 2 layers, 2 KV heads, head_dim 16


@pytest.mark.parametrize(("dtype", "per_token"), [("fp32", 512), ("fp16", 256), ("int8", 128)])
def test_plan_reports_kv_bytes_per_token(tmp_path, dtype, per_token):
    extra = CALIBRATION if dtype == "int8" else ""
    recipe = load(tmp_path, f"{{dtype: {dtype}}}", extra)
    plan = plan_build(recipe, tmp_path / "recipe.yaml", CONFIG, None)
    # 2 layers x 2 KV heads x 16 dims, K and V, at the dtype's bytes
    assert plan.model["kv_cache"] == {"dtype": dtype, "bytes_per_token": per_token}


def test_plan_calibrates_for_quantized_kv_even_when_rtn(tmp_path):
    fp8 = plan_build(load(tmp_path, "{dtype: fp8}", CALIBRATION), tmp_path / "r", CONFIG, None)
    fp16 = plan_build(load(tmp_path, "{dtype: fp16}", CALIBRATION), tmp_path / "r", CONFIG, None)
    stages = [s.stage for s in fp8.stages]
    assert stages[:4] == ["source", "calibrate", "quantize", "export"]
    assert "calibrate" not in [s.stage for s in fp16.stages]  # RTN, float KV: no windows
    export = {s.stage: s for s in fp8.stages}["export"]
    plain = {s.stage: s for s in fp16.stages}["export"]
    assert "fp8 KV scales on 1024 calibration tokens" in export.notes
    assert export.seconds > plain.seconds


def test_ingot_plan_prints_the_kv_bytes_per_token(tmp_path):
    import yaml
    from click.testing import CliRunner

    from ingot.cli import main

    demo = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    demo["source"]["path"] = str(REPO / "recipes" / "demo" / "pydoc-tiny")
    demo["artifact"]["chat_template"] = str(REPO / "recipes" / "demo" / "chat_template.jinja")
    demo["kv_cache"]["dtype"] = "int8"
    demo["calibration"] = {"dataset": str(REPO / "recipes" / "demo" / "pydoc-heldin.txt")}
    recipe = tmp_path / "demo.yaml"
    recipe.write_text(yaml.safe_dump(demo))
    result = CliRunner().invoke(main, ["plan", "--recipe", str(recipe)])
    assert result.exit_code == 0, result.output
    # pydoc-tiny: 4 layers x 2 KV heads x head_dim 64, K and V, one byte each
    assert "KV cache int8 1024 bytes/token" in result.output.splitlines()[0]
