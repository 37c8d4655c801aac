"""Linear layers as ONNX: float MatMul, or integer / FP8 codes behind DequantizeLinear -> MatMul
(linears that also quantize their inputs: input_quant.py).

Weights are stored [K, N] (transposed from PyTorch's [N, K]) so that ``x @ W`` is a plain MatMul
and the quantization blocks run along axis 0 (K): that is the form ONNX Runtime rewrites into
``MatMulNBits`` (int4/uint4/int8/uint8, blocked or per-axis). The graph holds the standard
DequantizeLinear, not ORT's contrib op, so that it stays plain opset-23 ONNX; weight-only Q/DQ
is also the form TensorRT's ONNX parser was meant to read (symmetric codes only), but no
TensorRT engine is built today.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np
import torch
from torch import nn

from ..model.qlinear import QuantizedLinear
from .errors import ExportError
from .graph import GraphBuilder
from .input_quant import emit_input_quantized

__all__ = ["emit_linear", "emit_linears", "emit_dequantized_weight", "emit_weight_codes"]


def emit_linear(
    g: GraphBuilder, x: str, module: nn.Module, name: str, out: str | None = None
) -> str:
    """y = x @ W^T (+ bias) for an ``nn.Linear`` or a ``QuantizedLinear``; x: [..., K] -> [..., N].

    ``out`` names the result (a graph output such as ``logits``); otherwise it is generated.
    """
    quantized_inputs = isinstance(module, QuantizedLinear) and module.input_quant is not None
    if quantized_inputs and not module.input_quant.calibrated:
        raise ExportError(f"{name}: static input scale was never calibrated")
    if quantized_inputs and module.input_quant.dtype == "int8":
        w = g.rows(f"{name}.codes_t", _numpy(module.codes).T)  # [K, N] int8, read as integers
    elif isinstance(module, QuantizedLinear):
        w = emit_dequantized_weight(g, module, name)  # [K, N] float32
    elif isinstance(module, nn.Linear):
        w = g.rows(f"{name}.weight_t", _numpy(module.weight.float()).T)  # [K, N]
    else:
        raise ExportError(f"{name}: cannot export a {type(module).__name__} as a linear layer")
    last = out if module.bias is None else None
    if quantized_inputs:
        y = emit_input_quantized(g, x, module, w, name)
        if last is not None:  # a named output: the last node must produce it
            return g.op("Identity", [y], f"{name}/out", out=last)
    else:
        y = g.op("MatMul", [x, w], f"{name}/MatMul", out=last)
    if module.bias is None:
        return y
    bias = g.array(f"{name}.bias", _numpy(module.bias.float()))
    return g.op("Add", [y, bias], f"{name}/Add", out=out)


def emit_linears(
    g: GraphBuilder,
    x: str,
    modules: Sequence[nn.Module],
    names: Sequence[str],
    fused_name: str,
    outs: Sequence[str | None] | None = None,
) -> list[str]:
    """``x @ W_i^T (+ b_i)`` for linears that read the same ``x``: [..., K] -> [[..., N_i]].

    Where they share one weight scheme (all float, or the same bits, group size, symmetry and
    bias presence) they become one MatMul over the weights concatenated along N, named
    ``fused_name``, and a Split. Each output column is the same dot product either way; one
    MatMul reads ``x`` once and, in ONNX Runtime, quantizes it once for the int8-activation
    kernels, and saves a kernel launch per linear (the cost that dominates small models).
    """
    outs = list(outs) if outs is not None else [None] * len(modules)
    fused = _concatenated(modules, fused_name)
    if fused is None:
        return [
            emit_linear(g, x, m, n, out=o) for m, n, o in zip(modules, names, outs, strict=True)
        ]
    y = emit_linear(g, x, fused, fused_name)  # [..., sum N_i]
    return g.split(y, [m.out_features for m in modules], f"{fused_name}/Split", outs)


def _concatenated(modules: Sequence[nn.Module], name: str) -> nn.Module | None:
    """The linears stacked along N as one module, or None when their schemes differ."""
    first = modules[0]
    has_bias = {m.bias is not None for m in modules}
    if len(has_bias) != 1:
        return None
    bias = torch.cat([m.bias.detach() for m in modules]) if first.bias is not None else None
    if all(type(m) is nn.Linear for m in modules):
        weight = torch.cat([m.weight.detach() for m in modules])  # [sum N, K]
        # On the meta device: no initialized weight to allocate, only to replace.
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        fused.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            fused.bias = nn.Parameter(bias, requires_grad=False)
        return fused
    if not all(isinstance(m, QuantizedLinear) for m in modules):
        return None
    scheme = {
        (m.bits, m.group_size, m.codes.dtype, m.symmetric, m.g_idx is None, m.input_quant)
        for m in modules
    }
    if len(scheme) != 1 or first.g_idx is not None:
        return None
    zeros = None if first.symmetric else torch.cat([m.zero_points for m in modules])
    return QuantizedLinear(
        torch.cat([m.codes for m in modules]),  # [sum N, K]
        torch.cat([m.scales for m in modules]),  # [sum N, K / g]
        zeros,
        first.bits,
        first.group_size,
        bias=bias,
        input_quant=first.input_quant,
    )


def emit_dequantized_weight(g: GraphBuilder, q: QuantizedLinear, name: str) -> str:
    """DequantizeLinear of the transposed codes: bitwise equal to ``q.dequantize().T``."""
    if q.fp8:
        return _dequantized_fp8(g, q, name)
    inputs, attrs = emit_weight_codes(g, q, name)
    return g.op("DequantizeLinear", inputs, f"{name}/DequantizeLinear", **attrs)


def emit_weight_codes(
    g: GraphBuilder, q: QuantizedLinear, name: str
) -> tuple[list[str], dict[str, int]]:
    """The initializers of integer codes (codes_t [K, N], scales_t [K/g, N] or [N], zero
    points as the codes) and the DequantizeLinear attributes that dequantize them: what a
    linear's weight reads, and a tied quantized embedding's gather too."""
    if q.g_idx is not None:
        raise ExportError(
            f"{name}: g_idx is set (act-order quantization); exporting permuted groups is not "
            "supported yet (it arrives with GPTQ export). Quantize without act order."
        )
    n, k = q.codes.shape
    signed = q.codes.dtype == torch.int8
    # Any width the IR's codes hold (one byte each); `_codes` picks the ONNX type.
    if q.codes.dtype not in (torch.int8, torch.uint8) or not 1 <= q.bits <= 8:
        raise ExportError(f"{name}: unsupported codes {q.codes.dtype} with bits={q.bits}")
    lo, hi = (-(2 ** (q.bits - 1)), 2 ** (q.bits - 1) - 1) if signed else (0, 2**q.bits - 1)
    codes = _numpy(q.codes)
    if codes.min() < lo or codes.max() > hi:
        raise ExportError(f"{name}: codes outside the {q.bits}-bit range [{lo}, {hi}]")
    if q.zero_points is not None and q.zero_points.dtype != q.codes.dtype:
        raise ExportError(f"{name}: zero points {q.zero_points.dtype} != codes {q.codes.dtype}")

    per_channel = q.group_size == k
    if per_channel:
        # One scale per output column: per-axis DequantizeLinear along N.
        attrs: dict[str, int] = {"axis": 1}
        scales = _numpy(q.scales)[:, 0]  # [N]
        zeros = None if q.zero_points is None else _numpy(q.zero_points)[:, 0]  # [N]
    else:
        attrs = {"axis": 0, "block_size": q.group_size}
        scales = _numpy(q.scales).T  # [K/g, N]
        zeros = None if q.zero_points is None else _numpy(q.zero_points).T  # [K/g, N]

    inputs = [
        _codes(g, f"{name}.codes_t", codes.T, q.bits, signed),  # [K, N]
        g.rows(f"{name}.scales_t", scales.astype(np.float32, copy=False)),
    ]
    if zeros is not None:
        inputs.append(_codes(g, f"{name}.zero_points_t", zeros, q.bits, signed))
    return inputs, attrs


def _dequantized_fp8(g: GraphBuilder, q: QuantizedLinear, name: str) -> str:
    """FP8 codes [K, N] with one scale per output column (axis 1), or one scalar when every
    column shares it (per-tensor weights)."""
    scales = _numpy(q.scales)[:, 0]  # [N]
    codes = _numpy(q.codes.view(torch.uint8)).view(ml_dtypes.float8_e4m3fn)  # [N, K]
    inputs = [g.rows(f"{name}.codes_t", codes.T)]
    if np.all(scales == scales[0]):
        inputs.append(g.array(f"{name}.scale", scales[:1].reshape(())))
        return g.op("DequantizeLinear", inputs, f"{name}/DequantizeLinear")
    inputs.append(g.rows(f"{name}.scales_t", scales.astype(np.float32, copy=False)))
    return g.op("DequantizeLinear", inputs, f"{name}/DequantizeLinear", axis=1)


def _codes(g: GraphBuilder, name: str, values: np.ndarray, bits: int, signed: bool) -> str:
    """Codes (a transposed view, one per byte) streamed in row blocks: never copied whole. In
    the narrowest ONNX integer type that holds the IR's ``bits``: (U)INT4, else (U)INT8."""
    if bits <= 4:
        return g.int4(name, values, signed)
    return g.rows(name, values.astype(np.int8 if signed else np.uint8, copy=False))


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
