"""FP8 weights for ONNX Runtime's CPU: dequantized once, when the engine is built.

ORT 1.32's CPU DequantizeLinear of FLOAT8E4M3FN is scalar: about 9 ns per weight, 25 ms per
call for a 1024 x 2816 matrix whose fp32 MatMul at batch 1 takes 0.85 ms (measured here), and
ORT keeps weight DequantizeLinear nodes unfolded (its QDQ handling wants them). A graph
dequantizing its FP8 weights on every call runs 30x slower than fp32, so the CPU engine is
built from a copy of the exported graph in which each `DequantizeLinear(FP8 initializer,
constant scale)` is replaced by its result: float(code) * scale, the same IEEE products the
node computes, so the engine's numbers are unchanged (the export check stays exact). The
engine then holds fp32 weights (the portable graph keeps the FP8 ones): FP8 on this CPU buys
FP8's numerics, not its storage or bandwidth.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .rewrite import save_rewritten

__all__ = ["fold_fp8_weights"]


def fold_fp8_weights(onnx_path: Path, out_dir: Path) -> int:
    """Write ``out_dir/model.onnx`` (+ ``model.onnx.data``): the graph at ``onnx_path`` with its
    FP8 weight DequantizeLinear nodes folded into fp32 initializers. Returns how many were
    folded; 0 writes nothing (the graph has none). Holds the model's weights in memory once
    (the folded ones in fp32), as ONNX Runtime does when it builds the engine next."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    folds = [n for n in model.graph.node if _foldable(n, inits)]
    if not folds:
        return 0
    onnx.load_external_data_for_model(model, str(onnx_path.parent))
    inits = {t.name: t for t in model.graph.initializer}
    folded = []
    for node in folds:
        codes = numpy_helper.to_array(inits[node.input[0]])  # [K, N] float8_e4m3fn
        scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)  # [N] or []
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if scale.ndim == 1 and axis not in (1, -1):
            raise ValueError(f"{node.name}: FP8 weight scales along axis {axis}, not 1")
        weight = codes.astype(np.float32) * scale  # [K, N]: DequantizeLinear's own products
        folded.append(numpy_helper.from_array(weight, node.output[0]))
    remaining = [n for n in model.graph.node if n not in folds]
    del model.graph.node[:]
    model.graph.node.extend(remaining)
    model.graph.initializer.extend(folded)
    save_rewritten(model, out_dir)  # the FP8 codes, no longer read, are dropped
    return len(folds)


def _foldable(node: onnx.NodeProto, inits: dict[str, TensorProto]) -> bool:
    """A DequantizeLinear of an FP8 initializer with a constant scale, no zero point and no
    blocks: a weight (activations are never initializers)."""
    if node.op_type != "DequantizeLinear" or len(node.input) < 2:
        return False
    codes, scale = (inits.get(name) for name in node.input[:2])
    has_zero_point = len(node.input) > 2 and bool(node.input[2])
    return (
        codes is not None
        and scale is not None
        and codes.data_type == TensorProto.FLOAT8E4M3FN
        and not has_zero_point
        and not any(a.name == "block_size" and a.i for a in node.attribute)
    )
