"""Mixture-of-experts blocks for ONNX Runtime's CPU: the exported graph's standard block
(export/moe.py) replaced, when the engine is built, by ORT's fused ``com.microsoft.QMoE``.

The standard block runs every expert as its own small subgraph (a Slice of its rows, its
MatMulNBits, the SwiGLU), about 6 nodes per expert whether or not a token chose it, plus the
routing's sort: at batch 1 that per-node cost makes the block ~1.4x a dense MLP of the same
active width, where QMoE (one node: top-k, renormalisation and the chosen experts' int4
GEMMs in MLAS's blockwise kernels) costs about what the dense MLP does
(benchmarks/results/moe_decode.md). ORT 1.32's CPU QMoE picks the top-k by the router's
logits (``router_probs``) and mixes with the chosen entries of ``router_weights`` (here the
softmax over every expert, as the IR: renormalised over the chosen when
``normalize_routing_weights``; without router_weights its unnormalised weights are not the
IR's, measured). It takes SwiGLU experts only with gate and up interleaved row by row
(``swiglu_fusion=1``), 4-bit codes stored as unsigned bytes [E, N, K/2] (two per byte, low
nibble first; the zero point 8 unless given), blocked along K (block sizes a power of two >=
16) or per output channel. Its 8-bit experts compute with int8 activations at every accuracy
level, so they would not be the exported graph's numbers: only 4-bit experts are rewritten;
any other block (float, FP8, 8-bit, W8A8 experts, another activation) stays the standard
graph, which ORT runs as it is.

The rewrite is exact: QMoE dequantizes the same codes with the same scales; with fp32
activations (``accuracy_level`` 0) its outputs match the standard block's to fp32 rounding,
so the build's exact check still holds. Its ``accuracy_level`` follows the target's
``matmul_accuracy_level`` (4: int8 activations, as the MatMulNBits around it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .rewrite import save_rewritten

__all__ = ["fuse_experts", "moe_blocks"]

_CONTRIB = "com.microsoft"
_SIGNED_4BIT, _UNSIGNED_4BIT = TensorProto.INT4, TensorProto.UINT4


@dataclass(frozen=True, slots=True)
class _Linear:
    """One expert linear as the exported graph holds it: codes [K, N] (int8 values of 4-bit
    codes), scales [K/g, N] (blocked) or [N] (per channel), zero points like the scales."""

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    block_size: int | None


def moe_blocks(graph: onnx.GraphProto) -> list[str]:
    """The IR names (``layers.{i}.mlp``) of the graph's mixture-of-experts blocks."""
    suffix = "/Softmax"
    return [
        n.name[: -len(suffix)]
        for n in graph.node
        if n.op_type == "Softmax" and n.name.endswith(suffix) and ".mlp" in n.name
    ]


def fuse_experts(onnx_path: Path, out_dir: Path, accuracy_level: int) -> int:
    """Write ``out_dir/model.onnx`` (+ data): the graph at ``onnx_path`` with each of its
    mixture-of-experts blocks whose experts are SwiGLU with 4-bit weights replaced by one QMoE
    node. Returns how many were replaced; 0 writes nothing. Holds the model's weights in memory
    once, as ONNX Runtime does when it builds the engine next (fp8_weights.py does the same)."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    blocks = [m for m in moe_blocks(model.graph) if _fits(model.graph, m)]
    if not blocks:
        return 0
    onnx.load_external_data_for_model(model, str(onnx_path.parent))
    for m in blocks:
        _replace_block(model.graph, m, accuracy_level)
    if not any(o.domain == _CONTRIB for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_CONTRIB, 1))
    save_rewritten(model, out_dir)
    return len(blocks)


def _fits(graph: onnx.GraphProto, m: str) -> bool:
    """Whether block ``m``'s experts are what CPU QMoE runs exactly: SwiGLU, gate|up fused
    and down as 4-bit DequantizeLinear of initializers with blocks of a power of two >= 16
    (or per channel)."""
    nodes = {n.name: n for n in graph.node if n.name.startswith(f"{m}.experts.")}
    inits = {t.name: t for t in graph.initializer if t.name.startswith(f"{m}.experts.")}
    count = _expert_count(nodes, m)
    for e in range(count):
        x = f"{m}.experts.{e}"
        if f"{x}/silu" not in nodes:
            return False
        for linear in ("gate_up_proj", "down_proj"):
            dq = nodes.get(f"{x}.{linear}/DequantizeLinear")
            codes = inits.get(f"{x}.{linear}.codes_t")
            if dq is None or codes is None or dq.input[0] != codes.name:
                return False
            if codes.data_type not in (_SIGNED_4BIT, _UNSIGNED_4BIT):
                return False
            block = _attribute(dq, "block_size", 0)
            if block and (block < 16 or block & (block - 1)):
                return False
    return count > 0


def _expert_count(nodes: dict[str, onnx.NodeProto], m: str) -> int:
    """How many experts block ``m`` has: each one's rows are a Slice ``{m}.experts.{e}/rows``."""
    count = 0
    while f"{m}.experts.{count}/rows" in nodes:
        count += 1
    return count


def _replace_block(graph: onnx.GraphProto, m: str, accuracy_level: int) -> None:
    """Block ``m``'s routing and experts -> one QMoE node; its input reshape, router and
    output reshape stay (export/moe.py's names)."""
    nodes = list(graph.node)
    by_name = {n.name: n for n in nodes}
    inits = {t.name: t for t in graph.initializer}
    rows = by_name[f"{m}/rows"].output[0]  # [T, hidden]
    logits = by_name[f"{m}/Softmax"].input[0]  # [T, E]
    experts_out = by_name[f"{m}/experts"].output[0]  # [T, hidden]
    top_k = int(numpy_helper.to_array(by_name[f"{m}.k"].attribute[0].t)[0])
    renormalise = f"{m}/renormalise" in by_name

    count = _expert_count(by_name, m)
    gate_up = [_read(by_name, inits, f"{m}.experts.{e}.gate_up_proj") for e in range(count)]
    down = [_read(by_name, inits, f"{m}.experts.{e}.down_proj") for e in range(count)]
    fc1 = [_interleaved(linear) for linear in gate_up]  # gate and up rows alternating
    fc1_inputs = _stacked(f"{m}.qmoe.fc1", fc1)
    fc2_inputs = _stacked(f"{m}.qmoe.fc2", down)
    block = gate_up[0].block_size
    fc1_names, fc2_names = ([t.name if t else "" for t in ts] for ts in (fc1_inputs, fc2_inputs))
    probs = by_name[f"{m}/Softmax"].output[0]  # [T, E]: the softmax over every expert
    inputs = [rows, logits, *fc1_names[:2], "", *fc2_names[:2], "", "", "", ""]
    inputs += [fc1_names[2], fc2_names[2], ""]  # zero points ("" when symmetric), no fc3
    # The mixing weights: the chosen experts' softmax over all, renormalised or not. Without
    # router_weights, CPU QMoE's unnormalised weights are not those (measured).
    inputs.append(probs)
    qmoe = helper.make_node(
        "QMoE",
        inputs,
        [experts_out],
        name=f"{m}/QMoE",
        domain=_CONTRIB,
        k=top_k,
        normalize_routing_weights=int(renormalise),
        activation_type="swiglu",
        swiglu_fusion=1,  # gate and up interleaved: the only SwiGLU layout CPU QMoE takes
        activation_alpha=1.0,  # silu(g) * (u + 0): the IR's SwiGLU
        activation_beta=0.0,
        expert_weight_bits=4,
        accuracy_level=accuracy_level,
        **({"block_size": block} if block else {}),
    )
    keep = {f"{m}/rows", f"{m}.shape.rows", f"{m}/Softmax", f"{m}/out", f"{m}/shape"}
    router = f"{m}.router/"
    dropped = {
        n.name
        for n in nodes
        if n.name.startswith((f"{m}/", f"{m}."))
        and n.name not in keep
        and not n.name.startswith(router)
    }
    at = next(i for i, n in enumerate(nodes) if n.name == f"{m}/experts")
    new = [n for n in nodes[:at] if n.name not in dropped] + [qmoe]
    new += [n for n in nodes[at:] if n.name not in dropped]
    del graph.node[:]
    graph.node.extend(new)
    graph.initializer.extend(t for t in fc1_inputs + fc2_inputs if t is not None)


def _read(by_name: dict, inits: dict, name: str) -> _Linear:
    """The codes, scales and zero points of the exported linear ``name``."""
    dq = by_name[f"{name}/DequantizeLinear"]
    arrays = [numpy_helper.to_array(inits[i]) for i in dq.input if i]
    codes = arrays[0].astype(np.int8)  # [K, N] 4-bit values
    scales = arrays[1].astype(np.float32)
    zeros = arrays[2].astype(np.int8) if len(arrays) > 2 else None
    if zeros is None and inits[dq.input[0]].data_type == _UNSIGNED_4BIT:
        zeros = np.zeros_like(scales, dtype=np.int8)  # unsigned codes, zero point 0
    return _Linear(codes, scales, zeros, _attribute(dq, "block_size", 0) or None)


def _interleaved(linear: _Linear) -> _Linear:
    """Gate|up fused along N ([K, 2I]: gate's I columns, then up's) -> columns g0, u0, g1,
    u1, ... (``swiglu_fusion=1``)."""

    def alternate(a: np.ndarray) -> np.ndarray:
        half = a.shape[-1] // 2
        return np.stack([a[..., :half], a[..., half:]], axis=-1).reshape(a.shape)

    zeros = None if linear.zero_points is None else alternate(linear.zero_points)
    return _Linear(alternate(linear.codes), alternate(linear.scales), zeros, linear.block_size)


def _stacked(name: str, linears: list[_Linear]) -> list[onnx.TensorProto | None]:
    """QMoE's weights [E, N, K/2] uint8, scales [E, N, K/g] (or [E, N]) and zero points
    [E, N, ceil(K/g / 2)] (or [E, ceil(N/2)]; None when symmetric) of the experts' linears."""
    signed = linears[0].zero_points is None
    # Unsigned bytes: a signed code c is c + 8 under QMoE's default zero point 8.
    codes = np.stack([lin.codes.T for lin in linears]).astype(np.int16)  # [E, N, K]
    codes = (codes + 8 if signed else codes).astype(np.uint8)
    scales = np.stack([lin.scales.T for lin in linears])  # [E, N, K/g] or [E, N]
    out = [
        numpy_helper.from_array(_pack(codes), f"{name}.weights"),
        numpy_helper.from_array(np.ascontiguousarray(scales), f"{name}.scales"),
    ]
    if signed:
        return [*out, None]
    zeros = np.stack([lin.zero_points.T for lin in linears]).astype(np.uint8)
    return [*out, numpy_helper.from_array(_pack(zeros), f"{name}.zero_points")]


def _pack(values: np.ndarray) -> np.ndarray:
    """4-bit values (uint8, last axis) two per byte, the first in the low nibble; an odd
    last axis padded with a zero nibble."""
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros_like(values[..., :1])], axis=-1)
    return (values[..., 0::2] & 0xF) | ((values[..., 1::2] & 0xF) << 4)


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)
