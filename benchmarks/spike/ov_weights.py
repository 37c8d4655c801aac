"""ingot's weights as OpenVINO constants: read from the artifact's portable graph (model.onnx)
by OpenVINO's own ONNX frontend, and its linears rebuilt in OpenVINO's weight-compressed form.

The frontend keeps each ONNX initializer as a Constant named after it, in its ONNX type: the
int4 codes `layers.{i}.attn.qkv_proj.codes_t` [K, N] stay i4 (two per byte, first in the low
nibble), the scales `..scales_t` [K/g, N] f32 (docs/design.md section 4, "linears"). So the
weights here are ingot's own bytes, not a re-quantization.

OpenVINO's CPU plugin runs a MatMul as an int4 FullyConnected (weights decompressed inside the
kernel, activations quantized per group of 32 on the fly, DYNAMIC_QUANTIZATION_GROUP_SIZE)
when the weight is Constant(i4 [N, K/g, g]) -> Convert -> Multiply(scales [N, K/g, 1]) ->
Reshape [N, K] -> MatMul(x, W, transpose_b): optimum-intel's form. ingot's [K, N] orientation
converted as the ONNX frontend does it compiles too, but with a run-time Transpose of the
codes before every FullyConnected (route A's compiled graph), so the codes are transposed here
once, at build time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset16 as ops

__all__ = ["IngotWeights", "ModelShape", "pack_i4", "unpack_i4"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    max_seq_len: int


def unpack_i4(packed: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """int8 [prod(shape)] of signed 4-bit codes packed two per byte, first in the low nibble."""
    b = packed.view(np.int8).reshape(-1)
    low = (b << 4).astype(np.int8) >> 4  # sign-extends the low nibble
    high = b >> 4
    return np.stack([low, high], axis=-1).reshape(shape)


def pack_i4(codes: np.ndarray) -> ov.Tensor:
    """An i4 tensor of `codes` (int8 in [-8, 7]), packed as OpenVINO stores i4."""
    flat = codes.astype(np.int8).reshape(-1, 2)
    packed = ((flat[:, 0] & 0x0F) | (flat[:, 1] << 4)).astype(np.uint8)
    tensor = ov.Tensor(ov.Type.i4, ov.Shape(list(codes.shape)))
    tensor.data.view(np.uint8).reshape(-1)[:] = packed
    return tensor


class IngotWeights:
    """The constants of an artifact's portable graph, by initializer name, and its shape."""

    def __init__(self, artifact: Path | str) -> None:
        root = Path(artifact)
        manifest = json.loads((root / "manifest.json").read_text())
        config = json.loads((root / "config.json").read_text())
        model = manifest["model"]
        self.shape = ModelShape(
            num_layers=model["num_layers"],
            hidden=model["hidden_size"],
            num_heads=model["num_heads"],
            num_kv_heads=model["num_kv_heads"],
            head_dim=model["head_dim"],
            vocab=model["vocab_size"],
            rms_eps=float(config["rms_norm_eps"]),
            max_seq_len=model["max_seq_len"],
        )
        graph = ov.Core().read_model(str(root / manifest["graph"]["path"]))
        self._constants = {
            op.get_friendly_name(): op for op in graph.get_ops() if op.get_type_name() == "Constant"
        }
        self._graph = graph  # owns the constants' memory

    def has(self, name: str) -> bool:
        return name in self._constants

    def array(self, name: str) -> np.ndarray:
        return self._constants[name].data

    def constant(self, name: str) -> ov.Node:
        return self._constants[name]

    def linear(self, x: ov.Output, name: str) -> ov.Output:
        """y = x @ W for ingot's linear `name`: x [..., K] -> [..., N]."""
        codes = self._constants.get(f"{name}.codes_t")
        if codes is None:  # a float linear: fp32 [K, N]
            return ops.matmul(x, self.constant(f"{name}.weight_t"), False, False).output(0)
        k, n = (int(d) for d in codes.get_output_shape(0))
        scales = self.array(f"{name}.scales_t")  # [K/g, N], or [N] per channel
        element = codes.get_output_element_type(0)
        if element == ov.Type.i4:
            values = unpack_i4(codes.data, (k, n)).T  # [N, K]
        elif element == ov.Type.i8:
            values = codes.data.reshape(k, n).T
        else:
            raise ValueError(f"{name}: codes of type {element} (expected i4 or i8)")
        groups = 1 if scales.ndim == 1 else scales.shape[0]
        values = np.ascontiguousarray(values).reshape(n, groups, k // groups)  # [N, K/g, g]
        weight = ops.constant(pack_i4(values) if element == ov.Type.i4 else values)  # or i8
        group_scales = scales.reshape(groups, n).T.reshape(n, groups, 1).astype(np.float32)
        w = ops.convert(weight, ov.Type.f32)
        w = ops.multiply(w, ops.constant(np.ascontiguousarray(group_scales)))  # [N, K/g, g]
        w = ops.reshape(w, ops.constant(np.array([n, k], np.int64)), False)  # [N, K]
        return ops.matmul(x, w, False, True).output(0)
