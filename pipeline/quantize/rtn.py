"""Round-to-nearest weight quantization (the baseline every other method is compared to)."""

from __future__ import annotations

import torch
from torch import nn

from ..model.qlinear import QuantizedLinear

__all__ = [
    "quantize_weight",
    "quantize_linear_rtn",
    "integer_range",
    "round_to_codes",
]

_ROWS_BYTES = 16 * 2**20  # float32 rows `quantize_weight` rounds at a time


def integer_range(bits: int, symmetric: bool) -> tuple[int, int]:
    """Codes are signed for symmetric (zero point 0, ONNX INT4/INT8), unsigned otherwise."""
    if symmetric:
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def round_to_codes(
    w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int
) -> torch.Tensor:
    """Codes (as float) of ``w`` for given scales and zero points (broadcast against ``w``);
    the one rounding rule every quantizer shares. Dequantize: (codes - zeros) * scales."""
    qmin, qmax = integer_range(bits, zeros is None)
    if zeros is None:
        return torch.clamp(torch.round(w / scales), qmin, qmax)
    return torch.clamp(torch.round(w / scales) + zeros, qmin, qmax)


def quantize_weight(
    w: torch.Tensor, bits: int, group_size: int, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """w: [N, K] float -> codes [N, K], scales [N, G], zero_points [N, G] | None; G = K / g.

    group_size -1 means one group per output channel; ranges as `_range_params`. Rounded a
    block of rows at a time (every step is per row), so the float temporaries stay within
    `_ROWS_BYTES` however large ``w`` is (an lm_head); the result does not depend on it."""
    n, k = w.shape
    g = _group(k, group_size)
    codes = torch.empty((n, k), dtype=torch.int8 if symmetric else torch.uint8, device=w.device)
    scales = torch.empty((n, k // g), dtype=torch.float32, device=w.device)
    zeros = None if symmetric else torch.empty((n, k // g), dtype=torch.uint8, device=w.device)
    rows = max(1, _ROWS_BYTES // (k * 4))
    for a in range(0, n, rows):
        b = min(a + rows, n)
        groups = w[a:b].float().reshape(b - a, k // g, g)  # [rows, G, g]
        s, z = _range_params(*_extremes(groups, symmetric), bits)
        q = round_to_codes(groups, s[..., None], None if z is None else z[..., None], bits)
        codes[a:b] = q.reshape(b - a, k)
        scales[a:b] = s
        if zeros is not None:
            zeros[a:b] = z
    return codes, scales, zeros


def _group(k: int, group_size: int) -> int:
    return k if group_size == -1 else group_size


def _extremes(groups: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a group's range is made of: max |w| (symmetric) or (min, max) widened to hold 0,
    each [N, G]."""
    if symmetric:
        return groups.abs().amax(-1), None
    return groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)


def _range_params(
    a: torch.Tensor, b: torch.Tensor | None, bits: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scales and zero points (float) | None of the ranges from `_extremes`. Symmetric scales
    use the half-range (qmax - qmin) / 2, as compressed-tensors does, so -2^(b-1) is reachable;
    an asymmetric range holds 0, so zero is exact."""
    qmin, qmax = integer_range(bits, b is None)
    if b is None:
        scales = a / ((qmax - qmin) / 2)
        return torch.where(scales == 0, torch.ones_like(scales), scales), None
    scales = (b - a) / (qmax - qmin)
    scales = torch.where(scales == 0, torch.ones_like(scales), scales)
    return scales, torch.clamp(torch.round(qmin - a / scales), qmin, qmax)


def quantize_linear_rtn(
    linear: nn.Linear, bits: int, group_size: int, symmetric: bool
) -> QuantizedLinear:
    codes, scales, zeros = quantize_weight(linear.weight.data, bits, group_size, symmetric)
    g = linear.in_features if group_size == -1 else group_size
    bias = None if linear.bias is None else linear.bias.data.clone()
    return QuantizedLinear(codes, scales, zeros, bits=bits, group_size=g, bias=bias)


def mse_scales(
    w: torch.Tensor, bits: int, group_size: int, symmetric: bool, *, norm: float = 2.4
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scales (and float zero points) [N, G] whose rounding error sum |w - q(w)|^norm is smallest
    per group, over the ranges shrunk by 0, 1, ..., 79 % (GPTQ's `mse` grid)."""
    n, k = w.shape
    groups = w.float().reshape(n, k // _group(k, group_size), -1)  # [N, G, g]
    a, b = _extremes(groups, symmetric)
    best_err = best_scales = best_zeros = None
    for step in range(80):
        # The range of w * shrink, exactly: rounding is monotonic, so the extremes of the
        # shrunk weights are the shrunk extremes.
        shrink = 1 - step / 100
        scales, zeros = _range_params(a * shrink, None if b is None else b * shrink, bits)
        z = None if zeros is None else zeros[..., None]
        codes = round_to_codes(groups, scales[..., None], z, bits)
        deq = (codes if z is None else codes.sub_(z)).mul_(scales[..., None])
        err = deq.sub_(groups).abs_().pow_(norm).sum(-1)  # [N, G]
        if best_err is None:
            best_err, best_scales, best_zeros = err, scales, zeros
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scales = torch.where(better, scales, best_scales)
        if zeros is not None:
            best_zeros = torch.where(better, zeros, best_zeros)
    return best_scales, best_zeros
