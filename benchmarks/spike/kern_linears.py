"""The 1B shape's decode linears for benchmarks.spike.kernels: the same int4 g32 weights as ONNX
Runtime MatMulNBits nodes (accuracy level 4: int8 activations) and as our packed layout, their
results checked against numpy, and the callables the benchmark times.

Weights: random codes, scales drawn as fp16 (our layout stores fp16, MatMulNBits fp32: the same
values, so both compute with bitwise-identical weights; the bytes read differ, and each side's
GB/s counts its own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from benchmarks.decode.kernel_ceiling import matmulnbits_node
from benchmarks.spike.kernlib import Kernels, Q4Weights

# Llama-3.2-1B's decode linears, ingot's fused layout (as kernel_ceiling.py): (name, K, N).
LINEARS_1B = (
    ("qkv", 2048, 3072),
    ("o", 2048, 2048),
    ("gate_up", 2048, 16384),
    ("down", 8192, 2048),
)
LM_HEAD = ("lm_head", 2048, 128256)  # Llama 3's vocabulary
GROUP = 32  # MatMulNBits block_size (kernel_ceiling.GROUP) and q4_layout.h's group
CHECK_ROWS = 8192  # output columns compared with numpy (the lm_head's 128256 in fp64: 2 GiB)


@dataclass
class Linears:
    """A set of linears (`shapes`: name, K, N, repeated per layer) held both ways."""

    shapes: list[tuple[str, int, int]]
    ours: list[Q4Weights] = field(default_factory=list)
    ort_bytes: int = 0
    # the first `rows` rows [rows, K] of each weight in fp32, made on demand
    dense: list[Callable[[int], np.ndarray]] = field(default_factory=list)
    nodes: list[Any] = field(default_factory=list)
    inits: list[Any] = field(default_factory=list)

    @property
    def our_bytes(self) -> int:
        return sum(w.nbytes for w in self.ours)

    @property
    def macs_per_row(self) -> int:
        return sum(k * n for _, k, n in self.shapes)


def make_linears(kernels: Kernels, shapes: list[tuple[str, int, int]], seed: int = 0) -> Linears:
    rng = np.random.default_rng(seed)
    lin = Linears(shapes)
    for index, (name, k, n) in enumerate(shapes):
        codes = rng.integers(0, 256, (n, k // GROUP, 16), dtype=np.uint8)
        scales = (rng.random((n, k // GROUP), dtype=np.float32) * 0.01).astype(np.float16)
        prefix = f"w{index}.{name}"
        lin.inits += [
            numpy_helper.from_array(codes, f"{prefix}.codes"),
            numpy_helper.from_array(scales.astype(np.float32).ravel(), f"{prefix}.scales"),
        ]
        lin.ort_bytes += codes.nbytes + scales.size * 4
        lin.nodes.append(matmulnbits_node(prefix, k, n, accuracy_level=4))
        lin.ours.append(kernels.pack_q4(codes, scales))
        lin.dense.append(lambda rows, c=codes, s=scales: _dequantize(c[:rows], s[:rows]))
    return lin


def _dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MatMulNBits' weight [N, K]: (code - 8) * scale, weight 2t in byte t's low nibble."""
    n, groups, _ = codes.shape
    nibbles = np.stack([codes & 15, codes >> 4], axis=-1).reshape(n, groups, GROUP)
    return ((nibbles.astype(np.float32) - 8) * scales.astype(np.float32)[..., None]).reshape(n, -1)


def ort_session(lin: Linears, threads: int, spin: bool) -> ort.InferenceSession:
    """One session running every linear on its input x{K} [M, K] (M symbolic)."""
    ks = sorted({k for _, k, _ in lin.shapes})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["M", k]) for k in ks]
    outputs = [
        helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, ["M", n])
        for node, (_, _, n) in zip(lin.nodes, lin.shapes, strict=True)
    ]
    graph = helper.make_graph(lin.nodes, "linears", inputs, outputs, lin.inits)
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def inputs(lin: Linears, m: int, seed: int = 1) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal((m, k), dtype=np.float32) for k in {k for _, k, _ in lin.shapes}}


def cases(
    lin: Linears, kernels: Kernels, sessions: dict[str, ort.InferenceSession], m: int, threads: int
) -> dict[str, Callable[[], Any]]:
    """What one decode step's linears cost at M = m rows: each ORT session's run, and ours (one
    call per linear, output buffers reused as an engine would)."""
    x = inputs(lin, m)
    feeds = {f"x{k}": v for k, v in x.items()}
    outs = [np.empty((m, w.n), np.float32) for w in lin.ours]

    def ours() -> None:
        for w, y in zip(lin.ours, outs, strict=True):
            kernels.q4_gemm(x[w.k], w, threads, y)

    runs: dict[str, Callable[[], Any]] = {
        name: (lambda s=s: s.run(None, feeds)) for name, s in sessions.items()
    }
    runs["ours"] = ours
    return runs


def check(
    lin: Linears, kernels: Kernels, session: ort.InferenceSession, m: int, threads: int
) -> list[dict[str, Any]]:
    """Per linear of the first layer (or the lm_head): ours and ORT level 4 against numpy on
    the same dequantized weights (the first CHECK_ROWS output columns), x in fp32 (the int8
    activations' own error) and x rounded as ours rounds it (per group of 32, half to even:
    our kernel's arithmetic error alone)."""
    x = inputs(lin, m)
    ort_out = session.run(None, {f"x{k}": v for k, v in x.items()})
    rows = []
    first_layer = zip(lin.shapes[: len(LINEARS_1B)], lin.ours, ort_out, lin.dense, strict=False)
    for (name, k, n), w, theirs, dense_rows in first_layer:
        cols = min(n, CHECK_ROWS)
        dense = dense_rows(cols).astype(np.float64)
        ref = x[k].astype(np.float64) @ dense.T
        ref_q8 = _q8_rounded(x[k]).astype(np.float64) @ dense.T
        ours = kernels.q4_gemm(x[k], w, threads)[:, :cols]
        theirs = theirs[:, :cols]
        scale = np.abs(ref).max()
        rows.append(
            {
                "linear": name,
                "m": m,
                "ours_vs_fp32_x": float(np.abs(ours - ref).max() / scale),
                "ours_vs_q8_x": float(np.abs(ours - ref_q8).max() / np.abs(ref_q8).max()),
                "ort_level4_vs_fp32_x": float(np.abs(theirs - ref).max() / scale),
            }
        )
    return rows


def _q8_rounded(x: np.ndarray) -> np.ndarray:
    """x [m, k] as ks_q8_quantize rounds it: per group of 32, scale amax / 127, half to even."""
    m, k = x.shape
    g = x.reshape(m, k // GROUP, GROUP)
    amax = np.abs(g).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    return (np.rint(g * inv) * (amax / np.float32(127))).reshape(m, k)
