"""Quantized activations of a linear layer (W8A8 int8, FP8): the IR's exact definition.

The exported graph computes the same steps with the same operators (pipeline/export/weights.py),
so the IR is the oracle the export check compares against:

- int8, dynamic (per token): s = max(max_k |x_k| / 127, EPS); q = round(x / s), an integer in
  [-127, 127]; y = (q @ codes^T) * s * weight_scale. Rounding is half to even (torch.round and
  ONNX Round agree) and the integer matmul is exact (float64 here, int32 in ONNX Runtime).
- int8, static (per tensor, calibrated scale s): q = clamp(round(x / s), -128, 127), the rest
  as above (ONNX QuantizeLinear / DequantizeLinear with zero point 0).
- fp8 (E4M3FN), dynamic per token (s = max(max_k |x_k| / 448, EPS)) or static per tensor:
  x ~ float8(clamp(x / s, +-448)) * s, then a float matmul with the dequantized weight.

A static scheme whose scale is not yet known (None: the calibration pass is still observing
the layer's inputs) passes the activations through unquantized, as llm-compressor's
calibration does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["EPS", "FP8_MAX", "INT8_MAX", "InputQuant", "quantize_input"]

INT8_MAX = 127.0  # symmetric int8 range of a dynamic scale: codes in [-127, 127]
FP8_MAX = 448.0  # largest finite float8 E4M3FN
EPS = 1e-12  # floor of a dynamic scale: an all-zero token (padding) divides by this, not 0


@dataclass(frozen=True, slots=True)
class InputQuant:
    """How a linear's input is quantized: dtype, dynamic (per token) or static (per tensor)."""

    dtype: Literal["int8", "fp8"]
    static: bool = False
    scale: float | None = None  # static only; None until calibrated

    def __post_init__(self) -> None:
        if self.dtype not in ("int8", "fp8"):
            raise ValueError(f"activation dtype {self.dtype!r} is neither int8 nor fp8")
        if self.scale is not None and (not self.static or not self.scale > 0):
            raise ValueError(f"a scale ({self.scale}) is for a static scheme, and positive")

    @property
    def calibrated(self) -> bool:
        """Whether the scheme quantizes (a static one needs its scale first)."""
        return not self.static or self.scale is not None

    @property
    def max_value(self) -> float:
        return INT8_MAX if self.dtype == "int8" else FP8_MAX

    def with_peak(self, peak: float) -> InputQuant:
        """This static scheme calibrated: the scale maps ``peak`` (max |x| over the calibration
        tokens and channels) to the dtype's largest value."""
        return InputQuant(self.dtype, True, max(peak, 1e-8) / self.max_value)

    def to_dict(self) -> dict[str, object]:
        return {"dtype": self.dtype, "static": self.static, "scale": self.scale}

    @classmethod
    def from_dict(cls, data: dict[str, object] | None) -> InputQuant | None:
        return None if data is None else cls(**data)  # type: ignore[arg-type]


def quantize_input(x: torch.Tensor, scheme: InputQuant) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] float32 -> (q, s): int8 codes as float (exact integers) or FP8 values
    dequantized to float32 without their scale, [..., K]; s [..., 1] (dynamic) or a scalar."""
    if scheme.static:
        s = torch.tensor(scheme.scale, dtype=torch.float32, device=x.device)
    else:
        s = (x.abs().amax(-1, keepdim=True) / scheme.max_value).clamp_min(EPS)  # [..., 1]
    if scheme.dtype == "int8":
        low = -128.0 if scheme.static else -INT8_MAX  # QuantizeLinear saturates to int8
        return torch.round(x / s).clamp_(low, INT8_MAX), s
    q = (x / s).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return q, s
