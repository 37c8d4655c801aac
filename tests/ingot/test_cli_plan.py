"""`ingot plan`: estimates per stage from the recipe and config.json, before any work."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingot.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_plan_prints_every_stage_with_memory_and_time():
    result = CliRunner().invoke(main, ["plan", "--recipe", str(REPO / "recipes/demo-gptq.yaml")])
    assert result.exit_code == 0, result.output
    for stage in ("source", "calibrate", "quantize", "export", "engine:onnxruntime-cpu"):
        assert stage in result.output
    assert "gptq layer by layer" in result.output and "peak" in result.output


def test_plan_lists_the_medusa_heads_stage_and_its_training(tmp_path):
    base = REPO / "recipes/demo-medusa.yaml"
    out = CliRunner().invoke(main, ["plan", "--recipe", str(base), "--json"]).output
    stages = {s["stage"]: s for s in json.loads(out)["stages"]}
    assert "calibrate" in stages  # the heads' training windows (RTN reads none)
    heads = stages["heads"]
    assert "600 steps over 64 x 256 hidden states" in heads["notes"]
    longer = tmp_path / "demo" / "longer.yaml"
    longer.parent.mkdir()
    text = base.read_text().replace("steps: 600", "steps: 1200")
    longer.write_text(text.replace("demo/", str(REPO / "recipes" / "demo") + "/"))
    out = CliRunner().invoke(main, ["plan", "--recipe", str(longer), "--json"]).output
    doubled = {s["stage"]: s for s in json.loads(out)["stages"]}["heads"]
    assert doubled["seconds"] > 1.5 * heads["seconds"]


def test_plan_lists_the_eagle_stage_and_its_training(tmp_path):
    base = REPO / "recipes/demo-eagle.yaml"
    out = CliRunner().invoke(main, ["plan", "--recipe", str(base), "--json"]).output
    stages = {s["stage"]: s for s in json.loads(out)["stages"]}
    assert "calibrate" in stages and "heads" not in stages  # the draft's training windows
    eagle = stages["eagle"]
    assert "400 steps x 3 drafts over 64 x 256" in eagle["notes"]
    attached = tmp_path / "demo" / "attached.yaml"
    attached.parent.mkdir()
    text = base.read_text().replace("demo/", str(REPO / "recipes" / "demo") + "/")
    train = text[text.index("    train:") : text.index("artifact:")]
    attached.write_text(text.replace(train, "    attach: eagle3\n"))
    out = CliRunner().invoke(main, ["plan", "--recipe", str(attached), "--json"]).output
    loaded = {s["stage"]: s for s in json.loads(out)["stages"]}["eagle"]
    assert loaded["notes"] == "attach" and loaded["seconds"] < eagle["seconds"] / 10


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


def test_int8_activations_add_the_exact_checks_time_to_the_engine_stage(tmp_path):
    # demo.yaml builds at level 4 (checked exactly at level 0 first); the same at level 0 not.
    base = REPO / "recipes/demo.yaml"
    text = base.read_text().replace("demo/", str(REPO / "recipes" / "demo") + "/")
    assert "matmul_accuracy_level: 4" in text
    seconds = {}
    for level in (4, 0):
        recipe = tmp_path / f"level{level}.yaml"
        level_text = text.replace("matmul_accuracy_level: 4", f"matmul_accuracy_level: {level}")
        recipe.write_text(level_text)
        out = CliRunner().invoke(main, ["plan", "--recipe", str(recipe), "--json"]).output
        engine = {s["stage"]: s for s in json.loads(out)["stages"]}["engine:onnxruntime-cpu"]
        seconds[level] = engine["seconds"]
    factor = json.loads(out)["constants"]["exact_check_factor"]
    assert seconds[4] == pytest.approx(seconds[0] * (1 + factor))


def test_plan_refuses_a_bad_recipe(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {path: x}\nquantize: [{method: gptq, bits: 4, group_size: 32}]\n")
    result = CliRunner().invoke(main, ["plan", "--recipe", str(bad)])
    assert result.exit_code == 1 and "artifact" in result.output


# --- the 70B recipe, planned offline from its vendored config.json (what CI runs) -------------

LLAMA70B = REPO / "recipes" / "llama70b-awq.yaml"
LLAMA70B_CONFIG = REPO / "recipes" / "llama70b" / "config.json"


def test_the_70b_plan_runs_offline(tmp_path):
    """`ingot plan --recipe recipes/llama70b-awq.yaml --config recipes/llama70b/config.json
    --json`, in a fresh process with HF_HUB_OFFLINE=1, the hub at a closed local port and an
    empty HF cache: it never needs the network."""
    with socket.socket() as closed:  # bound, never listening: a connection is refused
        closed.bind(("127.0.0.1", 0))
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_ENDPOINT": f"http://127.0.0.1:{closed.getsockname()[1]}",
            "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
            "INGOT_CACHE_DIR": str(tmp_path / "cache"),
        }
        code = "from ingot.cli import main; main()"
        args = ["plan", "--recipe", "recipes/llama70b-awq.yaml"]
        args += ["--config", "recipes/llama70b/config.json", "--json"]
        result = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    model = plan["model"]
    assert (model["layers"], model["hidden_size"]) == (80, 8192)
    assert 70.5e9 < model["params"] < 70.6e9
    assert model["weights_bytes_on_disk"] == model["params"] * 2  # bf16, not downloaded
    stages = [s["stage"] for s in plan["stages"]]
    assert stages[:3] == ["source", "calibrate", "quantize"]
    assert "engine:onnxruntime-cpu" in stages
    assert "awq" in plan["stages"][2]["notes"]
    disk = plan["disk_bytes"]
    assert disk["hub_download"] == model["weights_bytes_on_disk"]
    assert disk["artifact"] < disk["stage_cache"]
    resources = {n["resource"] for n in plan["resources"]["needs"]}
    assert resources == {"host RAM", "GPU memory", "disk"}  # it calibrates on cuda


def test_the_vendored_70b_config_is_llama_3_1_70b_and_the_recipe_checks_against_it():
    from ingot.pipeline.model.config import ModelConfig
    from ingot.pipeline.preflight import check_recipe_against_model
    from ingot.pipeline.recipe import load_recipe

    config = json.loads(LLAMA70B_CONFIG.read_text())
    expected = {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "torch_dtype": "bfloat16",
    }
    assert {k: config.get(k) for k in expected} == expected
    assert config["rope_scaling"] == {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }
    recipe = load_recipe(LLAMA70B)
    assert recipe.source.hub == "meta-llama/Llama-3.1-70B-Instruct"
    assert re.fullmatch(r"[0-9a-f]{40}", recipe.source.revision)  # a commit, never a branch
    (entry,) = recipe.quantize
    assert (entry.method, entry.bits, entry.group_size) == ("awq", 4, 128)
    assert (recipe.calibration.samples, recipe.calibration.seq_len) == (64, 512)
    assert recipe.kv_cache.dtype == "fp16"
    check_recipe_against_model(recipe, ModelConfig.from_hf(config))  # raises on a problem


def test_plan_names_the_resource_that_runs_out(tmp_path, monkeypatch):
    from ingot.pipeline import resources

    monkeypatch.setattr(resources, "host_memory_available", lambda: (2 << 30, ""))
    args = ["plan", "--recipe", str(LLAMA70B), "--config", str(LLAMA70B_CONFIG)]
    args += ["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    table, _, below = result.output.partition("resources on this machine:")
    assert "engine:onnxruntime-cpu" in table and "peak" in table  # after the per-stage table
    ram = next(line for line in below.splitlines() if "host RAM" in line)
    assert "needs" in ram and "at engine:onnxruntime-cpu" in ram and "2.0 GiB available" in ram
    assert ram.endswith("this build does not fit this machine")
    assert f"disk at {tmp_path / 'cache'}, {tmp_path / 'out'}" in below
    assert "host RAM" in below.strip().splitlines()[-1]  # the verdict names what runs out


def test_the_70b_plan_fits_one_gpu_node():
    # The bound for recipes/llama70b-awq.yaml: host peak <= 64 GiB, GPU <= 80 GB.
    args = ["plan", "--recipe", str(LLAMA70B), "--config", str(LLAMA70B_CONFIG), "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["peak_bytes"] <= 64 * 2**30, plan["peak_stage"]
    quantize = next(s for s in plan["stages"] if s["stage"] == "quantize")
    assert 0 < quantize["gpu_bytes"] <= 80e9
    assert all(s["gpu_bytes"] == 0 for s in plan["stages"] if s["stage"] != "quantize")


def test_plan_of_a_small_recipe_fits(tmp_path, monkeypatch):
    from ingot.pipeline import resources

    monkeypatch.setattr(resources, "host_memory_available", lambda: (64 << 30, ""))
    monkeypatch.setattr(resources, "disk_free", lambda d: resources.DiskSpace(1 << 40, 1, Path(d)))
    args = ["plan", "--recipe", str(REPO / "recipes/demo.yaml"), "--json"]
    result = CliRunner().invoke(main, [*args, "--cache-dir", str(tmp_path)])
    plan = json.loads(result.output)
    assert plan["resources"]["fits"] is True
    (disk,) = [n for n in plan["resources"]["needs"] if n["resource"] == "disk"]
    assert (
        disk["needed_bytes"] == plan["disk_bytes"]["stage_cache"] + plan["disk_bytes"]["artifact"]
    )
