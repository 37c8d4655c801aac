"""What an ONNX graph of an artifact holds: op types, initializer dtypes, weight bytes per step.

Graphs are loaded without their external data: sizes come from the external-data records.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import onnx

__all__ = ["artifact_graphs", "graph_summary"]


def artifact_graphs(artifact: str | Path | None) -> dict[str, Any] | None:
    """Summaries of the exported graph and of the graph ORT optimized at build time."""
    if artifact is None:
        return None
    root = Path(artifact)
    graphs = {
        "exported": root / "model.onnx",
        "onnxruntime_optimized": root / "engines" / "onnxruntime-cpu" / "model.onnx",
    }
    return {name: graph_summary(path) if path.is_file() else None for name, path in graphs.items()}


def graph_summary(path: Path) -> dict[str, Any]:
    graph = onnx.load(str(path), load_external_data=False).graph
    dtypes = Counter(onnx.TensorProto.DataType.Name(t.data_type) for t in graph.initializer)
    return {
        "op_types": dict(sorted(Counter(n.op_type for n in graph.node).items())),
        "initializer_dtypes": dict(sorted(dtypes.items())),
        "initializer_bytes": sum(_nbytes(t) for t in graph.initializer),
        "weight_bytes_per_step": _weight_bytes_per_step(graph),
    }


def _weight_bytes_per_step(graph: onnx.GraphProto) -> int:
    """Initializer bytes one decode step reads: all of each, but one row of a lookup table.

    A table only a Gather indexes (an untied embedding) is read one row per token; a table
    something else also reads (a tied lm_head) is read in full.
    """
    lookups = {n.input[0] for n in graph.node if n.op_type == "Gather"}
    other_uses = {i for n in graph.node if n.op_type != "Gather" for i in n.input}
    other_uses |= {i for n in graph.node if n.op_type == "Gather" for i in n.input[1:]}
    total = 0
    for t in graph.initializer:
        size = _nbytes(t)
        if t.name in lookups and t.name not in other_uses and t.dims:
            size //= t.dims[0]
        total += size
    return total


def _nbytes(tensor: onnx.TensorProto) -> int:
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    if tensor.raw_data:
        return len(tensor.raw_data)
    count = 1
    for d in tensor.dims:
        count *= d
    bits = 4 if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) else None
    if bits is None:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        return count * itemsize
    return (count * bits + 7) // 8
