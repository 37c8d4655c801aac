"""`ingot plan`: estimates per stage from the recipe and config.json, before any work."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from ingot.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_plan_prints_every_stage_with_memory_and_time():
    result = CliRunner().invoke(main, ["plan", "--recipe", str(REPO / "recipes/demo-gptq.yaml")])
    assert result.exit_code == 0, result.output
    for stage in ("source", "calibrate", "quantize", "export", "engine:onnxruntime-cpu"):
        assert stage in result.output
    assert "gptq layer by layer" in result.output and "peak" in result.output


def test_plan_json_is_consistent_and_scales_with_the_recipe(tmp_path):
    base = REPO / "recipes/demo-awq.yaml"
    result = CliRunner().invoke(main, ["plan", "--recipe", str(base), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    stages = {s["stage"]: s for s in plan["stages"]}
    assert plan["peak_bytes"] == max(s["peak_bytes"] for s in plan["stages"])
    assert plan["model"]["layers"] == 4 and plan["constants"]["flops_per_second"] > 0
    # Twice the calibration tokens: more activation memory and more time, same model.
    bigger = tmp_path / "demo" / "bigger.yaml"
    bigger.parent.mkdir()
    text = base.read_text().replace("samples: 64", "samples: 128")
    bigger.write_text(text.replace("demo/", str(REPO / "recipes" / "demo") + "/"))
    doubled = json.loads(
        CliRunner().invoke(main, ["plan", "--recipe", str(bigger), "--json"]).output
    )
    quantize = {s["stage"]: s for s in doubled["stages"]}["quantize"]
    assert quantize["peak_bytes"] > stages["quantize"]["peak_bytes"]
    assert quantize["seconds"] > stages["quantize"]["seconds"]


def test_plan_refuses_a_bad_recipe(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {path: x}\nquantize: [{method: gptq, bits: 4, group_size: 32}]\n")
    result = CliRunner().invoke(main, ["plan", "--recipe", str(bad)])
    assert result.exit_code == 1 and "artifact" in result.output
