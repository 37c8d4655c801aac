"""A tied quantized embedding read from lm_head's MatMulNBits weights: the table once in the
engine file.

The exported graph holds a tied int8 table once (export/embedding.py): lm_head's
DequantizeLinear -> MatMul reads `embed_tokens.codes_t` [H, V], the lookup's Gathers read the
same bytes under aliases `embed_tokens.codes_t.gather` ... (ORT fuses no MatMulNBits while
another node reads its codes). ORT's optimized graph then writes the table twice: lm_head's
MatMulNBits with new initializers `embed_tokens.codes_t_T` (u8 [V, H/g, g], codes + 128) and
`scales_t_T` (f32 [V*H/g]; per-row scales repeated into blocks of g), the Gathers with the
aliases, each now a tensor of its own.

After ORT writes its graph, the lookup's subgraph (Gathers, Cast, Mul, Transpose, Reshape ->
`embed_tokens/out`) is replaced by one reading the MatMulNBits inputs, standard ops only:

    Gather(codes_t_T [V, H/g, g], ids [S, Q], axis 0)               -> [S, Q, H/g, g] u8
    Gather(Reshape(scales_t_T, [V, H/g, 1]), ids)                   -> [S, Q, H/g, 1]
    (Cast(codes) - 128, or - Cast(gathered zero points)) * scales   -> Reshape [S, Q, H]

(Reshape aliases its input in ORT: nothing is copied.) These are the products MatMulNBits
dequantizes with and the ones the lookup computed (the same integer codes, the same scales),
so the engine's numbers do not change. ORT's contrib GatherBlockQuantized (what
onnxruntime-genai's int4 shared embeddings use) computes the same at bits=8, but cannot read
these tensors in a file OpenVINO also reads: OpenVINO's reader takes only initializers as its
data and scales ("GatherBlockQuantized: 'data' must be a constant"), with the data's rank, while
ORT's MatMulNBits takes codes only as [V, H/g, g] and scales only as [V*H/g] or [V, H/g]
("MatMulNBits PrePack: scales initializer shape {V,H/g,1} does not match attribute-derived
shape") -- a second copy of the scales either way.

At level basic ORT fuses no MatMulNBits and writes the table and its aliases as two tensors:
the lookup's Gathers then read the table under its own names. Either way the aliases are
dropped and the external data file is written again without them; every other tensor keeps
its name and bytes (an OpenVINO engine reads MatMulNBits' inputs by name from this file:
runtime/engines/openvino/weights.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...export.embedding import EMBEDDING_OUT
from ...model.selection import EMBEDDING

__all__ = ["share_tied_embedding"]

_CODES = f"{EMBEDDING}.codes_t_T"  # lm_head's MatMulNBits weight when tied to the table
_ALIAS = ".gather"  # export/embedding.py: the lookup's names for the tied table's tensors
# ORT's own rule when it writes external data: tensors of 1 MiB or more start on a page.
_ALIGN, _ALIGN_FROM = 4096, 1 << 20
_CHUNK = 64 << 20  # bytes copied at a time


def share_tied_embedding(model_file: Path) -> bool:
    """Rewrite the ORT engine at ``model_file`` (+ its external data) so a tied int8 table is
    held once (module docstring): its lookup reads lm_head's MatMulNBits weights, or, where
    ORT fused no MatMulNBits (level basic), the exported table under its own names. Returns
    whether it did: False, and nothing written, where the engine holds no tied table twice
    (an untied or float embedding)."""
    model = onnx.load(str(model_file), load_external_data=False)
    if not (_read_lm_heads_weights(model.graph) or _unalias(model.graph)):
        return False
    _prune(model.graph)
    _write(model, Path(model_file))
    return True


def _read_lm_heads_weights(graph: onnx.GraphProto) -> bool:
    """Replace the lookup's subgraph by `_gathered_rows` of lm_head's MatMulNBits inputs where
    the graph has both and they can be read so."""
    lm_head = next(
        (n for n in graph.node if n.op_type == "MatMulNBits" and n.input[1] == _CODES), None
    )
    ids = _lookup_ids(graph)
    if lm_head is None or ids is None:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in lm_head.attribute}
    k, n, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    if bits != 8 or k % block or any(lm_head.input[4:]):  # export refuses 4-bit tables
        return False  # (K, the hidden size, in whole blocks; no g_idx, no bias)
    zero_points = lm_head.input[3] if len(lm_head.input) > 3 else ""
    types = {t.name: t.data_type for t in graph.initializer}
    if zero_points and types.get(zero_points) != onnx.TensorProto.UINT8:
        return False  # MatMulNBits' float zero points are another formula
    out_index = next(i for i, node in enumerate(graph.node) if EMBEDDING_OUT in node.output)
    added = _gathered_rows(graph, lm_head, ids, (n, k, block))
    del graph.node[out_index]  # the lookup's last node: its output is now the new rows'
    for offset, node in enumerate(added):
        graph.node.insert(out_index + offset, node)
    return True


def _unalias(graph: onnx.GraphProto) -> bool:
    """Point the lookup's reads of the aliases `{name}.gather` at `{name}` where the graph
    still has both (ORT writes each as a tensor of its own). Whether any was."""
    names = {t.name for t in graph.initializer}
    base = {n: n.removesuffix(_ALIAS) for n in names if n.endswith(_ALIAS)}
    base = {alias: name for alias, name in base.items() if name in names}
    for node in graph.node:
        node.input[:] = [base.get(name, name) for name in node.input]
    return bool(base)


def _lookup_ids(graph: onnx.GraphProto) -> str | None:
    """The token ids [S, Q] the tied table's lookup reads: the Gather of the aliased codes
    takes them flattened (Reshape(ids, [-1])). None where the graph has no such lookup."""
    producers = {out: node for node in graph.node for out in node.output}
    if EMBEDDING_OUT not in producers:
        return None
    gather = next(
        (
            node
            for node in graph.node
            if node.op_type == "Gather" and node.input[0] == f"{EMBEDDING}.codes_t{_ALIAS}"
        ),
        None,
    )
    flat = producers.get(gather.input[1]) if gather is not None else None
    return flat.input[0] if flat is not None and flat.op_type == "Reshape" else None


def _gathered_rows(
    graph: onnx.GraphProto, lm_head: onnx.NodeProto, ids: str, shape: tuple[int, int, int]
) -> list[onnx.NodeProto]:
    """The rows of `ids` [S, Q] dequantized from lm_head's MatMulNBits inputs, written as the
    lookup's output [S, Q, H] (module docstring)."""
    n, k, block = shape
    codes, scales, *zero_points = (name for name in lm_head.input[1:4] if name)
    nodes: list[onnx.NodeProto] = []

    def op(op_type: str, inputs: list[str], name: str, **attrs) -> str:
        out = name if name == EMBEDDING_OUT else f"{EMBEDDING_OUT}/{name}"
        nodes.append(helper.make_node(op_type, inputs, [out], out, **attrs))
        return out

    def constant(name: str, value: np.ndarray) -> str:
        full = f"{EMBEDDING_OUT}/{name}"
        graph.initializer.append(numpy_helper.from_array(value, full))
        return full

    blocks = constant("blocks_shape", np.array([n, k // block, 1], np.int64))  # per block

    def rows(name: str, table: str) -> str:  # [V, ...] -> [S, Q, ...]
        return op("Gather", [table, ids], name, axis=0)

    x = op("Cast", [rows("codes", codes)], "codes_f32", to=onnx.TensorProto.FLOAT)
    if zero_points:  # u8 [V*H/g]: blocks [S, Q, H/g, 1]
        zero = rows("zero_points", op("Reshape", [zero_points[0], blocks], "zero_points_v"))
        zero = op("Cast", [zero], "zero_points_f32", to=onnx.TensorProto.FLOAT)
    else:  # MatMulNBits' zero point for u8 codes without any
        zero = constant("middle_code", np.array(128.0, np.float32))
    x = op("Sub", [x, zero], "centred")  # [S, Q, H/g, g]: the signed codes
    x = op("Mul", [x, rows("scales", op("Reshape", [scales, blocks], "scales_v"))], "dequantized")
    hidden = constant("rows_shape", np.array([0, 0, k], np.int64))  # S and Q kept
    op("Reshape", [x, hidden], EMBEDDING_OUT)
    return nodes


def _prune(graph: onnx.GraphProto) -> None:
    """Drop the nodes no graph output depends on any more, then the initializers and value
    infos nothing reads or produces (the replaced lookup's)."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):  # ORT writes its graph topologically sorted
        if needed.intersection(node.output):
            needed.update(node.input)
            needed.update(_subgraph_reads(node))
            kept.append(node)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    still = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(still)
    produced = {out for node in graph.node for out in node.output}
    infos = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every name a subgraph attribute of `node` reads (an If / Loop body may read outer
    names)."""
    reads: set[str] = set()
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in sub.node:
                reads.update(inner.input)
                reads.update(_subgraph_reads(inner))
    return reads


def _write(model: onnx.ModelProto, model_file: Path) -> None:
    """Write `model` over `model_file`, its external tensors copied into a new data file in
    the old one's order (ORT's alignment kept), then both renamed into place."""
    model_dir = model_file.parent
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    locations = {_field(t, "location") for t in external}
    if len(locations) != 1:
        raise RuntimeError(f"{model_file}: expected one external data file, got {locations}")
    (location,) = locations
    old, new = model_dir / location, model_dir / f".{location}.shared"
    proto = model_dir / f".{model_file.name}.shared"
    try:
        with open(old, "rb") as src, open(new, "wb") as dst:
            for tensor in sorted(external, key=lambda t: int(_field(t, "offset"))):
                length = int(_field(tensor, "length"))
                if length >= _ALIGN_FROM:
                    dst.write(b"\0" * (-dst.tell() % _ALIGN))
                src.seek(int(_field(tensor, "offset")))
                _set_field(tensor, "offset", str(dst.tell()))
                for start in range(0, length, _CHUNK):
                    dst.write(src.read(min(_CHUNK, length - start)))
        proto.write_bytes(model.SerializeToString())
        os.replace(new, old)
        os.replace(proto, model_file)
    finally:  # no temporary file left behind, whatever failed
        new.unlink(missing_ok=True)
        proto.unlink(missing_ok=True)


def _field(tensor: onnx.TensorProto, key: str) -> str:
    return next(e.value for e in tensor.external_data if e.key == key)


def _set_field(tensor: onnx.TensorProto, key: str, value: str) -> None:
    next(e for e in tensor.external_data if e.key == key).value = value
