"""ingot's weights as OpenVINO constants: read by OpenVINO's own ONNX frontend from the graph the
engine's record names -- the onnxruntime engine's optimized graph where the artifact ships one
(its only copy of the weights), else the portable graph (model.onnx) -- its linears rebuilt in
OpenVINO's weight-compressed form.

The frontend keeps each ONNX initializer as a Constant named after it, in its ONNX type: the
int4 codes `layers.{i}.attn.qkv_proj.codes_t` [K, N] stay i4 / u4 (two per byte, first in the
low nibble), the scales `..scales_t` [K/g, N] (or [N] per channel) f32, the zero points
`..zero_points_t` as the codes (pipeline/export/weights.py writes them). So the weights are the
artifact's own bytes, not a re-quantization.

OpenVINO's CPU plugin runs a MatMul as a weight-compressed FullyConnected (weights decompressed
inside the kernel, activations quantized per group on the fly where
DYNAMIC_QUANTIZATION_GROUP_SIZE asks) when the weight is Constant(codes [N, K/g, g]) -> Convert
(-> Subtract(zero points [N, K/g, 1])) -> Multiply(scales [N, K/g, 1]) -> Reshape [N, K] ->
MatMul(x, W, transpose_b): the form optimum-intel writes. ingot's [K, N] orientation would
compile too, but with a run-time Transpose of the codes before every FullyConnected, so the
codes are transposed here once, at load.

The onnxruntime engine's graph holds each quantized linear as ORT's MatMulNBits inputs, which
the frontend keeps as Constants named after them: `{name}.codes_t_T` u4 / u8 [N, K/g, g]
(ORT stores codes unsigned: a signed code + 8, or + 128 at 8 bits), `{name}.scales_t_T` f32
[N*K/g] and, where asymmetric, `{name}.zero_points_t_T` [N, K/g, 1]; without zero points the
kernel subtracts the middle code (8 / 128). That is OpenVINO's orientation already: the
constants are used as they are, no code is copied or transposed in Python.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ingot.runtime.engines.base import SessionError

__all__ = ["GraphWeights"]

# The code types a compressed linear may have, and whether they are signed.
_CODES = {ov.Type.i4: True, ov.Type.u4: False, ov.Type.i8: True, ov.Type.u8: False}
_FOUR_BIT = (ov.Type.i4, ov.Type.u4)
_FUSED = ".codes_t_T"  # the suffix of a linear's codes in ORT's MatMulNBits form


def _unpack4(packed: np.ndarray, count: int, signed: bool) -> np.ndarray:
    """int8 / uint8 [count] from 4-bit codes packed two per byte, the first in the low nibble."""
    b = packed.reshape(-1).view(np.int8 if signed else np.uint8)
    if signed:
        low, high = (b << 4).astype(np.int8) >> 4, b >> 4  # sign-extending shifts
    else:
        low, high = b & 0x0F, b >> 4
    return np.stack([low, high], axis=-1).reshape(-1)[:count]


def _pack4(values: np.ndarray, element: ov.Type) -> ov.Tensor:
    """An OpenVINO i4 / u4 tensor of `values` (one code per byte), packed as OpenVINO stores
    them (the first in the low nibble)."""
    flat = values.astype(np.uint8).reshape(-1, 2)  # two's complement nibbles for i4
    packed = (flat[:, 0] & 0x0F) | ((flat[:, 1] & 0x0F) << 4)
    tensor = ov.Tensor(element, ov.Shape(list(values.shape)))
    tensor.data.view(np.uint8).reshape(-1)[:] = packed
    return tensor


class GraphWeights:
    """The initializers of an exported graph, by name, and the few facts about its structure
    the rebuild needs (`norm_epsilon`, `entering_layers`, `pool_heads`)."""

    def __init__(self, path: Path | str) -> None:
        self._graph = ov.Core().read_model(str(path))  # owns the constants' memory
        self._ops = {op.get_friendly_name(): op for op in self._graph.get_ops()}
        self._constants = {
            name: op for name, op in self._ops.items() if op.get_type_name() == "Constant"
        }
        self._built: dict[str, ov.Output] = {}  # name -> its compressed weight subgraph

    def has(self, name: str) -> bool:
        return name in self._constants

    def names(self, prefix: str) -> list[str]:
        """The initializers whose names start with `prefix`."""
        return [name for name in self._constants if name.startswith(prefix)]

    def constant(self, name: str) -> ov.Node:
        if name not in self._constants:
            raise SessionError(f"the graph has no initializer {name!r}")
        return self._constants[name]

    def op_type(self, name: str) -> str | None:
        """The type of the graph's op `name` (its ONNX node's name), None without one."""
        op = self._ops.get(name)
        return None if op is None else op.get_type_name()

    def factor(self, name: str) -> ov.Output | None:
        """The constant the graph's Mul `name` multiplies by (the frontend may rename the
        initializer: an ONNX Runtime graph shares one under several names), None without
        that Mul."""
        op = self._ops.get(name)
        if op is None or op.get_type_name() != "Multiply":
            return None
        for value in op.input_values():
            if value.get_node().get_type_name() == "Constant":
                return value
        raise SessionError(f"the graph's {name} multiplies by no constant")

    def array(self, name: str) -> np.ndarray:
        return self.constant(name).data

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.constant(name).get_output_shape(0))

    def pool_heads(self) -> tuple[int, int]:
        """(Hkv, D) of the graph's pool inputs k_pool_0 [NB, B, Hkv, D]."""
        pool = self._ops.get("k_pool_0")
        if pool is None or pool.get_type_name() != "Parameter":
            raise SessionError("the graph has no pool input 'k_pool_0': not ingot's interface")
        dims = pool.get_output_partial_shape(0)
        return dims[2].get_length(), dims[3].get_length()

    def norm_epsilon(self, name: str) -> float:
        """The epsilon of the norm `name` (RMSNormalization `{name}/RMSNorm`, which the
        frontend decomposes into ... Add(mean(x^2), eps) -> Sqrt ...)."""
        node = self._ops.get(f"{name}/RMSNorm")
        pending = [node] if node is not None else []
        for _ in range(8):  # a few ops upstream: Multiply, Multiply, Power, Sqrt, Add
            upstream = []
            for op in pending:
                if op.get_type_name() == "Sqrt":
                    add = op.input_value(0).get_node()
                    for value in add.input_values():
                        source = value.get_node()
                        if source.get_type_name() == "Constant" and source.data.size == 1:
                            return float(source.data.reshape(-1)[0])
                upstream += [v.get_node() for v in op.input_values()]
            pending = upstream
        raise SessionError(f"{name}: no RMSNormalization epsilon found in the graph")

    def entering_layers(self, output: str) -> list[int]:
        """The layers whose entering residual streams the graph output `output` joins (an
        EAGLE-3 target's `aux_hidden`, a Concat): layer 0's is the embedding's Gather, layer
        i's the previous layer's `layers.{i-1}/mlp_residual`."""
        produced = [r.input_value(0) for r in self._graph.get_results()]
        concat = next((v.get_node() for v in produced if output in v.get_names()), None)
        if concat is None or concat.get_type_name() != "Concat":
            raise SessionError(f"the graph has no {output!r} output joining layers' streams")
        layers = []
        for value in concat.input_values():
            name = value.get_node().get_friendly_name()
            if name.startswith("embed_tokens/"):  # the Gather, or a quantized table's rows
                layers.append(0)
            elif name.startswith("layers.") and name.endswith("/mlp_residual"):
                layers.append(int(name.split(".")[1].split("/")[0]) + 1)
            else:
                raise SessionError(f"{output}: joins {name!r}, not a layer's entering stream")
        return layers

    def linear_columns(self, name: str) -> int | None:
        """Output width N of linear `name`, None where the graph has no such linear."""
        if self.has(name + _FUSED):
            return self.shape(name + _FUSED)[0]  # [N, K/g, g]
        for suffix in (".codes_t", ".weight_t"):
            if self.has(name + suffix):
                return self.shape(name + suffix)[1]  # [K, N]
        return None

    def embedding(self, ids: ov.Output) -> ov.Output:
        """The rows of `ids` [T] -> [T, hidden]: of the float table `embed_tokens.weight`, or
        of the quantized one (`embed_tokens.codes_t` [hidden, V], as a linear's, or a tied
        table's MatMulNBits form `embed_tokens.codes_t_T` [V, hidden/g, g]) through the
        same compressed-weight subgraph a tied lm_head reads, which the CPU plugin gathers
        from as codes (its GatherCompressed), never as a float table."""
        axis0 = ops.constant(np.int64(0))
        if self.has("embed_tokens.weight"):
            return ops.gather(self.constant("embed_tokens.weight"), ids, axis0).output(0)
        return ops.gather(self._compressed("embed_tokens"), ids, axis0).output(0)

    def linear(self, x: ov.Output, name: str) -> ov.Output:
        """y = x @ W (+ bias) for ingot's linear `name`: x [..., K] -> [..., N]."""
        refused = self.names(f"{name}.input_") + self.names(f"{name}.weight_scale")
        if refused:
            raise SessionError(
                f"{name}: its inputs are quantized too (W8A8 / FP8 activations, initializer "
                f"{refused[0]!r}); this engine runs weight-only quantized or float linears"
            )
        if self.has(f"{name}.weight_t"):  # a float linear: fp32 [K, N]
            y = ops.matmul(x, self.constant(f"{name}.weight_t"), False, False).output(0)
        else:
            y = ops.matmul(x, self._compressed(name), False, True).output(0)
        if self.has(f"{name}.bias"):
            y = ops.add(y, self.constant(f"{name}.bias")).output(0)
        return y

    def _compressed(self, name: str) -> ov.Output:
        """The dequantized weight [N, K] of `name`'s codes, scales and zero points, in ORT's
        MatMulNBits form where the graph has it (a tied table's lookup reads that form too:
        pipeline/engines/onnxruntime/shared_embedding.py); built once per name, so a tied
        model's lookup and lm_head read one constant."""
        if name not in self._built:
            fused = self.has(name + _FUSED)  # the onnxruntime engine's MatMulNBits form
            self._built[name] = self._fused(name) if fused else self._decompression(name)
        return self._built[name]

    def _decompression(self, name: str) -> ov.Output:
        codes = self.constant(f"{name}.codes_t")
        element = codes.get_output_element_type(0)
        if element not in _CODES:
            raise SessionError(
                f"{name}: weight codes of type {element} (FP8 weights): this engine runs int4 / "
                "int8 codes with scales (and zero points) or float weights"
            )
        k, n = self.shape(f"{name}.codes_t")
        scales = self.array(f"{name}.scales_t").astype(np.float32)  # [K/g, N], or [N]
        groups = 1 if scales.ndim == 1 else scales.shape[0]
        zeros = self._codes(f"{name}.zero_points_t") if self.has(f"{name}.zero_points_t") else None
        values = self._codes(f"{name}.codes_t").reshape(k, n).T  # [N, K]
        values = np.ascontiguousarray(values).reshape(n, groups, k // groups)  # [N, K/g, g]
        weight = _pack4(values, element) if element in _FOUR_BIT else values
        w = ops.convert(ops.constant(weight), ov.Type.f32)
        if zeros is not None:
            zero = np.ascontiguousarray(zeros.reshape(groups, n).T.reshape(n, groups, 1))
            zero = _pack4(zero, element) if element in _FOUR_BIT else zero
            w = ops.subtract(w, ops.convert(ops.constant(zero), ov.Type.f32))
        group_scales = np.ascontiguousarray(scales.reshape(groups, n).T.reshape(n, groups, 1))
        w = ops.multiply(w, ops.constant(group_scales))  # [N, K/g, g]
        return ops.reshape(w, ops.constant(np.array([n, k], np.int64)), False).output(0)

    def _fused(self, name: str) -> ov.Output:
        """The dequantized weight [N, K] of `name` in ORT's MatMulNBits form (module
        docstring): the frontend's constants, reshaped in the graph, not copied."""
        codes = self.constant(name + _FUSED)  # u4 / u8 [N, K/g, g]
        element = codes.get_output_element_type(0)
        n, groups, group = self.shape(name + _FUSED)
        w = ops.convert(codes, ov.Type.f32)
        zero_name = f"{name}.zero_points_t_T"
        if self.has(zero_name):
            zero = ops.reshape(self.constant(zero_name), _dims(n, groups, 1), False)
        else:
            zero = _middle_code(element)
        w = ops.subtract(w, ops.convert(zero, ov.Type.f32))
        scales = ops.reshape(self.constant(f"{name}.scales_t_T"), _dims(n, groups, 1), False)
        w = ops.multiply(w, ops.convert(scales, ov.Type.f32))  # [N, K/g, g]
        return ops.reshape(w, _dims(n, groups * group), False).output(0)

    def _codes(self, name: str) -> np.ndarray:
        """The codes of initializer `name`, one per byte (int8 or uint8), flat."""
        node = self.constant(name)
        element = node.get_output_element_type(0)
        count = int(np.prod(self.shape(name)))
        if element in _FOUR_BIT:
            return _unpack4(node.data, count, _CODES[element])
        return node.data.reshape(-1)


def _dims(*dims: int) -> ov.Node:
    return ops.constant(np.array(dims, np.int64))


def _middle_code(element: ov.Type) -> ov.Node:
    """MatMulNBits' zero point where the graph gives none: 8 for u4 codes, 128 for u8."""
    if element == ov.Type.u4:
        return ops.constant(_u4_scalar(8))
    if element == ov.Type.u8:
        return ops.constant(np.array([128], np.uint8))
    raise SessionError(f"MatMulNBits codes of type {element}: expected u4 or u8")


def _u4_scalar(value: int) -> ov.Tensor:
    """A u4 tensor [1] holding `value` (one nibble: the low half of its byte)."""
    tensor = ov.Tensor(ov.Type.u4, ov.Shape([1]))
    tensor.data.view(np.uint8).reshape(-1)[:] = value & 0x0F
    return tensor
