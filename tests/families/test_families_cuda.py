"""The calibrated layer walk of the later families on a CUDA device against the CPU: Gemma 3's
layer (post-norms, the local layers' own RoPE, the offset norm) and the experts of Mixtral and
Qwen3-MoE (the per-expert walk and its calibration rule). GPTQ int4 g32 on both devices; as in
tests/pipeline/test_calibration_cuda.py, CUDA's kernels sum in another order, so codes are
compared by the quantized model's error against the float model (within 5% of the CPU's), not
bit for bit. Skipped, with the reason, where no CUDA device is present (tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.model.load import CheckpointReader, load_model
from ingot.pipeline.quantize import driver
from ingot.pipeline.quantize.checkpoint import load_ir
from ingot.pipeline.recipe.quantize import quantize_entry

from harness import WINDOW, tiny_checkpoint

pytestmark = pytest.mark.gpu

ERROR_RELATIVE = 0.05
GPTQ = [quantize_entry({"method": "gptq", "bits": 4, "group_size": 32, "ignore": ["lm_head"]})]
FAMILIES = {
    "gemma3_text": dict(sliding_window=WINDOW, num_hidden_layers=3, head_dim=16),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=96),
    "qwen3_moe": dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96, mlp_only_layers=[1]
    ),
}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_cuda_walk_agrees_with_cpu(tmp_path, model_type):
    ckpt = tiny_checkpoint(tmp_path / "ckpt", model_type, **FAMILIES[model_type])
    tokens = np.random.default_rng(0).integers(2, 320, size=(16, 32)).astype(np.int64)
    calibration = CalibrationSet(tokens, list(range(16)), "sha256:test")
    irs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        out.mkdir()
        work = tmp_path / f"{device}-work"
        driver.quantize_layers(CheckpointReader(ckpt), GPTQ, out, work, calibration, device=device)
        irs[device] = load_ir(out)
    reference = load_model(ckpt)
    ids = torch.as_tensor(tokens[:4])
    with torch.no_grad():
        float_logits = reference(ids)[0]
        errors = {d: float((ir(ids)[0] - float_logits).norm()) for d, ir in irs.items()}
        assert bool(torch.isfinite(irs["cuda"](ids)[0]).all())
    assert errors["cpu"] > 0
    assert abs(errors["cuda"] / errors["cpu"] - 1) <= ERROR_RELATIVE, errors
