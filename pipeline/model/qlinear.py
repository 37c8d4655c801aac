"""A linear layer with quantized weights (integer or FP8 codes), and optionally quantized
inputs (W8A8, FP8): the one dequantize path every consumer shares."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from .input_quant import InputQuant, quantize_input

__all__ = ["QuantizedLinear", "dequantize_in_place", "dequantized", "replace_module"]


class QuantizedLinear(nn.Module):
    """y = x @ dequantize().T + bias, with W ≈ (codes - zero_points) * scales per group.

    codes:       [N, K] int8 (symmetric, signed range), uint8 (asymmetric, unsigned range)
                 or float8_e4m3fn (FP8, bits 8, symmetric)
    scales:      [N, K / group_size] float32 (group_size = K for per-channel)
    zero_points: [N, K / group_size] same dtype as codes, or None when symmetric (zero is 0)
    g_idx:       [K] int64 group of each input channel, or None for contiguous groups
                 (act-order quantizers permute groups; contiguous groups are the export default)
    input_quant: how the input is quantized (`input_quant.py`), or None (weight-only); int8
                 inputs need int8 per-channel weights, FP8 inputs FP8 weights
    """

    def __init__(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        zero_points: torch.Tensor | None,
        bits: int,
        group_size: int,
        bias: torch.Tensor | None = None,
        g_idx: torch.Tensor | None = None,
        input_quant: InputQuant | None = None,
    ) -> None:
        super().__init__()
        n, k = codes.shape
        if k % group_size or scales.shape != (n, k // group_size):
            raise ValueError(
                f"scales {tuple(scales.shape)} do not fit codes {(n, k)} / g{group_size}"
            )
        if codes.dtype == torch.float8_e4m3fn and (zero_points is not None or bits != 8):
            raise ValueError("FP8 codes are 8-bit and symmetric (no zero points)")
        self.bits, self.group_size = bits, group_size
        self.in_features, self.out_features = k, n
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales.to(torch.float32))
        self.register_buffer("zero_points", zero_points)
        self.register_buffer("g_idx", g_idx)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.input_quant: InputQuant | None = None
        self.set_input_quant(input_quant)

    def set_input_quant(self, scheme: InputQuant | None) -> None:
        """Quantize inputs by ``scheme`` (None: weight-only): int8 inputs need int8 symmetric
        per-channel weights, FP8 inputs FP8 per-channel (or per-tensor) weights."""
        if scheme is not None:
            wanted = torch.int8 if scheme.dtype == "int8" else torch.float8_e4m3fn
            k = self.in_features
            per_channel = self.group_size == k and self.bits == 8 and self.symmetric
            if self.codes.dtype != wanted or not per_channel:
                raise ValueError(
                    f"{scheme.dtype} inputs need symmetric per-channel 8-bit {wanted} weights "
                    f"(got {self.bits}-bit {self.codes.dtype}, group size {self.group_size} of {k})"
                )
        self.input_quant = scheme

    @property
    def symmetric(self) -> bool:
        return self.zero_points is None

    @property
    def fp8(self) -> bool:
        return self.codes.dtype == torch.float8_e4m3fn

    def dequantize(self) -> torch.Tensor:
        """The float weight [N, K] these codes stand for."""
        codes = self.codes.to(torch.float32, copy=True)  # [N, K], scaled in place below
        zeros = 0.0 if self.zero_points is None else self.zero_points.to(torch.float32)
        if self.g_idx is None:
            # In place: the same two operations as (codes - zeros) * scales, bit for bit, with
            # no [N, K] temporary (a 1B model's check dequantizes every layer).
            n, k = codes.shape
            groups = codes.view(n, k // self.group_size, self.group_size)  # [N, G, g]
            if self.zero_points is not None:
                groups.sub_(zeros[..., None])
            groups.mul_(self.scales[..., None])
            return codes
        # Arbitrary channel -> group assignment (act-order): gather each channel's group.
        scales = self.scales[:, self.g_idx]  # [N, K]
        if self.zero_points is not None:
            zeros = zeros[:, self.g_idx]
        return (codes - zeros) * scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scheme = self.input_quant
        if scheme is None or not scheme.calibrated:
            return nn.functional.linear(x, self.dequantize(), self.bias)
        q, s = quantize_input(x.float(), scheme)  # [..., K], [..., 1] or []
        if scheme.dtype == "int8":
            # Exact integer products (float64 holds every int32 sum), then the two scales in
            # the graph's order: Cast -> Mul(s) -> Mul(weight scale).
            acc = (q.double() @ self.codes.double().T).float()  # [..., N]
            y = acc * s * self.scales[:, 0]
        else:
            y = nn.functional.linear(q * s, self.dequantize())
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        kind = "sym" if self.symmetric else "asym"
        weights = "fp8" if self.fp8 else f"int{self.bits}"
        text = f"{self.in_features}->{self.out_features}, {weights} g{self.group_size} {kind}"
        if self.input_quant is not None:
            how = "static" if self.input_quant.static else "dynamic"
            text += f", {self.input_quant.dtype} {how} inputs"
        return text


def dequantize_in_place(module: nn.Module) -> list[tuple[str, QuantizedLinear]]:
    """Swap each weight-only QuantizedLinear under `module` for a float Linear holding its
    dequantized weight; returns what was swapped. Outputs are bit-identical (its forward is
    exactly ``linear(x, dequantize(), bias)``) but the dequantize runs once, not per call.
    Linears that quantize their inputs stay: their forward is not a float linear."""
    swapped = []
    for name, m in list(module.named_modules()):
        if isinstance(m, QuantizedLinear) and (
            m.input_quant is None or not m.input_quant.calibrated
        ):
            with torch.device("meta"):
                linear = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
            linear.weight = nn.Parameter(m.dequantize(), requires_grad=False)
            linear.bias = m.bias
            replace_module(module, name, linear)
            swapped.append((name, m))
    return swapped


@contextlib.contextmanager
def dequantized(module: nn.Module) -> Iterator[None]:
    """`module` with its quantized linears dequantized once for the block, then restored."""
    swapped = dequantize_in_place(module)
    try:
        with torch.no_grad():
            yield
    finally:
        for name, quantized in swapped:
            replace_module(module, name, quantized)


def replace_module(module: nn.Module, name: str, new: nn.Module) -> None:
    """Put `new` where the submodule `name` of `module` is."""
    parent, _, child = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, child, new)
