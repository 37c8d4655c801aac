"""The precision search's sensitivity (pipeline/quantize/sensitivity.py) is the direct
measurement it claims to be: a unit's KL under a candidate equals the mean KL of the whole
model quantized by the ordinary layer walk with that candidate on that unit alone (GPTQ solved
on the unit's float inputs, AWQ's scales folded into the norm), scored by evaluate.kl."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.evaluate.kl import mean_kl
from ingot.pipeline.model.load import CheckpointReader, load_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.sensitivity import measure_kl
from ingot.pipeline.quantize.units import Unit
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint

CANDIDATES = [
    {"method": "rtn", "bits": 4, "group_size": 32},
    {"method": "gptq", "bits": 4, "group_size": 32},
    {"method": "awq", "bits": 4, "group_size": 32},
]
UNITS = [Unit(0, ("attn.q_proj", "attn.k_proj", "attn.v_proj")), Unit(1, ("mlp.down_proj",))]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama")


@pytest.fixture(scope="module")
def calibration():
    tokens = np.random.default_rng(0).integers(2, 320, size=(6, 32)).astype(np.int64)
    return CalibrationSet(tokens, list(range(6)), "sha256:test")


def _logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.as_tensor(tokens))[0]  # [N, T, V]
    return logits.reshape(-1, logits.shape[-1]).float().numpy()


def test_a_units_sensitivity_is_the_kl_of_the_model_with_that_unit_alone_quantized(
    checkpoint, calibration
):
    candidates = [quantize_entry(c) for c in CANDIDATES]
    measured = measure_kl(CheckpointReader(checkpoint), calibration, UNITS, candidates)
    reference = _logits(load_model(checkpoint), calibration.tokens)
    for a, unit in enumerate(UNITS):
        for c, spec in enumerate(CANDIDATES):
            model = load_model(checkpoint)
            entry = quantize_entry({**spec, "targets": unit.modules, "ignore": []})
            quantize_model(model, [entry], calibration)
            expected = mean_kl(reference, _logits(model, calibration.tokens))
            assert measured[a, c] == pytest.approx(expected, rel=1e-3), (unit, spec)
    # GPTQ's solve is not RTN's rounding: the measurement used the method's own weights
    assert not np.allclose(measured[:, 0], measured[:, 1], rtol=1e-3)


@pytest.mark.gpu
def test_the_measurement_on_a_gpu_is_the_cpus(checkpoint, calibration):
    # The walk computes in full float32 on every device: GPTQ's and the KL's numbers agree.
    candidates = [quantize_entry(c) for c in CANDIDATES[:2]]
    source = CheckpointReader(checkpoint)
    on_cpu = measure_kl(source, calibration, UNITS, candidates)
    on_gpu = measure_kl(source, calibration, UNITS, candidates, device="cuda")
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-3)
