"""Round-to-nearest weight quantization (the baseline every other method is compared to)."""

from __future__ import annotations

import torch
from torch import nn

from ..model.qlinear import QuantizedLinear

__all__ = ["quantize_weight", "quantize_linear_rtn", "integer_range", "round_to_codes"]


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

    group_size -1 means one group per output channel. Symmetric scales use the half-range
    (qmax - qmin) / 2, as compressed-tensors does, so the code -2^(b-1) is reachable.
    """
    n, k = w.shape
    g = k if group_size == -1 else group_size
    qmin, qmax = integer_range(bits, symmetric)
    groups = w.float().reshape(n, k // g, g)  # [N, G, g]
    if symmetric:
        scales = groups.abs().amax(-1) / ((qmax - qmin) / 2)  # [N, G]
        scales = torch.where(scales == 0, torch.ones_like(scales), scales)
        codes = round_to_codes(groups, scales[..., None], None, bits)
        return codes.reshape(n, k).to(torch.int8), scales, None
    lo = groups.amin(-1).clamp(max=0)  # the range always holds 0, so zero is exact
    hi = groups.amax(-1).clamp(min=0)
    scales = (hi - lo) / (qmax - qmin)
    scales = torch.where(scales == 0, torch.ones_like(scales), scales)
    zeros = torch.clamp(torch.round(qmin - lo / scales), qmin, qmax)  # [N, G]
    codes = round_to_codes(groups, scales[..., None], zeros[..., None], bits)
    return codes.reshape(n, k).to(torch.uint8), scales, zeros.to(torch.uint8)


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
    """Scales (and zero points) [N, G] whose rounding error sum |w - q(w)|^norm is smallest
    per group, over the ranges shrunk by 0, 1, ..., 79 % (GPTQ's `mse` grid)."""
    n, k = w.shape
    g = k if group_size == -1 else group_size
    groups = w.float().reshape(n, k // g, g)
    best_err = best_scales = best_zeros = None
    for step in range(80):
        shrink = 1 - step / 100
        _, scales, zeros = quantize_weight(w * shrink, bits, group_size, symmetric)
        z = None if zeros is None else zeros.float()[..., None]
        codes = round_to_codes(groups, scales[..., None], z, bits)
        deq = codes * scales[..., None] if z is None else (codes - z) * scales[..., None]
        err = (deq - groups).abs().pow(norm).sum(-1)  # [N, G]
        if best_err is None:
            best_err, best_scales, best_zeros = err, scales, zeros
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scales = torch.where(better, scales, best_scales)
        if zeros is not None:
            best_zeros = torch.where(better, zeros, best_zeros)
    return best_scales, best_zeros
