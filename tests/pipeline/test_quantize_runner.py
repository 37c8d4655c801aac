"""The layer-sequential driver on calibrated recipes: spilled activations, one layer alive at a
time, and a killed run that resumes into the identical output — directly and through the
build's stage cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ingot.calibration.activations import ActivationStore
from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache, directory_digest
from ingot.pipeline.model.load import CheckpointReader, load_model
from ingot.pipeline.quantize import driver
from ingot.pipeline.quantize.checkpoint import load_ir
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint, write_recipe
from tracking import LiveLayers, OpenStores

# GPTQ (true-sequential) on attention, AWQ on the MLP, RTN on the (tied) lm_head: every path
# of the runner. The build test below uses GPTQ's default order (every group observed at once).
SPECS = [
    {
        "method": "gptq",
        "bits": 4,
        "group_size": 32,
        "symmetric": True,
        "targets": ["re:layers\\..*\\.attn\\..*"],
        "ignore": [],
        "actorder": True,
        "static_groups": True,
        "dampening_frac": 0.01,
        "block_size": 128,
        "true_sequential": True,
    },
    {
        "method": "awq",
        "bits": 4,
        "group_size": 32,
        "symmetric": False,
        "targets": ["re:layers\\..*\\.mlp\\..*"],
        "ignore": [],
    },
    {
        "method": "rtn",
        "bits": 8,
        "group_size": -1,
        "symmetric": True,
        "targets": ["lm_head"],
        "ignore": [],
    },
]
SPECS = [quantize_entry(spec) for spec in SPECS]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return make_checkpoint(root / "llama", "llama", num_hidden_layers=3, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def calibration():
    tokens = np.random.default_rng(0).integers(2, 320, size=(6, 32)).astype(np.int64)
    return CalibrationSet(tokens, list(range(6)), "sha256:test")


def test_activation_store_spills_to_disk_and_round_trips(tmp_path):
    x = torch.randn(5, 3, 4)
    memory = ActivationStore((5, 3, 4), budget_bytes=10**6, spill_path=tmp_path / "m.bin")
    disk = ActivationStore((5, 3, 4), budget_bytes=100, spill_path=tmp_path / "d.bin")
    assert not memory.spilled and disk.spilled
    for store in (memory, disk):
        store.write(0, x[:2])
        store.write(2, x[2:])
        assert torch.equal(store.read(1, 4), x[1:4])
    disk.close()
    assert not (tmp_path / "d.bin").exists()


def test_killed_run_resumes_into_the_identical_output(tmp_path, checkpoint, calibration):
    whole = tmp_path / "whole"
    whole.mkdir()
    driver.quantize_layers(CheckpointReader(checkpoint), SPECS, whole, tmp_path / "w1", calibration)

    def kill_after_layer_1(i: int, event: str) -> None:
        if i == 1:
            raise KeyboardInterrupt("killed")

    out, work = tmp_path / "resumed", tmp_path / "w2"
    out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        driver.quantize_layers(
            CheckpointReader(checkpoint), SPECS, out, work, calibration, on_layer=kill_after_layer_1
        )
    assert sorted(p.name for p in work.glob("*.done")) == ["layer_0.done", "layer_1.done"]
    events = []
    driver.quantize_layers(
        CheckpointReader(checkpoint),
        SPECS,
        out,
        work,
        calibration,
        on_layer=lambda i, e: events.append((i, e)),
    )
    assert events == [(0, "resumed"), (1, "resumed"), (2, "quantized")]
    assert directory_digest(out) == directory_digest(whole)

    # The same walk over a model in memory (what benchmarks call) computes exactly what the
    # stage wrote.
    model = load_model(checkpoint)
    driver.quantize_in_place(model, SPECS, calibration)
    expected = {k: v for k, v in model.state_dict().items() if v is not None}
    actual = load_ir(out).state_dict()
    assert sorted(expected) == sorted(k for k, v in actual.items() if v is not None)
    for name, tensor in expected.items():
        assert torch.equal(tensor, actual[name]), name


def test_only_one_layer_is_alive_at_a_time(tmp_path, checkpoint, calibration, monkeypatch):
    # Peak memory independent of depth, checked structurally: the runner never holds two
    # layers' float weights, nor more than three activation stores (a layer's inputs plus two of
    # its attention output, residual stream and outputs).
    layers, stores = LiveLayers(monkeypatch), OpenStores(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    source = CheckpointReader(checkpoint)
    driver.quantize_layers(source, SPECS[:1], out, tmp_path / "work", calibration)
    assert layers.read == 3 and layers.most == 1 and stores.most <= 3
    assert not stores.open


def test_the_last_layers_outputs_are_not_computed(tmp_path, checkpoint, calibration, monkeypatch):
    # Nothing reads the last layer's outputs: quantize_decoder_layer is told not to compute
    # them, and every store the driver opened is closed.
    kept, quantize_layer = [], driver.quantize_decoder_layer
    stores = OpenStores(monkeypatch)

    def tracked_quantize(*args, outputs, experts):
        kept.append(outputs)
        return quantize_layer(*args, outputs=outputs, experts=experts)

    monkeypatch.setattr(driver, "quantize_decoder_layer", tracked_quantize)
    out = tmp_path / "out"
    out.mkdir()
    driver.quantize_layers(CheckpointReader(checkpoint), SPECS, out, tmp_path / "w", calibration)
    assert kept == [True, True, False]
    assert not stores.open


def _calibrated_recipe(tmp_path, checkpoint):
    text = "\n".join(f"def f{i}(a, b):\n    return a + b * {i}\n" for i in range(400))
    (tmp_path / "calib.txt").write_text(text)
    gptq = SPECS[0].model_dump(mode="json")
    specs = [{**gptq, "targets": ["re:layers\\..*"], "true_sequential": False}]
    return write_recipe(
        tmp_path / "r.yaml",
        checkpoint,
        calibration={"dataset": "calib.txt", "samples": 8, "seq_len": 32, "seed": 3},
        quantize=specs,
    )


def test_build_resumes_after_a_kill_into_the_same_artifact(tmp_path, checkpoint, monkeypatch):
    recipe = _calibrated_recipe(tmp_path, checkpoint)
    clean = build(recipe, tmp_path / "clean", cache=StageCache(tmp_path / "c1"))
    lock = json.loads((clean.artifact / "ingot.lock").read_text())
    entry = lock["calibration"]
    assert entry["dataset_digest"].startswith("sha256:") and len(entry["indices"]) == 8
    assert entry["files"] == {"calib.txt": entry["dataset_digest"][7:]}
    assert {"calibrate", "quantize"} <= set(lock["stages"])
    assert entry["dataset"] == "calib.txt" and entry["seed"] == 3  # as written: no local path

    cache = StageCache(tmp_path / "c2")
    mark_done = driver.LayerCheckpoints.mark_done

    def killed_after_layer_1(self, i):
        mark_done(self, i)
        if i == 1:
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(driver.LayerCheckpoints, "mark_done", killed_after_layer_1)
    with pytest.raises(KeyboardInterrupt):
        build(recipe, tmp_path / "resumed", cache=cache)
    [work] = (cache.root / "stages" / "quantize").glob(".work-*")
    assert (work / "layer_1.done").exists() and not (work / "layer_2.done").exists()

    monkeypatch.setattr(driver.LayerCheckpoints, "mark_done", mark_done)
    resumed = build(recipe, tmp_path / "resumed", cache=cache)
    assert resumed.digest == clean.digest
    assert not list((cache.root / "stages" / "quantize").glob(".work-*"))
    again = build(recipe, tmp_path / "resumed", cache=cache)
    assert all(s.cached for s in again.stages if s.stage != "package")
