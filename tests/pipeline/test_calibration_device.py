"""`calibration.device` and `calibration.offload`, on the CPU: the recipe fields validate, `auto`
resolves by what torch sees, a CUDA device the host lacks fails in one line before any work, the
resolved device reaches the quantize stage (the calibrate stage's output and key slice carry
it), and `offload: disk` puts every activation store on disk without changing a bit of the IR.

The CUDA path itself is tested by test_calibration_cuda.py (marked gpu)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from ingot.calibration.activations import ActivationStore
from ingot.calibration.dataset import CalibrationSet
from ingot.cli import main
from ingot.pipeline.cache import directory_digest
from ingot.pipeline.device import DeviceSettings, resolve_device
from ingot.pipeline.model.load import CheckpointReader, load_model
from ingot.pipeline.quantize import driver
from ingot.pipeline.quantize.checkpoint import load_ir
from ingot.pipeline.recipe import RecipeError, load_recipe
from ingot.pipeline.recipe.quantize import quantize_entry
from ingot.pipeline.stages import quantize as quantize_stage
from ingot.pipeline.stages.calibrate import (
    CalibrateOutput,
    PreparedCalibration,
    prepare_calibration,
    read_device_settings,
)

from fixtures import make_checkpoint, model_config, write_recipe, write_tokenizer

GPTQ = {"method": "gptq", "bits": 4, "group_size": 32}
# GPTQ true-sequential on attention, AWQ on the MLP: every store the walk opens.
ENTRIES = [
    quantize_entry({**GPTQ, "targets": ["re:layers\\..*\\.attn\\..*"]}),
    quantize_entry({"method": "awq", "bits": 4, "group_size": 32, "targets": ["re:.*\\.mlp\\..*"]}),
]
# The calibrate slice of a recipe that says nothing of the device, before the fields existed.
PLAIN_SLICE = {"split": "train", "text_field": "text", "samples": 4, "seq_len": 32, "seed": 0}


def recipe_file(tmp_path, calibration: dict, quantize: list[dict] | None = None):
    recipe = {
        "source": {"path": "./ckpt"},
        "artifact": {"name": "tiny"},
        "calibration": {"dataset": "calib.txt", "samples": 4, "seq_len": 32, **calibration},
        "quantize": [GPTQ] if quantize is None else quantize,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


# -- the recipe fields ------------------------------------------------------------------------


def test_defaults_are_auto_and_cpu(tmp_path):
    calibration = load_recipe(recipe_file(tmp_path, {})).calibration
    assert (calibration.device, calibration.offload) == ("auto", "cpu")


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:7", "cuda:12"])
def test_devices_accepted(tmp_path, device):
    assert load_recipe(recipe_file(tmp_path, {"device": device})).calibration.device == device


@pytest.mark.parametrize(
    "device", ["cuda:x", "gpu", "cuda:", "CUDA", "cuda:01", "cuda:-1", "cpu:0", "mps", ""]
)
def test_unknown_device_is_one_line_naming_the_field(tmp_path, device):
    with pytest.raises(RecipeError) as error:
        load_recipe(recipe_file(tmp_path, {"device": device}))
    [line] = error.value.problems
    assert "calibration.device: unknown device" in line
    assert f"got {device!r}" in line and "allowed: auto, cpu, cuda, cuda:N" in line


def test_unknown_offload_names_the_field(tmp_path):
    with pytest.raises(RecipeError) as error:
        load_recipe(recipe_file(tmp_path, {"offload": "gpu"}))
    [line] = error.value.problems
    assert "calibration.offload" in line and "got 'gpu'" in line


# -- resolving on this host -------------------------------------------------------------------


def test_auto_is_cpu_without_cuda(no_cuda):
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"


def test_auto_is_cuda_with_cuda(two_gpus):
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("cuda") == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_a_device_is_one_line(no_cuda, device):
    with pytest.raises(RecipeError) as error:
        resolve_device(device, file="r.yaml")
    [line] = error.value.problems
    assert line.startswith("r.yaml: calibration.device: no CUDA device on this host")
    assert "torch.cuda.is_available() is False" in line and f"got {device!r}" in line


def test_cuda_index_past_the_devices_is_one_line(two_gpus):
    with pytest.raises(RecipeError) as error:
        resolve_device("cuda:2")
    [line] = error.value.problems
    assert line.startswith("calibration.device: this host has 2 CUDA devices")
    assert "cuda:0 .. cuda:1" in line


def test_cuda_fails_before_the_data_is_read(tmp_path, no_cuda):
    # calib.txt does not exist: the device is what the build refuses first.
    path = recipe_file(tmp_path, {"device": "cuda"})
    with pytest.raises(RecipeError, match="calibration.device"):
        prepare_calibration(load_recipe(path), path, tmp_path / "ckpt", model_config())


def test_rtn_recipes_ignore_the_device(tmp_path, no_cuda):
    rtn = [{"method": "rtn", "bits": 4, "group_size": 32}]
    path = recipe_file(tmp_path, {"device": "cuda:3"}, quantize=rtn)
    assert prepare_calibration(load_recipe(path), path, tmp_path / "ckpt", model_config()) is None


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", "llama")


def test_build_refuses_cuda_in_one_line_before_any_stage(tmp_path, checkpoint, no_cuda):
    (tmp_path / "calib.txt").write_text("def f(a, b):\n    return a + b\n" * 200)
    recipe = write_recipe(
        tmp_path / "r.yaml",
        checkpoint,
        calibration={"dataset": "calib.txt", "samples": 4, "seq_len": 32, "device": "cuda"},
        quantize=[GPTQ],
    )
    cache, out = tmp_path / "cache", tmp_path / "out"
    result = CliRunner().invoke(
        main, ["build", "--recipe", str(recipe), "--cache-dir", str(cache), "--out", str(out)]
    )
    assert result.exit_code == 1, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: ") and "calibration.device: no CUDA device" in line
    assert not (cache / "stages").exists() and not out.exists()


# -- the device through the stages ------------------------------------------------------------


def prepared(tmp_path, calibration: dict) -> PreparedCalibration:
    source = tmp_path / "ckpt"
    source.mkdir(exist_ok=True)
    write_tokenizer(source, 320)
    (tmp_path / "calib.txt").write_text("The quick brown fox jumps over the lazy dog.\n" * 200)
    path = recipe_file(tmp_path, calibration)
    return prepare_calibration(load_recipe(path), path, source, model_config())


def test_a_device_that_resolves_to_cpu_leaves_the_key_slice_as_it_was(tmp_path, no_cuda):
    slices = [prepared(tmp_path, c).key_slice for c in ({}, {"device": "cpu"}, {"device": "auto"})]
    assert slices == [PLAIN_SLICE] * 3


def test_the_resolved_device_and_disk_offload_are_in_the_key_slice(tmp_path, two_gpus):
    assert prepared(tmp_path, {}).key_slice == {**PLAIN_SLICE, "device": "cuda"}
    on_disk = prepared(tmp_path, {"device": "cuda:1", "offload": "disk"})
    assert on_disk.key_slice == {**PLAIN_SLICE, "device": "cuda:1", "offload": "disk"}
    entry = on_disk.lock_entry  # the section as written, and where it ran
    assert entry["device"] == entry["resolved_device"] == "cuda:1"
    assert prepared(tmp_path, {}).lock_entry["resolved_device"] == "cuda"


def test_the_calibrate_output_carries_the_settings(tmp_path, two_gpus):
    calibration = prepared(tmp_path, {"offload": "disk"})
    out = tmp_path / "calibrate"
    out.mkdir()
    calibration.save(out)
    device_file = out / CalibrateOutput.DEVICE
    assert json.loads(device_file.read_text()) == {"device": "cuda", "offload": "disk"}
    assert read_device_settings(out) == DeviceSettings("cuda", "disk")
    device_file.unlink()
    assert read_device_settings(out) == DeviceSettings("cpu", "cpu")


@pytest.fixture(scope="module")
def tokens():
    tokens = np.random.default_rng(0).integers(2, 320, size=(6, 32)).astype(np.int64)
    return CalibrationSet(tokens, list(range(6)), "sha256:test")


def test_the_quantize_stage_runs_where_the_calibrate_output_says(
    tmp_path, checkpoint, tokens, monkeypatch
):
    seen = {}

    def fake_quantize_layers(source, entries, out, work, calibration, **kwargs):
        seen.update(kwargs)
        return []

    monkeypatch.setattr(quantize_stage, "quantize_layers", fake_quantize_layers)
    c_dir = tmp_path / "calibrate"
    c_dir.mkdir()
    PreparedCalibration(tokens, {}, DeviceSettings("cuda:1", "disk")).save(c_dir)
    out = tmp_path / "out"
    out.mkdir()
    quantize_stage.run_quantize(
        checkpoint, ENTRIES, out, calibration_dir=c_dir, work_dir=tmp_path / "w"
    )
    assert seen == {"device": "cuda:1", "offload": "disk"}
    rtn = [quantize_entry({"method": "rtn", "bits": 4, "group_size": 32})]
    quantize_stage.run_quantize(checkpoint, rtn, out)
    assert seen == {"device": "cpu", "offload": "cpu"}


# -- offload and precision --------------------------------------------------------------------


def test_disk_offload_spills_every_store_and_changes_nothing(
    tmp_path, checkpoint, tokens, monkeypatch
):
    in_memory = tmp_path / "memory"
    in_memory.mkdir()
    source = CheckpointReader(checkpoint)
    big = 2**30
    driver.quantize_layers(source, ENTRIES, in_memory, tmp_path / "w1", tokens, budget_bytes=big)

    spilled = []
    init = ActivationStore.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        spilled.append(self.spilled)

    monkeypatch.setattr(ActivationStore, "__init__", tracked)
    on_disk = tmp_path / "disk"
    on_disk.mkdir()
    driver.quantize_layers(
        source, ENTRIES, on_disk, tmp_path / "w2", tokens, budget_bytes=big, offload="disk"
    )
    assert spilled and all(spilled)
    assert directory_digest(on_disk) == directory_digest(in_memory)

    model = load_model(checkpoint)
    driver.quantize_in_place(model, ENTRIES, tokens, offload="disk", device="cpu")
    stored = load_ir(in_memory).state_dict()
    for name, tensor in model.state_dict().items():
        if tensor is not None:
            assert torch.equal(tensor, stored[name]), name


def test_the_walk_runs_in_full_float32_and_restores_the_setting(
    tmp_path, checkpoint, tokens, monkeypatch
):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        during = []
        out = tmp_path / "out"
        out.mkdir()
        driver.quantize_layers(
            CheckpointReader(checkpoint),
            ENTRIES,
            out,
            tmp_path / "w",
            tokens,
            on_layer=lambda i, e: during.append(torch.get_float32_matmul_precision()),
        )
        assert during == ["highest", "highest"]
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


def test_unknown_offload_is_refused_by_the_driver(tmp_path, checkpoint, tokens):
    with pytest.raises(ValueError, match="offload"):
        driver.quantize_layers(
            CheckpointReader(checkpoint), ENTRIES, tmp_path, tmp_path / "w", tokens, offload="gpu"
        )
