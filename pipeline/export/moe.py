"""The IR's sparse mixture of experts (`layers.SparseMoE`) as standard opset-23 ONNX.

Each expert runs on the tokens routed to it and on no other: the call's (token, choice) slots
are sorted by expert (TopK over the expert ids, ascending; ties keep the lower slot first), so
the tokens of expert e are one contiguous run of the sorted rows, which a Slice cuts out; the
expert's linears are the IR's, emitted as any MLP's (int4 / int8 weights behind
DequantizeLinear, which ONNX Runtime fuses into MatMulNBits). An expert no token chose reads
zero rows. The weighted outputs are summed back onto their tokens with ScatterND (reduction
add). Every tensor is the call's size: nothing is computed for an expert that is not chosen.

A standard graph runs on every engine (OpenVINO reads it as is); ONNX Runtime's CPU engine
replaces the block by its own fused ``com.microsoft.QMoE`` kernel where the experts' weights
fit it (engines/onnxruntime/qmoe.py), which is faster at decode. What that rewrite relies on
is fixed here: the block's nodes are named under ``{m}/`` and ``{m}.`` (m =
``layers.{i}.mlp``); ``{m}/rows`` flattens the normed input to [T, hidden] (T = S*Q), the
router's logits [T, E] feed ``{m}/Softmax``, the experts' sum [T, hidden] is ``{m}/experts``
and ``{m}/out`` reshapes it back; expert e's linears are ``{m}.experts.{e}.gate_up_proj``
(gate and up fused, as `emit_linears` names them) and ``.down_proj``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from .graph import GraphBuilder
from .weights import emit_linear

__all__ = ["sparse_moe"]

# (g, expert module, its IR name, rows [n, hidden]) -> [n, hidden]: the decoder's `mlp`
ExpertEmitter = Callable[[GraphBuilder, nn.Module, str, str], str]


def sparse_moe(g: GraphBuilder, module: nn.Module, m: str, h: str, expert: ExpertEmitter) -> str:
    """`layers.SparseMoE` ``module`` (IR name ``m``): h [S, Q, hidden] (normed) -> [S, Q,
    hidden]. Softmax over the router's logits, top-k, renormalised when the module says so,
    the chosen experts' outputs summed with those weights (the IR's `SparseMoE.forward`)."""
    num_experts, k = len(module.experts), module.top_k
    hidden = module.router.in_features
    rows = g.op("Reshape", [h, g.ints(f"{m}.shape.rows", [-1, hidden])], f"{m}/rows")  # [T, h]
    logits = emit_linear(g, rows, module.router, f"{m}.router")  # [T, E]
    probs = g.op("Softmax", [logits], f"{m}/Softmax", axis=-1)  # [T, E]
    weights, chosen = _outputs(g, "TopK", [probs, g.ints(f"{m}.k", [k])], f"{m}/TopK", 2, axis=-1)
    if module.norm_topk_prob:
        total = g.op("ReduceSum", [weights, g.ints(f"{m}.last", [-1])], f"{m}/weight_sum")
        weights = g.op("Div", [weights, total], f"{m}/renormalise")  # [T, k]

    # The T*k slots sorted by expert: `order` [T*k] the slot of each sorted row.
    flat = g.ints(f"{m}.shape.flat", [-1])
    slots = g.op("Reshape", [chosen, flat], f"{m}/slot_experts")  # [T*k] expert of each slot
    count = g.op("Shape", [slots], f"{m}/slot_count")  # [1] = T*k
    _, order = _outputs(
        g, "TopK", [slots, count], f"{m}/sort", 2, axis=0, largest=0, sorted=1
    )  # [T*k]
    token = g.op("Div", [order, g.ints(f"{m}.top_k", [k])], f"{m}/slot_token")  # [T*k]
    sorted_rows = g.op("Gather", [rows, token], f"{m}/sorted_rows", axis=0)  # [T*k, hidden]
    slot_weights = g.op("Reshape", [weights, flat], f"{m}/slot_weights")  # [T*k]
    sorted_weights = g.op("Gather", [slot_weights, order], f"{m}/sorted_weights", axis=0)

    # Expert e's rows are [start_e, start_{e+1}): start_e = the slots choosing an expert < e.
    ids = _constant(g, f"{m}.expert_ids", np.arange(num_experts + 1).reshape(-1, 1))  # [E+1, 1]
    below = g.op("Less", [slots, ids], f"{m}/below")  # [E+1, T*k]
    below = g.op("Cast", [below], f"{m}/below_count", to=TensorProto.INT64)
    starts = g.op("ReduceSum", [below, g.ints(f"{m}.axis1", [1])], f"{m}/starts", keepdims=0)
    bounds = _outputs(
        g, "Split", [starts], f"{m}/bounds", num_experts + 1, axis=0, num_outputs=num_experts + 1
    )  # E+1 x [1]
    axis0 = g.ints(f"{m}.axis0", [0])
    outputs = []
    for e, module_e in enumerate(module.experts):
        name = f"{m}.experts.{e}"
        mine = g.op("Slice", [sorted_rows, bounds[e], bounds[e + 1], axis0], f"{name}/rows")
        outputs.append(expert(g, module_e, name, mine))  # [n_e, hidden]
    y = g.op("Concat", outputs, f"{m}/sorted_out", axis=0)  # [T*k, hidden]
    column = g.ints(f"{m}.column", [-1, 1])
    scale = g.op("Reshape", [sorted_weights, column], f"{m}/weight_column")  # [T*k, 1]
    y = g.op("Mul", [y, scale], f"{m}/weighted")
    zeros = g.op("ConstantOfShape", [g.op("Shape", [rows], f"{m}/rows_shape")], f"{m}/zeros")
    target = g.op("Reshape", [token, column], f"{m}/token_column")  # [T*k, 1]
    summed = g.op("ScatterND", [zeros, target, y], f"{m}/experts", reduction="add")  # [T, hidden]
    return g.op("Reshape", [summed, g.op("Shape", [h], f"{m}/shape")], f"{m}/out")


def _outputs(g: GraphBuilder, op_type: str, inputs: list[str], name: str, n: int, **attrs):
    """A node of ``n`` outputs, named ``{node}_{j}``."""
    node_name = g.fresh(name)
    outputs = [f"{node_name}_{j}" for j in range(n)]
    g.nodes.append(helper.make_node(op_type, inputs, outputs, name=node_name, **attrs))
    return outputs


def _constant(g: GraphBuilder, name: str, value: np.ndarray) -> str:
    """A small int64 tensor as an inline Constant node (no external data for a few ints)."""
    return g.op("Constant", [], name, value=numpy_helper.from_array(value.astype(np.int64), name))
