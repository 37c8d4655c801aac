"""Linears that quantize their inputs (W8A8 int8, FP8) as ONNX: the IR's steps
(pipeline/model/input_quant.py), operator for operator.

- int8, dynamic per token: s = Max(ReduceMax(|x|) / 127, EPS) [..., 1]; the codes
  Round(x / s) + 128 as uint8 go to MatMulInteger against the int8 weights [K, N] with a
  zero point of 128 (ONNX Runtime's u8s8 GEMM, VNNI on x86; it has no fast s8s8 kernel), then
  Cast -> Mul(s) -> Mul(weight scale [N]). Integer arithmetic is exact, so this matches the IR
  bit for bit given the same x. A per-token scale cannot be expressed as Q/DQ that ORT fuses
  (its QDQ fusions want constant scales; measured 3.5x slower than this form), so this
  dynamic form is not the Q/DQ one TensorRT reads.
- int8, static per tensor: x -> QuantizeLinear -> DequantizeLinear (int8, zero point 0) ->
  MatMul <- DequantizeLinear(int8 weights, zero point 0, per channel): the Q/DQ form TensorRT
  accepts and ORT fuses into MatMulIntegerToFloat.
- fp8: Q/DQ with FLOAT8E4M3FN (blocked, one block per token, for dynamic scales), then a float
  MatMul with the dequantized FP8 weights: ORT's CPU has no FP8 GEMM, so FP8 saves storage and
  memory bandwidth only.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..model.input_quant import EPS
from ..model.qlinear import QuantizedLinear
from .graph import GraphBuilder

__all__ = ["emit_input_quantized"]


def emit_input_quantized(g: GraphBuilder, x: str, q: QuantizedLinear, w: str, name: str) -> str:
    """y = quantized(x) @ W (no bias): x [..., K] -> [..., N]. ``w`` is the weight as the scheme
    reads it: the int8 codes [K, N] for int8 inputs, the DequantizeLinear output for FP8."""
    scheme = q.input_quant
    assert scheme is not None and scheme.calibrated, f"{name}: inputs not quantized"
    if scheme.dtype == "int8" and not scheme.static:
        return _int8_per_token(g, x, q, w, name)
    if scheme.dtype == "int8":
        return _int8_per_tensor(g, x, q, w, name)
    if scheme.static:
        s = g.array(f"{name}.input_scale", np.array(scheme.scale, np.float32))
        attrs: dict[str, int] = {}
    else:
        s = _token_scale(g, x, scheme.max_value, name)  # [..., 1]
        attrs = {"axis": -1, "block_size": q.in_features}  # one block: the whole token
    f8 = TensorProto.FLOAT8E4M3FN
    xq = g.op("QuantizeLinear", [x, s], f"{name}/input_quantize", output_dtype=f8, **attrs)
    xd = g.op("DequantizeLinear", [xq, s], f"{name}/input_dequantize", **attrs)
    return g.op("MatMul", [xd, w], f"{name}/MatMul")


def _int8_per_tensor(g: GraphBuilder, x: str, q: QuantizedLinear, codes: str, name: str) -> str:
    # Explicit zero points (0): ORT's QDQ fusion into MatMulIntegerToFloat looks for them.
    zero = g.array(f"{name}.input_zero_point", np.array(0, np.int8))
    s = g.array(f"{name}.input_scale", np.array(q.input_quant.scale, np.float32))
    w_zero = g.array(f"{name}.weight_zero_point", np.zeros(q.out_features, np.int8))
    w_scale = g.array(f"{name}.weight_scale", q.scales[:, 0].numpy())  # [N]
    w = g.op("DequantizeLinear", [codes, w_scale, w_zero], f"{name}/DequantizeLinear", axis=1)
    xq = g.op("QuantizeLinear", [x, s, zero], f"{name}/input_quantize")
    xd = g.op("DequantizeLinear", [xq, s, zero], f"{name}/input_dequantize")
    return g.op("MatMul", [xd, w], f"{name}/MatMul")


def _token_scale(g: GraphBuilder, x: str, max_value: float, name: str) -> str:
    """max(max |x| over the last axis / max_value, EPS): [..., K] -> [..., 1]."""
    peak = g.op(
        "ReduceMax",
        [g.op("Abs", [x], f"{name}/input_abs"), _last_axis(g, name)],
        f"{name}/input_max",
        keepdims=1,
    )
    s = g.op(
        "Div",
        [peak, g.array(f"{name}.input_range", np.array(max_value, np.float32))],
        f"{name}/input_scale",
    )
    return g.op(
        "Max",
        [s, g.array(f"{name}.input_eps", np.array(EPS, np.float32))],
        f"{name}/input_scale_floor",
    )


def _last_axis(g: GraphBuilder, name: str) -> str:
    return g.ints(f"{name}.input_axes", [-1])


def _int8_per_token(g: GraphBuilder, x: str, q: QuantizedLinear, codes: str, name: str) -> str:
    s = _token_scale(g, x, q.input_quant.max_value, name)  # [..., 1]
    r = g.op("Round", [g.op("Div", [x, s], f"{name}/input_div")], f"{name}/input_round")
    offset = g.array(f"{name}.input_offset", np.array(128, np.float32))
    shifted = g.op("Add", [r, offset], f"{name}/input_shift")  # [1, 255]: exact in float
    xu = g.op("Cast", [shifted], f"{name}/input_uint8", to=TensorProto.UINT8)
    zero = g.array(f"{name}.input_zero_point", np.array(128, np.uint8))
    acc = g.op("MatMulInteger", [xu, codes, zero], f"{name}/MatMulInteger")  # [..., N] int32
    y = g.op("Cast", [acc], f"{name}/acc_float", to=TensorProto.FLOAT)
    y = g.op("Mul", [y, s], f"{name}/input_rescale")
    weight_scale = g.array(f"{name}.weight_scale", q.scales[:, 0].numpy())  # [N]
    return g.op("Mul", [y, weight_scale], f"{name}/weight_rescale")
