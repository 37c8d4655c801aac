"""The token embedding and a tied lm_head as ONNX: a float table, or an int8 one whose rows
are gathered as codes and dequantized after the gather (only the rows a call reads).

A quantized table is stored as a quantized lm_head's weight is (weights.py: codes_t [H, V],
scales_t [H/g, V] or [V] per row, zero points as the codes), so a tied model holds it once:
lm_head's DequantizeLinear -> MatMul reads it (ONNX Runtime fuses that into MatMulNBits;
OpenVINO's rebuild into a compressed FullyConnected) and the lookup gathers its columns:

    Gather(codes_t [H, V], ids [T], axis 1) -> [H, T]      int8 / uint8
    Gather(scales_t, ids, axis 1 / 0)       -> [H/g, T] or [T]
    (codes - zero points) * scales (blocks of g along H, or one scale per token)
    -> Transpose -> [T, H]

All standard opset-23 ops. ONNX's Gather takes no 4-bit tensors, so the table's codes are
8-bit (the recipe checks refuse a 4-bit embedding).
"""

from __future__ import annotations

from onnx import TensorProto

from ..model.layer_source import LayerSource
from ..model.selection import EMBEDDING
from .errors import ExportError
from .graph import GraphBuilder
from .weights import emit_weight_codes

__all__ = ["EMBEDDING_OUT", "Embedding", "emit_embedding"]

EMBEDDING_OUT = f"{EMBEDDING}/out"  # the node whose output is the embedded rows (quantized)


class Embedding:
    """The emitted table: `rows` the embedded tokens [S, Q, hidden]; `logits` emits a tied
    lm_head on the same initializers."""

    def __init__(self, rows: str, table: str | None, codes: tuple[list[str], dict] | None):
        self.rows = rows
        self._table, self._codes = table, codes

    def logits(self, g: GraphBuilder, hidden: str, out: str) -> str:
        """hidden [N, H] @ table^T -> [N, V], reading the embedding's own initializers."""
        if self._codes is None:  # float: Gemm(transB) on the [V, H] table, no W^T stored
            return g.op("Gemm", [hidden, self._table], "lm_head/Gemm", out=out, transB=1)
        inputs, attrs = self._codes
        w = g.op("DequantizeLinear", inputs, "lm_head/DequantizeLinear", **attrs)  # [H, V]
        return g.op("MatMul", [hidden, w], "lm_head/MatMul", out=out)


def emit_embedding(g: GraphBuilder, src: LayerSource, ids: str, hidden_size: int) -> Embedding:
    """The embedding of `ids` [S, Q] -> [S, Q, hidden] (and, tied, the table lm_head reads)."""
    table, tied = src.quantized_embedding(), src.lm_head_tied
    if table is None:
        embed = g.array(f"{EMBEDDING}.weight", src.embedding().numpy())  # [V, H]
        rows = g.op("Gather", [embed, ids], f"{EMBEDDING}/Gather", axis=0)  # [S, Q, H]
        return Embedding(rows, embed, None)
    if table.bits <= 4:
        raise ExportError(
            f"{EMBEDDING}: {table.bits}-bit codes cannot be gathered in standard ONNX (its "
            "Gather takes no 4-bit tensors); quantize the embedding to 8 bits"
        )
    inputs, attrs = emit_weight_codes(g, table.linear(), EMBEDDING)
    flat = g.op("Reshape", [ids, g.ints("shape.flat", [-1])], f"{EMBEDDING}/flat")  # [T]
    per_row = "block_size" not in attrs  # scales_t [V]: one per token, else [H/g, V]
    # Tied, the gathers read the table's bytes under names of their own (`GraphBuilder.alias`):
    # ONNX Runtime does not fuse a DequantizeLinear -> MatMul (the lm_head) into MatMulNBits
    # while another node reads its codes.
    tables = [g.alias(f"{name}.gather", name) for name in inputs] if tied else inputs
    picked = [
        g.op("Gather", [name, flat], f"{EMBEDDING}/Gather", axis=0 if per_row and i else 1)
        for i, name in enumerate(tables)
    ]  # codes [H, T]; scales, zero points [T] or [H/g, T]
    cols = _dequantized(g, picked, hidden_size, None if per_row else table.group_size)
    rows = g.op("Transpose", [cols], f"{EMBEDDING}/Transpose", perm=[1, 0])  # [T, H]
    shape = g.op("Shape", [ids], f"{EMBEDDING}/Shape")  # [2]: S, Q
    width = g.ints("shape.hidden", [hidden_size])
    target = g.op("Concat", [shape, width], f"{EMBEDDING}/rows_shape", axis=0)  # [3]
    out = g.op("Reshape", [rows, target], EMBEDDING_OUT)  # [S, Q, H]
    return Embedding(out, None, (inputs, attrs))


def _dequantized(g: GraphBuilder, picked: list[str], h: int, group: int | None) -> str:
    """(codes - zero points) * scales of gathered columns: codes [H, T], scales (and zero
    points) [T] per token or [H/g, T] per block -> [H, T] float. Cast / Sub / Mul rather than
    a DequantizeLinear: OpenVINO's ONNX reader takes no blocked DequantizeLinear of a dynamic
    shape; the products are the same (integer codes are exact in float32)."""
    codes, scales, *zeros = picked
    x = g.op("Cast", [codes], f"{EMBEDDING}/Cast", to=TensorProto.FLOAT)  # [H, T]
    if group is not None:  # blocks of g along H: [H/g, g, T] against [H/g, 1, T]
        x = g.op(
            "Reshape", [x, g.ints("shape.blocks", [h // group, group, -1])], f"{EMBEDDING}/blocks"
        )
        axis = g.ints("axes.block", [1])
        scales = g.op("Unsqueeze", [scales, axis], f"{EMBEDDING}/scales")
        zeros = [g.op("Unsqueeze", [z, axis], f"{EMBEDDING}/zero_points") for z in zeros]
    for z in zeros:
        zero = g.op("Cast", [z], f"{EMBEDDING}/Cast", to=TensorProto.FLOAT)
        x = g.op("Sub", [x, zero], f"{EMBEDDING}/Sub")
    x = g.op("Mul", [x, scales], f"{EMBEDDING}/Mul")
    if group is None:
        return x
    return g.op("Reshape", [x, g.ints("shape.cols", [h, -1])], f"{EMBEDDING}/cols")  # [H, T]
