"""An EAGLE-3 draft as two standard ONNX graphs the runtime runs beside the target's engine.

``fc.onnx``: the target's three aux states to the draft's hidden size (only for rows whose
hidden input is the target's features; a chained draft step feeds its own output instead):

    input   features  [N, 3*Ht] float32
    output  hidden    [N, H] float32

``model.onnx``: the one draft layer behind the target's paged-KV interface with one layer
(`pipeline/export/decoder.py`: the same mask, block tables, pool layout and attention path,
a float32 pool in the target's block size):

    inputs  input_ids [S, Q] int64 (the token after each position), positions [S, Q] int64,
            hidden [S, Q, H] float32, k_pool_0, v_pool_0 [NB, B, Hkv, D] float32,
            block_tables [S, MB] int64, context_lens [S] int64,
            attention_mask [S, 1, Q, MB*B + Q] bool, logits_indices [N] int64
    outputs draft_tokens [N] int64 (greedy, target vocabulary ids), draft_hidden [N, H]
            float32 (pre-norm output of those rows: the next draft step's `hidden`),
            new_k_0, new_v_0 [S, Q, Hkv*D] float32

The layer (vLLM's llama_eagle3): e = input_layernorm(embed(ids)); hn = hidden_norm(hidden),
the residual being hn (norm_before_residual) or hidden; attention over concat(e, hn) [2H];
residual + attention -> post_attention_layernorm -> MLP; prenorm = MLP output + residual;
logits = lm_head(norm(prenorm)) over the draft vocabulary; a draft id i is target id
i + d2t[i]. `check_eagle` runs both graphs through the runtime's own batches and pool against
the torch draft before the stage is cached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

from ingot.runtime.batch import STEP_INPUTS, build_inputs
from ingot.runtime.kv_pool import KVPool

from ..export.decoder import IR_VERSION, OPSET, attention, mlp, norm, shared_tensors
from ..export.graph import GraphBuilder
from ..export.weights import emit_linear
from ..model.eagle3 import Eagle3Draft
from ..model.llama import causal_mask
from ..model.rope import cos_sin

__all__ = ["FC_FILE", "MODEL_FILE", "check_eagle", "export_eagle"]

MODEL_FILE, FC_FILE = "model.onnx", "fc.onnx"
_POOL = TensorProto.FLOAT  # the draft's pool: one layer, always float32


def export_eagle(draft: Eagle3Draft, out: Path, *, max_seq_len: int, kv_block_size: int) -> None:
    """Write ``out/model.onnx`` and ``out/fc.onnx`` (each with its ``.data``)."""
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        _write(out / FC_FILE, "eagle3_fc", lambda g: _fc_graph(g, draft))
        _write(
            out / MODEL_FILE,
            "eagle3_draft",
            lambda g: _layer_graph(g, draft, max_seq_len, kv_block_size),
        )


def _write(path: Path, name: str, build) -> None:
    data_name = f"{path.name}.data"
    with open(path.parent / data_name, "wb") as data:
        g = GraphBuilder(data, data_name)
        build(g)
    graph = helper.make_graph(g.nodes, name, g.inputs, g.outputs, g.initializers)
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="ingot",
    )
    path.write_bytes(proto.SerializeToString())


def _fc_graph(g: GraphBuilder, draft: Eagle3Draft) -> None:
    cfg = draft.cfg
    features = g.input("features", TensorProto.FLOAT, ["N", 3 * cfg.target_hidden_size])
    emit_linear(g, features, draft.fc, "fc", out="hidden")  # [N, H]
    g.output("hidden", TensorProto.FLOAT, ["N", cfg.hidden_size])


def _layer_graph(g: GraphBuilder, draft: Eagle3Draft, max_seq_len: int, bs: int) -> None:
    cfg, layer = draft.cfg, draft.layers[0]
    lcfg = cfg.layer
    h, hkv, d = cfg.hidden_size, lcfg.num_kv_heads, lcfg.head_dim
    ids = g.input("input_ids", TensorProto.INT64, ["S", "Q"])
    positions = g.input("positions", TensorProto.INT64, ["S", "Q"])
    hidden = g.input("hidden", TensorProto.FLOAT, ["S", "Q", h])
    pool = (
        g.input("k_pool_0", _POOL, ["NB", bs, hkv, d]),
        g.input("v_pool_0", _POOL, ["NB", bs, hkv, d]),
    )
    tables = g.input("block_tables", TensorProto.INT64, ["S", "MB"])
    g.input("context_lens", TensorProto.INT64, ["S"])  # the mask encodes it (as the target's)
    mask = g.input("attention_mask", TensorProto.BOOL, ["S", 1, "Q", "KV"])
    rows = g.input("logits_indices", TensorProto.INT64, ["N"])
    consts = shared_tensors(g, lcfg, max_seq_len, "fp32")

    embed = g.array("embed_tokens.weight", draft.embed_tokens.weight.detach().float().numpy())
    e = g.op("Gather", [embed, ids], "embed_tokens/Gather", axis=0)  # [S, Q, H]
    e = norm(g, lcfg, e, layer.input_layernorm, "layers.0.input_layernorm")
    normed = norm(g, lcfg, hidden, layer.hidden_norm, "layers.0.hidden_norm")  # [S, Q, H]
    residual = normed if cfg.norm_before_residual else hidden
    x = g.op("Concat", [e, normed], "layers.0/concat", axis=-1)  # [S, Q, 2H]
    a = attention(g, layer.self_attn, 0, x, positions, pool, tables, mask, consts, _POOL)
    residual = g.op("Add", [residual, a], "layers.0/attn_residual")  # [S, Q, H]
    m = norm(g, lcfg, residual, layer.post_attention_layernorm, "layers.0.post_attention_layernorm")
    prenorm = g.op("Add", [mlp(g, layer.mlp, "layers.0.mlp", m), residual], "layers.0/prenorm")

    flat = g.op("Reshape", [prenorm, g.ints("shape.rows", [-1, h])], "prenorm/Reshape")
    g.op("Gather", [flat, rows], "prenorm/Gather", out="draft_hidden", axis=0)  # [N, H]
    normed_rows = norm(g, lcfg, "draft_hidden", draft.norm, "norm")  # [N, H]
    logits = emit_linear(g, normed_rows, draft.lm_head, "lm_head")  # [N, Vd]
    best = g.op("ArgMax", [logits], "lm_head/ArgMax", axis=-1, keepdims=0)  # [N] draft ids
    if bool(draft.d2t.any()):  # a draft vocabulary: id i is target id i + d2t[i]
        offsets = g.array("d2t", draft.d2t.detach().numpy().astype(np.int64))
        shift = g.op("Gather", [offsets, best], "d2t/Gather", axis=0)
        g.op("Add", [best, shift], "d2t/Add", out="draft_tokens")
    else:
        g.op("Identity", [best], "draft_tokens/Identity", out="draft_tokens")

    g.output("draft_tokens", TensorProto.INT64, ["N"])
    g.output("draft_hidden", TensorProto.FLOAT, ["N", h])
    g.output("new_k_0", _POOL, ["S", "Q", hkv * d])
    g.output("new_v_0", _POOL, ["S", "Q", hkv * d])


def check_eagle(
    draft: Eagle3Draft, out: Path, features: torch.Tensor, ids: torch.Tensor, kv_block_size: int
) -> dict[str, Any]:
    """Run the exported graphs on one sequence (``features`` [T, 3Ht] for positions 0..T-1,
    ``ids`` [T] the token after each) in two chunks, the second reading the first's K/V from a
    pool of garbage-filled, permuted blocks, and compare with the torch draft over the whole
    sequence: fc's hidden and every row's prenorm within 1e-4 of the largest |value|, the
    greedy tokens equal but at near-ties. Raises ValueError otherwise; returns the report."""
    cfg = draft.cfg
    t = int(ids.shape[0])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    fc = ort.InferenceSession(str(out / FC_FILE), options, providers=["CPUExecutionProvider"])
    layer = ort.InferenceSession(str(out / MODEL_FILE), options, providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want_hidden = draft.combine(features.float())  # [T, H]
        logits, want_prenorm, _ = _torch_reference(draft, ids, want_hidden)
    got_hidden = fc.run(["hidden"], {"features": features.float().numpy()})[0]

    lcfg = cfg.layer
    blocks = -(-t // kv_block_size)
    pool = KVPool(1, 2 * blocks + 3, kv_block_size, lcfg.num_kv_heads, lcfg.head_dim, np.float32)
    rng = np.random.default_rng(0)
    pool.k[0][...] = rng.normal(0, 3, pool.k[0].shape)  # garbage the mask must hide
    pool.v[0][...] = rng.normal(0, 3, pool.v[0].shape)
    table = pool.new_block_table()
    table.block_ids = list(rng.permutation(pool.num_blocks)[:blocks])
    split = t // 2 + 1
    prenorm_rows, tokens = [], []
    for start, end in ((0, split), (split, t)):
        batch = build_inputs([(table, ids[start:end].tolist(), start)])
        batch.logits_indices = np.arange(end - start, dtype=np.int64)  # every row
        feed = {name: getattr(batch, name) for name in STEP_INPUTS}
        feed["hidden"] = got_hidden[None, start:end]
        feed["k_pool_0"], feed["v_pool_0"] = pool.k[0], pool.v[0]
        drafted, rows, new_k, new_v = layer.run(
            ["draft_tokens", "draft_hidden", "new_k_0", "new_v_0"], feed
        )
        batch.write_kv(pool, [(new_k, new_v)])
        prenorm_rows.append(rows)
        tokens.append(drafted)
    got_prenorm, got_tokens = np.concatenate(prenorm_rows), np.concatenate(tokens)

    top2 = logits.topk(2, dim=-1).values  # [T, 2]
    scale = float(logits.abs().max())
    tie = ((top2[:, 0] - top2[:, 1]) <= 1e-4 * scale).numpy()
    want_tokens = draft.to_target_ids(logits.argmax(-1)).numpy()
    report = {
        "tokens_checked": t,
        "max_rel_fc_diff": _rel(got_hidden, want_hidden),
        "max_rel_prenorm_diff": _rel(got_prenorm, want_prenorm),
        "near_ties_exempt": int(tie.sum()),
        "mismatches": int(((got_tokens != want_tokens) & ~tie).sum()),
    }
    worst = max(report["max_rel_fc_diff"], report["max_rel_prenorm_diff"])
    if report["mismatches"] or worst > 1e-4:
        raise ValueError(f"the exported EAGLE-3 draft disagrees with the torch draft: {report}")
    return report


def _torch_reference(
    draft: Eagle3Draft, ids: torch.Tensor, hidden: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """The torch draft over one whole sequence: (logits [T, Vd], prenorm [T, H], kv)."""
    t = int(ids.shape[0])
    positions = torch.arange(t)[None]  # [1, T]
    cos, sin = cos_sin(draft.cfg.layer, positions)
    mask = causal_mask(positions, positions)  # [1, 1, T, T]
    logits, prenorm, kv = draft(ids[None], hidden[None], cos, sin, mask)
    return logits[0], prenorm[0], kv


def _rel(got: np.ndarray, want: torch.Tensor) -> float:
    want = want.float().numpy()
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))
