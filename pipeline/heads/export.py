"""Medusa heads as a standard ONNX graph the runtime runs beside the target's engine.

    input   hidden        [N, H] float32   the target's final-norm hidden state, a row per sequence
    output  draft_tokens  [N, K] int64     head k's greedy token (ArgMax, first index on ties)

Per head: x = hidden; x = x + SiLU(x @ W_l^T + b_l) per block layer (Sigmoid * Mul, the
form every ONNX consumer fuses or runs); logits = x @ L^T; ArgMax. Weights are stored
transposed ([in, out]: plain MatMul) in `model.onnx.data`. The graph is checked against the
torch heads before the stage is cached (`check_heads`): the same greedy tokens on the
calibration hidden states, up to near-ties.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

from ..export.decoder import OPSET
from ..model.medusa import MedusaHeadsModel

__all__ = ["export_heads", "check_heads", "MODEL_FILE", "DATA_FILE"]

MODEL_FILE, DATA_FILE = "model.onnx", "model.onnx.data"
_RTOL = 1e-4  # of the largest |logit|: a top-2 margin below it is a near-tie (ORT vs torch)


def export_heads(heads: MedusaHeadsModel, out: Path) -> None:
    """Write ``out/model.onnx`` (+ ``model.onnx.data``)."""
    cfg = heads.cfg
    nodes, inits, tokens = [], [], []
    for k, (block, lm_head) in enumerate(zip(heads.blocks, heads.lm_heads, strict=True)):
        x = "hidden"
        for i, layer in enumerate(block.layers):
            name = f"blocks.{k}.layers.{i}"
            inits.append(_weight_t(layer.weight, f"{name}.weight_t"))  # [H, H]
            y = f"{name}/MatMul"
            nodes.append(helper.make_node("MatMul", [x, f"{name}.weight_t"], [y], name=y))
            if layer.bias is not None:
                inits.append(numpy_helper.from_array(_array(layer.bias), f"{name}.bias"))
                nodes.append(helper.make_node("Add", [y, f"{name}.bias"], [f"{name}/Add"]))
                y = f"{name}/Add"
            nodes.append(helper.make_node("Sigmoid", [y], [f"{name}/Sigmoid"]))
            nodes.append(helper.make_node("Mul", [y, f"{name}/Sigmoid"], [f"{name}/SiLU"]))
            nodes.append(helper.make_node("Add", [x, f"{name}/SiLU"], [f"{name}/out"]))
            x = f"{name}/out"  # [N, H]
        head = f"lm_heads.{k}"
        inits.append(_weight_t(lm_head.weight, f"{head}.weight_t"))  # [H, V]
        nodes.append(helper.make_node("MatMul", [x, f"{head}.weight_t"], [f"{head}/logits"]))
        nodes.append(
            helper.make_node("ArgMax", [f"{head}/logits"], [f"{head}/token"], axis=1, keepdims=1)
        )  # [N, 1]
        tokens.append(f"{head}/token")
    nodes.append(helper.make_node("Concat", tokens, ["draft_tokens"], axis=1))  # [N, K]
    graph = helper.make_graph(
        nodes,
        "medusa_heads",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["N", cfg.hidden_size])],
        [helper.make_tensor_value_info("draft_tokens", TensorProto.INT64, ["N", cfg.num_heads])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.producer_name = "ingot"
    out.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(out / MODEL_FILE),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=DATA_FILE,
        size_threshold=1024,
    )


def check_heads(heads: MedusaHeadsModel, onnx_file: Path, hidden: torch.Tensor) -> dict[str, Any]:
    """Run the graph on ``hidden`` [n, H] and compare its tokens with the torch heads';
    raises ValueError on a mismatch that is not a near-tie. Returns the report."""
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    rows = hidden.float().numpy()
    got = session.run(["draft_tokens"], {"hidden": rows})[0]  # [n, K]
    with torch.no_grad():
        logits = heads(hidden.float())  # [n, K, V]
    top2 = logits.topk(2, dim=-1).values  # [n, K, 2]
    tie = (top2[..., 0] - top2[..., 1]) <= _RTOL * float(logits.abs().max())
    want = logits.argmax(-1).numpy()
    mismatch = (got != want) & ~tie.numpy()
    report = {
        "rows": int(rows.shape[0]),
        "heads": int(got.shape[1]),
        "near_ties_exempt": int(tie.sum()),
        "mismatches": int(mismatch.sum()),
    }
    if report["mismatches"]:
        raise ValueError(f"the exported Medusa heads disagree with the trained ones: {report}")
    return report


def _weight_t(weight: torch.Tensor, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(_array(weight).T), name)


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().numpy()
