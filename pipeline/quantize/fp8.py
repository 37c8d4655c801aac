"""FP8 (E4M3FN) weights: round-to-nearest with one scale per output channel or per tensor."""

from __future__ import annotations

import torch
from torch import nn

from ..model.input_quant import FP8_MAX, InputQuant
from ..model.qlinear import QuantizedLinear

__all__ = ["quantize_linear_fp8", "quantize_weight_fp8"]


def quantize_weight_fp8(w: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [N, K] float -> codes [N, K] float8_e4m3fn, scales [N, 1] float32 (per tensor: one
    value repeated, so every consumer reads one layout). scale = max|w| / 448: the largest
    weight maps to the largest finite E4M3FN value; the cast rounds to nearest even."""
    w = w.float()
    peak = w.abs().amax(1, keepdim=True) if per_channel else w.abs().amax().expand(w.shape[0], 1)
    scales = (peak / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)  # [N, 1]
    codes = (w / scales).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scales.contiguous()


def quantize_linear_fp8(
    linear: nn.Linear, per_channel: bool, inputs: InputQuant | None = None
) -> QuantizedLinear:
    """The FP8 linear (one weight scale per output channel, or per tensor), quantizing its
    inputs by ``inputs`` (None: weight-only); a static scheme's scale is set later."""
    codes, scales = quantize_weight_fp8(linear.weight.data, per_channel)
    bias = None if linear.bias is None else linear.bias.data.clone()
    return QuantizedLinear(
        codes, scales, None, bits=8, group_size=linear.in_features, bias=bias, input_quant=inputs
    )
