"""GPTQ: beats round-to-nearest on the layer-wise error, its variants (act order, static
groups, per channel, asymmetric, 8-bit) all do, lazy block updates are exact, and an act-order
model exports and matches the IR."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ingot.calibration.capture import HessianObserver
from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.engines.onnxruntime.check import check_export
from ingot.pipeline.export import export_onnx
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qlinear import QuantizedLinear
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.gptq import gptq_quantize, quantize_linear_gptq
from ingot.pipeline.quantize.rtn import mse_scales, quantize_linear_rtn, quantize_weight
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint


def correlated_inputs(tokens: int, k: int, seed: int) -> torch.Tensor:
    """Inputs whose channels are correlated and of very different scales, as real ones are;
    one fixed distribution, ``seed`` draws the tokens."""
    g = torch.Generator().manual_seed(1234)
    mixing = torch.randn(k, k, generator=g) / k**0.5
    scale = torch.logspace(0, -1.5, k)[torch.randperm(k, generator=g)]
    noise = torch.randn(tokens, k, generator=torch.Generator().manual_seed(seed))
    return (noise @ mixing) * scale * 4


@pytest.fixture(scope="module")
def layer():
    torch.manual_seed(0)
    linear = nn.Linear(256, 96, bias=True)
    nn.init.normal_(linear.weight, std=0.05)
    x_fit, x_test = correlated_inputs(2048, 256, seed=1), correlated_inputs(1024, 256, seed=2)
    observer = HessianObserver(256)
    for chunk in x_fit.split(300):  # chunked like the runner feeds it
        observer(chunk)
    return linear, observer.hessian(), x_fit, x_test


def output_error(linear: nn.Linear, quantized: QuantizedLinear, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float((linear(x) - quantized(x)).norm())


def test_hessian_is_two_x_t_x_over_n(layer):
    _, hessian, x_fit, _ = layer
    torch.testing.assert_close(hessian, 2 * x_fit.T @ x_fit / len(x_fit), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("width", [600, 1024])  # accumulated in 2 and 4 block rows
def test_hessian_from_block_rows_is_whole_and_symmetric(width):
    x = torch.randn(700, width, generator=torch.Generator().manual_seed(1))
    observer = HessianObserver(width)
    for chunk in x.split(300):
        observer(chunk)
    hessian = observer.hessian()
    assert torch.equal(hessian, hessian.T)
    torch.testing.assert_close(hessian, 2 * x.T @ x / len(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("bits", "group_size", "symmetric", "actorder", "static_groups"),
    [
        # every ordering at W4 g32 ...
        (4, 32, True, False, False),
        (4, 32, True, True, True),
        (4, 32, True, False, True),
        (4, 32, True, True, False),
        # ... and the other schemes with the default (act order, static groups)
        (4, 128, False, True, True),
        (4, -1, True, True, True),
        (4, -1, False, True, True),
        (8, 64, True, True, True),
    ],
)
def test_gptq_error_below_rtn(layer, bits, group_size, symmetric, actorder, static_groups):
    linear, hessian, x_fit, x_test = layer
    rtn = quantize_linear_rtn(linear, bits, group_size, symmetric)
    gptq = quantize_linear_gptq(
        linear,
        hessian,
        bits=bits,
        group_size=group_size,
        symmetric=symmetric,
        actorder=actorder,
        static_groups=static_groups,
    )
    assert output_error(linear, gptq, x_fit) < 0.9 * output_error(linear, rtn, x_fit)
    assert output_error(linear, gptq, x_test) < output_error(linear, rtn, x_test)
    # Only act order with dynamic groups scatters the groups; everything else stays contiguous.
    scattered = actorder and not static_groups and group_size != -1
    assert (gptq.g_idx is not None) == scattered
    if scattered:
        assert sorted(torch.bincount(gptq.g_idx).tolist()) == [group_size] * (256 // group_size)


def test_group_scales_pick_per_row_the_candidate_with_less_layer_wise_error(layer):
    """ "minmax" keeps the min-max scales, "mse" the error-minimizing ones, and "best" takes
    each row's scales from one of them: the one whose GPTQ solution has the smaller
    (W - Q) H (W - Q)^T."""
    linear, hessian, _, _ = layer
    w = linear.weight.data
    kwargs = dict(bits=4, group_size=32, symmetric=True)
    solved = {
        choice: gptq_quantize(w, hessian, group_scales=choice, **kwargs)
        for choice in ("minmax", "mse", "best")
    }
    assert torch.equal(solved["minmax"][1], quantize_weight(w, 4, 32, True)[1])
    assert torch.equal(solved["mse"][1], mse_scales(w, 4, 32, True)[0])

    def row_errors(codes, scales):  # [N]
        delta = codes.float() * scales.repeat_interleave(32, dim=1) - w  # symmetric: int8 codes
        return ((delta @ hessian) * delta).sum(1)

    errors = {c: row_errors(codes, scales) for c, (codes, scales, _, _) in solved.items()}
    from_mse = (solved["best"][1] == solved["mse"][1]).all(1)
    from_minmax = (solved["best"][1] == solved["minmax"][1]).all(1)
    assert (from_mse | from_minmax).all() and from_mse.any() and from_minmax.any()
    torch.testing.assert_close(errors["best"], torch.minimum(errors["minmax"], errors["mse"]))
    # Per channel there is one candidate: the choice changes nothing.
    per_channel = dict(bits=4, group_size=-1, symmetric=True)
    assert torch.equal(
        gptq_quantize(w, hessian, group_scales="mse", **per_channel)[0],
        gptq_quantize(w, hessian, group_scales="minmax", **per_channel)[0],
    )


def test_lazy_block_updates_are_exact(layer):
    linear, hessian, _, _ = layer
    kwargs = dict(bits=4, group_size=32, symmetric=True, actorder=True, static_groups=True)
    one_block, _, _, _ = gptq_quantize(linear.weight, hessian, block_size=256, **kwargs)
    small_blocks, _, _, _ = gptq_quantize(linear.weight, hessian, block_size=16, **kwargs)
    agree = (one_block == small_blocks).float().mean()
    assert agree > 0.995  # the same algorithm; only float rounding order differs


def test_dead_channels_do_not_break_the_solve():
    torch.manual_seed(0)
    w = torch.randn(16, 64)
    x = torch.randn(256, 64)
    x[:, :8] = 0  # never active
    codes, scales, zeros, _ = gptq_quantize(
        w, 2 * x.T @ x / 256, bits=4, group_size=32, symmetric=False
    )
    assert torch.isfinite(scales).all() and zeros is not None
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15


def test_act_order_model_exports_and_matches_ir(tmp_path):
    # GQA fixture (4 heads / 2 kv heads), every decoder linear GPTQ int4 g32 with act order.
    model = load_model(make_checkpoint(tmp_path / "ckpt", "llama"))
    tokens = np.random.default_rng(0).integers(2, 320, size=(8, 32)).astype(np.int64)
    spec = {
        "method": "gptq",
        "bits": 4,
        "group_size": 32,
        "symmetric": True,
        "targets": ["re:layers\\..*"],
        "ignore": [],
        "actorder": True,
        "static_groups": True,
        "dampening_frac": 0.01,
        "block_size": 128,
    }
    [summary] = quantize_model(
        model, [quantize_entry(spec)], CalibrationSet(tokens, list(range(8)), "sha256:x")
    )
    assert summary["modules"] == 14
    quantized = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert len(quantized) == 14 and all(m.g_idx is None for m in quantized)
    export_onnx(model, tmp_path / "onnx", max_seq_len=64)
    report = check_export(model, tmp_path / "onnx" / "model.onnx", atol=1e-3)
    assert report["greedy_match"]
