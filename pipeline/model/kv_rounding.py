"""A quantized KV cache (``kv_cache.dtype`` int8 / fp8) as the IR computes it: the rounding.

The pool stores each token's K (after RoPE) and V as 8-bit codes with one symmetric scale per
layer, per KV head and per K / V (zero point 0):

- int8: code = clamp(round_half_even(x / scale), -128, 127), x ~ code * scale;
- fp8 (E4M3FN): code = float8_e4m3fn(clamp(x / scale, -448, 448)) (round to nearest even),
  x ~ float(code) * scale.

That is ONNX ``QuantizeLinear`` (saturating, zero point 0, x / scale as a division: ONNX
Runtime's CPU kernels divide, and agree bit for bit with this) and ``DequantizeLinear``. A
calibrated scale is amax / qmax: the largest |value| a head produced on the calibration
windows maps to the largest code (`calibrate_kv_scales` in pipeline/quantize/kv_scales.py).

The graph rounds a call's new K/V to codes *before* they are attended to, so the IR does the
same (`KVQuant` on `Attention.kv_quant`): every key and value any query sees, its own chunk's
included, is the dequantized code the pool holds, and the output does not depend on how a
prompt is chunked. The model's scales and how they reach its layers are kv_quant.py's; this
module imports no layer, so the decoder layer (layers.py) can import `KVQuant`.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

__all__ = ["KV_QMAX", "KVDtype", "KVQuant", "dequantize_kv", "quantize_kv"]

KVDtype = Literal["int8", "fp8"]
# The largest code of each dtype: a calibrated scale maps a head's amax to it.
KV_QMAX: dict[str, float] = {
    "int8": float(torch.iinfo(torch.int8).max),  # 127
    "fp8": float(torch.finfo(torch.float8_e4m3fn).max),  # 448
}


def quantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: KVDtype) -> torch.Tensor:
    """Codes of ``x`` (int8 or float8_e4m3fn tensor) for a ``scale`` that broadcasts to it."""
    scaled = x.float() / scale
    if dtype == "int8":
        low, high = torch.iinfo(torch.int8).min, torch.iinfo(torch.int8).max
        return torch.round(scaled).clamp_(low, high).to(torch.int8)
    if dtype == "fp8":
        # torch's cast rounds to nearest even but turns out-of-range values into NaN: clamp
        # first, which is QuantizeLinear's saturation.
        limit = KV_QMAX["fp8"]
        return scaled.clamp_(-limit, limit).to(torch.float8_e4m3fn)
    raise ValueError(f"kv_cache.dtype: {dtype!r} is not a quantized KV dtype (int8, fp8)")


def dequantize_kv(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of ``codes``: code * scale, one fp32 multiply (DequantizeLinear)."""
    return codes.to(torch.float32) * scale


class KVQuant(nn.Module):
    """One layer's K and V rounding: per-KV-head scales k_scale, v_scale [Hkv].

    The scales are non-persistent buffers: they move with the layer (`.to(device)`) but are
    not part of its state dict, so layer checkpoints and the IR's tensors are unchanged."""

    def __init__(self, dtype: KVDtype, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        super().__init__()
        if dtype not in KV_QMAX:
            raise ValueError(f"kv_cache.dtype: {dtype!r} is not a quantized KV dtype (int8, fp8)")
        self.dtype = dtype
        self.register_buffer("k_scale", k_scale.detach().to(torch.float32), persistent=False)
        self.register_buffer("v_scale", v_scale.detach().to(torch.float32), persistent=False)

    def forward(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: [B, Hkv, T, D] -> the values their codes stand for, same shape, float32."""
        return self.round(k, self.k_scale), self.round(v, self.v_scale)

    def round(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """x [B, Hkv, T, D] through its codes and back, with ``scale`` [Hkv] per head."""
        per_head = scale.view(1, -1, 1, 1)  # [1, Hkv, 1, 1]
        return dequantize_kv(quantize_kv(x, per_head, self.dtype), per_head)

    def extra_repr(self) -> str:
        return f"{self.dtype}, {self.k_scale.numel()} heads"
