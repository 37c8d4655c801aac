"""The IR decoder as one opset-23 ONNX graph reading its past K/V from a paged pool.

Graph interface (the contract with the runtime; see docs/design.md, "Graph interface"):

    inputs   input_ids [S, Q] int64, positions [S, Q] int64,
             k_pool_{l}, v_pool_{l} [NB, B, Hkv, D] (pool type), block_tables [S, MB] int64,
             context_lens [S] int64, attention_mask [S, 1, Q, MB*B] bool (True = attend),
             logits_indices [N] int64 (rows of the call's S*Q tokens, s*Q + q, to compute
             logits for), kv_slots [S, Q, 2] int64 (each row's block and offset in the pool)
    outputs  logits [N, V] f32, hidden [N, hidden] f32 (final-norm output of those rows),
             k_pool_out_{l}, v_pool_out_{l} [NB, B, Hkv, D]: the pools with the call's K/V
             (K rotated) written at kv_slots, which the runtime binds to the pools' own memory,
             with `aux_layers` (EAGLE-3) also aux_hidden [S, Q, 3*hidden] f32: the residual
             streams entering those layers, concatenated, for every row of the call
    a model mixing local (sliding-window) and global layers (`ModelConfig.layer_windows`):
             the local layers' pools are [NBL, B, Hkv, D] and they read block_tables_local
             [S, MBL] int64, kv_slots_local [S, Q, 2] int64 and attention_mask_local
             [S, 1, Q, MBL*B] bool (the window applied) instead of the three above, so their
             blocks are a pool of their own that a window bounds

The graph writes the call's K/V into the pool itself (ScatterND), then gathers every position
it attends to, its own tokens included, from the pool: no Concat of the past with the new K/V.
ScatterND's output is a graph output the runtime binds to the pool input's memory, and ONNX
Runtime's kernel skips its copy of the input when the two are one buffer, so the write is in
place (benchmarks/results/kernel_ceiling.md). Run without that binding, the graph is still
correct: the outputs are then fresh copies of the pools. An fp8 pool keeps the older form
(below): its codes are FLOAT8E4M3FN and its pool uint8 bytes, and opset 23 has no BitCast to
scatter the one into the other. That form returns new_k_{l}, new_v_{l} [S, Q, Hkv*D] (kv
dtype) for the runtime to write, has no kv_slots, and its mask is [S, 1, Q, MB*B + Q]: the
past's table slots, then the call's own tokens.

kv dtype fp32 / fp16: the pool holds the values. int8 / fp8 (`kv_quant.py`): the pool holds codes
with per-head scales; the graph quantizes the new K/V (QuantizeLinear) and dequantizes what it
attends to. An fp8 pool is typed uint8 (the E4M3FN bytes): opset 23 has no Gather or Concat
for float8 types (BitCast is opset 26, and ONNX Runtime 1.32 has no CPU kernel for it), so the
gathered bytes are decoded through a 256-entry table, which is DequantizeLinear's arithmetic.

Rejected draft tokens are written like any other, beyond where the runtime then cuts the
sequence's table: later tokens overwrite them before any mask shows them. The mask carries
causality, context lengths, padding and any
sliding window, so the graph needs no notion of them and ``Attention`` never uses ``is_causal``.
Attention runs on 3-D [S, T, H*D] tensors (``q_num_heads`` / ``kv_num_heads``), so no layer
transposes its queries, keys, values or output; a decode step computes lm_head for one row
per sequence, not for every position of the call.

The layer is the IR's (`model/layers.py`): its linears (and their biases) are the modules'
own; the norm and the MLP's activation are the model family's, emitted from `NORMS` and
`ACTIVATIONS`, this graph's counterparts of the IR's tables of the same names; its
feed-forward block is the dense MLP or the sparse mixture of experts (export/moe.py), by
`FEED_FORWARDS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import ml_dtypes
import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from ..model import rope
from ..model.config import ModelConfig, RopeConfig
from ..model.kv_quant import KVQuantLayers, KVScales
from ..model.kv_rounding import KVQuant
from ..model.layer_source import LayerSource, ModelLayers
from ..model.layers import MLP, SparseMoE
from ..model.llama import LlamaModel
from .embedding import emit_embedding
from .errors import ExportError
from .graph import GraphBuilder
from .moe import sparse_moe
from .weights import emit_linear, emit_linears

__all__ = [
    "DATA_FILE",
    "MODEL_FILE",
    "ACTIVATIONS",
    "FEED_FORWARDS",
    "NORMS",
    "OPSET",
    "QUERY_SCALE",
    "SharedTensors",
    "attention",
    "export_onnx",
    "mlp",
    "norm",
    "rms_norm",
    "rope_length",
    "shared_tensors",
]

OPSET = 23
# The initializer that scales q when the attention's scale is not 1 / sqrt(head_dim).
QUERY_SCALE = "attn.query_scale"
IR_VERSION = 11  # the IR version that introduced opset 23; ORT 1.23+ reads it
MODEL_FILE, DATA_FILE = "model.onnx", "model.onnx.data"
# kv_cache.dtype -> (element type of the pool inputs, of the new_k / new_v outputs)
_KV_TYPES = {
    "fp32": (TensorProto.FLOAT, TensorProto.FLOAT),
    "fp16": (TensorProto.FLOAT16, TensorProto.FLOAT16),
    "int8": (TensorProto.INT8, TensorProto.INT8),
    "fp8": (TensorProto.UINT8, TensorProto.FLOAT8E4M3FN),  # pool: E4M3FN bytes (module doc)
}
_ZERO_POINT = {"int8": np.int8, "fp8": ml_dtypes.float8_e4m3fn}  # QuantizeLinear's output type
_DTYPE_NAMES = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.INT64: "int64",
    TensorProto.BOOL: "bool",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.FLOAT8E4M3FN: "float8e4m3fn",
}


def export_onnx(
    source: LayerSource | LlamaModel,
    out_dir: Path,
    *,
    max_seq_len: int,
    kv_dtype: Literal["fp32", "fp16", "int8", "fp8"] = "fp32",
    kv_block_size: int = 16,
    kv_scales: KVScales | None = None,
    aux_layers: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/model.onnx`` + ``model.onnx.data`` and return the graph interface.

    The graph is built from ``source`` one part at a time (embedding, each decoder layer, final
    norm, lm_head): each part's initializers go to ``model.onnx.data`` as they are emitted and
    the part is let go before the next is asked for, so a disk source (`IRLayers`) costs one
    layer (or the embedding, or lm_head) of memory plus the graph's proto, which holds no data.
    A `LlamaModel` is read through `ModelLayers`.

    An int8 / fp8 KV cache needs ``kv_scales`` of that dtype (`calibrate_kv_scales`); they
    become initializers of the graph and the returned interface's ``kv_scales``.

    ``aux_layers`` (an EAGLE-3 draft's inputs) adds the output ``aux_hidden``.
    """
    if isinstance(source, LlamaModel):
        source = ModelLayers(source)
    cfg = source.cfg
    _validate(cfg, max_seq_len, kv_dtype, kv_block_size)
    _validate_scales(cfg, kv_dtype, kv_scales)
    outside = [i for i in aux_layers or () if not 0 <= i < cfg.num_layers]
    if outside:
        raise ExportError(
            f"speculative eagle aux layers {list(aux_layers)}: {outside} not in "
            f"[0, {cfg.num_layers - 1}] (the target's layers)"
        )
    if kv_scales is not None:
        source = KVQuantLayers(source, kv_scales)  # each layer carries its K/V rounding
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / DATA_FILE, "wb") as data, torch.no_grad():
        g = GraphBuilder(data, DATA_FILE)
        _build(g, source, max_seq_len, kv_dtype, kv_block_size, tuple(aux_layers or ()))
    graph = helper.make_graph(g.nodes, "ingot_decoder", g.inputs, g.outputs, g.initializers)
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="ingot",
    )
    (out_dir / MODEL_FILE).write_bytes(proto.SerializeToString())
    info = {
        "path": MODEL_FILE,
        "opset": OPSET,
        "inputs": [_describe(v) for v in g.inputs],
        "outputs": [_describe(v) for v in g.outputs],
        "num_layers": cfg.num_layers,
        "kv_block_size": kv_block_size,
        "kv_dtype": kv_dtype,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
    }
    if kv_scales is not None:
        info["kv_scales"] = kv_scales.to_json()
    return info


def rope_length(graph: Path) -> int:
    """The sequence length the RoPE table of the graph at `graph` was made for (its rows:
    the export's max_seq_len), read from the proto alone (the weights stay on disk)."""
    proto = onnx.load(str(graph), load_external_data=False)
    table = next((t for t in proto.graph.initializer if t.name == "rope.cos_cache"), None)
    if table is None:
        raise ExportError(f"{graph}: no rope.cos_cache table (not ingot's decoder graph)")
    return int(table.dims[0])


def _validate(cfg: ModelConfig, max_seq_len: int, kv_dtype: str, kv_block_size: int) -> None:
    if cfg.rope.type == "dynamic":
        raise ExportError(
            "export: dynamic NTK RoPE cannot be exported: its frequencies change with the "
            "longest position of each call, so keys already rotated into the paged KV cache "
            "would no longer match the queries. Use default, linear or llama3 RoPE scaling."
        )
    if not 0 < max_seq_len <= cfg.max_position_embeddings:
        raise ExportError(
            f"export.max_seq_len: {max_seq_len} must be in [1, {cfg.max_position_embeddings}] "
            "(the model's max_position_embeddings)"
        )
    if kv_dtype not in _KV_TYPES:
        raise ExportError(f"kv_cache.dtype: {kv_dtype!r} (allowed: {', '.join(_KV_TYPES)})")
    if cfg.head_dim % 2:
        raise ExportError(f"head_dim {cfg.head_dim} is odd: RoPE rotates pairs of channels")
    if kv_block_size < 1:
        raise ExportError(f"kv_cache.block_size: {kv_block_size} must be positive")


def _validate_scales(cfg: ModelConfig, kv_dtype: str, scales: KVScales | None) -> None:
    if kv_dtype in _ZERO_POINT and scales is None:
        raise ExportError(
            f"kv_cache.dtype: {kv_dtype} needs per-head K/V scales (calibrate_kv_scales on the "
            "calibration windows)"
        )
    if scales is None:
        return
    expected = (cfg.num_layers, cfg.num_kv_heads)
    if scales.dtype != kv_dtype or tuple(scales.k.shape) != expected:
        raise ExportError(
            f"kv_cache.dtype: {kv_dtype} with {scales.dtype} scales of shape "
            f"{tuple(scales.k.shape)} (expected {kv_dtype} scales [layers, kv heads] = {expected})"
        )


def _build(
    g: GraphBuilder,
    src: LayerSource,
    max_seq_len: int,
    kv_dtype: str,
    bs: int,
    aux_layers: tuple[int, ...] = (),
) -> None:
    cfg = src.cfg
    hkv, d, h = cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    pool_type, kv_type = _KV_TYPES[kv_dtype]
    ids = g.input("input_ids", TensorProto.INT64, ["S", "Q"])
    positions = g.input("positions", TensorProto.INT64, ["S", "Q"])
    # A local layer's pool has its own block count (NBL: `_local_inputs`).
    blocks = ["NBL" if w is not None and cfg.layer_windows else "NB" for w in cfg.windows]
    pools = [
        (
            g.input(f"k_pool_{i}", pool_type, [blocks[i], bs, hkv, d]),
            g.input(f"v_pool_{i}", pool_type, [blocks[i], bs, hkv, d]),
        )
        for i in range(cfg.num_layers)
    ]
    tables = g.input("block_tables", TensorProto.INT64, ["S", "MB"])
    g.input("context_lens", TensorProto.INT64, ["S"])  # the mask encodes it; kept for the runtime
    mask = g.input("attention_mask", TensorProto.BOOL, ["S", 1, "Q", "KV"])
    rows = g.input("logits_indices", TensorProto.INT64, ["N"])
    # Where each row's K/V go: the graph writes the pool (module doc), but for an fp8 pool.
    writes_pool = kv_dtype != "fp8"
    kv_slots = g.input("kv_slots", TensorProto.INT64, ["S", "Q", 2]) if writes_pool else None

    consts = shared_tensors(g, cfg, max_seq_len, kv_dtype, kv_slots)
    # The local layers of a model mixing local and global layers read their own pool blocks:
    # a table, slots and a mask of their own (`_local_inputs`).
    local = _local_inputs(g, consts) if cfg.layer_windows is not None else None
    local_rope = _rope_cache(g, cfg, cfg.rope_local, max_seq_len, "rope.local")

    # One part of the model alive at a time: each is written, then let go (`del`) before the
    # next is read, so a disk source never holds two.
    embedding = emit_embedding(g, src, ids, h)
    x = _scaled_rows(g, cfg, embedding.rows)  # [S, Q, hidden]
    entering = {}  # layer index -> the residual stream entering it (EAGLE-3's aux states)
    for i in range(cfg.num_layers):
        entering[i] = x
        layer = src.layer(i)
        tables_i, mask_i, consts_i = (
            (tables, mask, consts) if local is None or blocks[i] == "NB" else local
        )
        if layer.rope != cfg.rope:  # the sliding layers' own RoPE (Gemma 3)
            consts_i = replace(consts_i, cos=local_rope[0], sin=local_rope[1])
        x = _layer(g, cfg, layer, i, x, positions, pools[i], tables_i, mask_i, consts_i, kv_type)
        del layer

    # Only the rows the runtime samples from go through the final norm and lm_head.
    flat = g.op("Reshape", [x, g.ints("shape.rows", [-1, h])], "hidden/Reshape")  # [S*Q, h]
    picked = g.op("Gather", [flat, rows], "hidden/Gather", axis=0)  # [N, hidden]
    final = src.final_norm()
    hidden = norm(g, cfg, picked, final, "norm", out="hidden")  # [N, hidden]
    del final
    if src.lm_head_tied:  # the embedding's own initializers, float or quantized
        embedding.logits(g, hidden, out="logits")  # [N, V]
    else:
        emit_linear(g, hidden, src.lm_head(), "lm_head", out="logits")  # [N, V]

    g.output("logits", TensorProto.FLOAT, ["N", cfg.vocab_size])
    g.output("hidden", TensorProto.FLOAT, ["N", h])
    if aux_layers:
        aux = [entering[i] for i in aux_layers]
        g.op("Concat", aux, "aux_hidden/Concat", out="aux_hidden", axis=-1)  # [S, Q, 3*hidden]
        g.output("aux_hidden", TensorProto.FLOAT, ["S", "Q", len(aux) * h])
    for i in range(cfg.num_layers):
        for kind in "kv":
            if writes_pool:
                g.output(f"{kind}_pool_out_{i}", pool_type, [blocks[i], bs, hkv, d])
            else:
                g.output(f"new_{kind}_{i}", kv_type, ["S", "Q", hkv * d])


@dataclass(frozen=True, slots=True)
class SharedTensors:
    """Names of the tensors every layer reuses."""

    cos: str  # [max_seq_len, R/2], R = the channels of a head RoPE rotates
    sin: str
    past: str  # reshape target: gathered blocks -> [S, MB*B, Hkv*D]
    fp8_values: str | None = None  # [256] float32: the value of each E4M3FN byte (fp8 pools)
    # The graph writes its K/V into the pool: the `kv_slots` input [S, Q, 2], and the reshape
    # target [S, Q, Hkv*D] -> [S, Q, Hkv, D] of what it scatters. None: it returns them.
    kv_slots: str | None = None
    kv_rows: str | None = None


def shared_tensors(
    g: GraphBuilder, cfg: ModelConfig, max_seq_len: int, kv_dtype: str, kv_slots: str | None = None
) -> SharedTensors:
    """The RoPE tables (computed exactly as the IR computes cos / sin) and the constants every
    layer's attention reads; with `kv_slots` (an input) the layers write their K/V into the
    pool there, else they return them."""
    rows = [0, 0, cfg.num_kv_heads, cfg.head_dim]
    cos, sin = _rope_cache(g, cfg, cfg.rope, max_seq_len, "rope")
    return SharedTensors(
        cos=cos,  # [max_seq_len, R/2] (R: the rotated channels)
        sin=sin,
        past=g.ints("shape.past", [0, -1, cfg.num_kv_heads * cfg.head_dim]),
        fp8_values=_fp8_values(g) if kv_dtype == "fp8" else None,
        kv_slots=kv_slots,
        kv_rows=g.ints("shape.kv_rows", rows) if kv_slots is not None else None,
    )


def _rope_cache(
    g: GraphBuilder, cfg: ModelConfig, spec: RopeConfig | None, max_seq_len: int, name: str
) -> tuple[str, str]:
    """`name`.cos_cache, `name`.sin_cache [max_seq_len, R/2] of the RoPE `spec` (`rope.table`,
    as the IR computes cos / sin); None: no such tables, ("", "")."""
    if spec is None:
        return "", ""
    cos, sin = rope.table(cfg, max_seq_len, spec)
    return g.array(f"{name}.cos_cache", cos.numpy()), g.array(f"{name}.sin_cache", sin.numpy())


def _scaled_rows(g: GraphBuilder, cfg: ModelConfig, rows: str) -> str:
    """The embedded rows [S, Q, hidden] times the family's scale (`llama.scale_embedding`)."""
    if cfg.embedding_scale is None:
        return rows
    scale = g.array("embed_tokens.scale", np.array(cfg.embedding_scale, np.float32))
    return g.op("Mul", [rows, scale], "embed_tokens/scale")


def _local_inputs(g: GraphBuilder, consts: SharedTensors) -> tuple[str, str, SharedTensors]:
    """The inputs the local (sliding-window) layers of a model mixing local and global layers
    read instead of the global ones: ``block_tables_local`` [S, MBL] into their own pools
    (NBL blocks, a window's worth per sequence), ``attention_mask_local`` [S, 1, Q, MBL*B]
    (the window applied) and ``kv_slots_local`` [S, Q, 2]; plain int64 / bool inputs through
    the same Gather / ScatterND / Attention path as the global ones."""
    if consts.kv_slots is None:
        raise ExportError(
            "kv_cache.dtype: fp8 returns the call's K/V instead of writing the pool, which a "
            "model mixing local and global layers does not support (use fp16, fp32 or int8)"
        )
    tables = g.input("block_tables_local", TensorProto.INT64, ["S", "MBL"])
    mask = g.input("attention_mask_local", TensorProto.BOOL, ["S", 1, "Q", "KVL"])
    slots = g.input("kv_slots_local", TensorProto.INT64, ["S", "Q", 2])
    return tables, mask, replace(consts, kv_slots=slots)


def _fp8_values(g: GraphBuilder) -> str:
    """[256] float32, entry b = the float8 E4M3FN value of byte b (NaN at 0x7F, 0xFF: never
    written, QuantizeLinear saturates)."""
    table = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return g.array("kv.fp8_values", table)


def _layer(g, cfg, layer, i, x, positions, pool, tables, mask, c: SharedTensors, kv_type) -> str:
    """One decoder layer; x: [S, Q, hidden] -> [S, Q, hidden]."""
    name = f"layers.{i}"
    h = norm(g, cfg, x, layer.attn_norm, f"{name}.attn_norm")  # [S, Q, hidden]
    attn = attention(g, layer.attn, i, h, positions, pool, tables, mask, c, kv_type)
    if layer.attn_post_norm is not None:
        attn = norm(g, cfg, attn, layer.attn_post_norm, f"{name}.attn_post_norm")
    x = g.op("Add", [x, attn], f"{name}/attn_residual")
    h = norm(g, cfg, x, layer.mlp_norm, f"{name}.mlp_norm")
    h = FEED_FORWARDS[type(layer.mlp)](g, layer.mlp, f"{name}.mlp", h)  # [S, Q, hidden]
    if layer.mlp_post_norm is not None:
        h = norm(g, cfg, h, layer.mlp_post_norm, f"{name}.mlp_post_norm")
    return g.op("Add", [x, h], f"{name}/mlp_residual")


def attention(g, attn, i, h, positions, pool, tables, mask, c: SharedTensors, kv_type) -> str:
    """Layer i's attention block through o_proj; h: the normed input [S, Q, in] -> [S, Q,
    hidden]. Writes the graph outputs {k,v}_pool_out_{i} (the pools with the call's K, rotated,
    and V scattered in) when `c.kv_slots`, else new_k_{i} / new_v_{i} (those K and V)."""
    hq, hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    a = f"layers.{i}.attn"
    fp32_kv = kv_type == TensorProto.FLOAT  # a quantized pool's outputs are never float
    returns_kv = c.kv_slots is None
    projections = [attn.q_proj, attn.k_proj, attn.v_proj]
    # V is a graph output as it comes (fp32 pool, K/V returned); K is one after RoPE.
    v_out = f"new_v_{i}" if fp32_kv and returns_kv else None
    q, k, v = emit_linears(
        g, h, projections, [f"{a}.{p}_proj" for p in "qkv"], f"{a}.qkv_proj", [None, None, v_out]
    )  # [S, Q, Hq*D], [S, Q, Hkv*D], [S, Q, Hkv*D]
    if attn.q_norm is not None:  # per-head norms before RoPE (Qwen3, Gemma 3)
        q = _head_norm(g, attn, attn.q_norm, f"{a}.q_norm", q, hq)
        k = _head_norm(g, attn, attn.k_norm, f"{a}.k_norm", k, hkv)
    # 3D RotaryEmbedding (num_heads attr) rotates [S, Q, H*D] in place of a reshape round trip;
    # a partial one (rotary_embedding_dim) rotates the first R channels of each head.
    partial = {} if attn.rotary_dim == d else {"rotary_embedding_dim": attn.rotary_dim}
    q = g.op(
        "RotaryEmbedding", [q, c.cos, c.sin, positions], f"{a}/rope_q", num_heads=hq, **partial
    )
    k_out = f"new_k_{i}" if fp32_kv and returns_kv else None
    k = g.op(
        "RotaryEmbedding",
        [k, c.cos, c.sin, positions],
        f"{a}/rope_k",
        out=k_out,
        num_heads=hkv,
        **partial,
    )
    if not math.isclose(attn.scale * math.sqrt(d), 1.0, rel_tol=1e-7):
        # A scale other than 1 / sqrt(D) (Gemma's query_pre_attn_scalar) as a named factor on
        # q, which an engine rebuilding the graph from its initializers reads (`QUERY_SCALE`).
        factor = g.array(QUERY_SCALE, np.array(attn.scale * math.sqrt(d), np.float32))
        q = g.op("Mul", [q, factor], f"{a}/query_scale")

    keys_values = []
    for kind, new, pool_in in (("k", k, pool[0]), ("v", v, pool[1])):
        if attn.kv_quant is not None:
            keys_values.append(_quantized_kv(g, attn.kv_quant, kind, d, i, new, pool_in, tables, c))
            continue
        if not fp32_kv:
            # Round the new K/V to the pool dtype before attending, so a token sees exactly
            # what later tokens will read back from the pool: results don't depend on chunking.
            out = f"new_{kind}_{i}" if returns_kv else None
            new = g.op("Cast", [new], f"{a}/new_{kind}_cast", out=out, to=kv_type)
        full = _keys_or_values(g, a, kind, i, new, pool_in, tables, c)  # [S, KV, Hkv*D]
        if not fp32_kv:
            full = g.op("Cast", [full], f"{a}/{kind}_f32", to=TensorProto.FLOAT)
        keys_values.append(full)

    ctx = g.op(
        "Attention",
        [q, *keys_values, mask],
        f"{a}/Attention",
        q_num_heads=hq,
        kv_num_heads=hkv,
        scale=1.0 / math.sqrt(d),
    )  # [S, Q, Hq*D]
    return emit_linear(g, ctx, attn.o_proj, f"{a}.o_proj")  # [S, Q, hidden]


def _head_norm(g: GraphBuilder, attn, module, name: str, x: str, heads: int) -> str:
    """The family's norm (`attn.norm`) over each head of x: [S, Q, H*D] -> [S, Q, H*D]."""
    split = g.ints(f"{name}.heads", [0, 0, heads, attn.head_dim])
    joined = g.ints(f"{name}.joined", [0, 0, heads * attn.head_dim])
    x = g.op("Reshape", [x, split], f"{name}/split")  # [S, Q, H, D]
    x = NORMS[attn.norm](g, x, module, name)  # [S, Q, H, D]
    return g.op("Reshape", [x, joined], f"{name}/join")  # [S, Q, H*D]


def _keys_or_values(
    g: GraphBuilder, a: str, kind: str, i: int, new: str, pool: str, tables: str, c: SharedTensors
) -> str:
    """Every key (or value) the call's tokens attend to, [S, KV, Hkv*D] in the pool's type,
    from `new` [S, Q, Hkv*D] (as the pool stores it). With `c.kv_slots` the graph writes `new`
    into the pool (the output {kind}_pool_out_{i}) and gathers all KV = MB*B table slots from
    it; else it gathers the past's table slots and concatenates `new` after them."""
    if c.kv_slots is not None:
        rows = g.op("Reshape", [new, c.kv_rows], f"{a}/{kind}_rows")  # [S, Q, Hkv, D]
        pool = g.op(
            "ScatterND", [pool, c.kv_slots, rows], f"{a}/{kind}_write", out=f"{kind}_pool_out_{i}"
        )  # [NB, B, Hkv, D]: bound to the pool input's memory by the runtime
    past = g.op("Gather", [pool, tables], f"{a}/{kind}_gather", axis=0)  # [S, MB, B, Hkv, D]
    past = g.op("Reshape", [past, c.past], f"{a}/{kind}_past")  # [S, MB*B, Hkv*D]
    if c.kv_slots is not None:
        return past
    return g.op("Concat", [past, new], f"{a}/{kind}_concat", axis=1)  # [S, MB*B+Q, Hkv*D]


def mlp(g: GraphBuilder, module: torch.nn.Module, m: str, h: str) -> str:
    """The gated MLP (`layers.MLP`, its activation by name): h [S, Q, hidden] (normed) ->
    [S, Q, hidden]; gate|up are one linear."""
    gate, up = emit_linears(
        g,
        h,
        [module.gate_proj, module.up_proj],
        [f"{m}.gate_proj", f"{m}.up_proj"],
        f"{m}.gate_up_proj",
    )  # [S, Q, ffn] each
    act = g.op("Mul", [ACTIVATIONS[module.activation](g, gate, m), up], f"{m}/gated")
    return emit_linear(g, act, module.down_proj, f"{m}.down_proj")


# A layer's feed-forward block by its IR module: the dense MLP, or the sparse mixture of
# experts (export/moe.py) whose experts are MLPs.
FEED_FORWARDS: dict[type, Callable[[GraphBuilder, torch.nn.Module, str, str], str]] = {
    MLP: mlp,
    SparseMoE: lambda g, module, m, h: sparse_moe(g, module, m, h, expert=mlp),
}


def _silu(g: GraphBuilder, x: str, m: str) -> str:
    """x * sigmoid(x), elementwise."""
    return g.op("Mul", [x, g.op("Sigmoid", [x], f"{m}/Sigmoid")], f"{m}/silu")


def _gelu_tanh(g: GraphBuilder, x: str, m: str) -> str:
    """GELU's tanh approximation, elementwise (opset 20's Gelu)."""
    return g.op("Gelu", [x], f"{m}/gelu", approximate="tanh")


def _quantized_kv(
    g: GraphBuilder,
    quant: KVQuant,
    kind: str,
    d: int,
    i: int,
    new: str,
    pool: str,
    tables: str,
    c: SharedTensors,
) -> str:
    """One layer's K or V for `Attention` from an int8 / fp8 pool: the call's new values
    quantized (output ``new_{kind}_{i}``, the codes the runtime stores), concatenated after the
    gathered past codes, all dequantized: [S, MB*B + Q, Hkv*D] float32. The new tokens attend
    to their codes too, as later calls will read them (`KVQuant` in the IR)."""
    a, dtype = f"layers.{i}.attn", quant.dtype
    scale = getattr(quant, f"{kind}_scale").detach().cpu()  # [Hkv]
    # Per-head scales as per-channel ones (axis -1 of [.., Hkv*D]): blocked Q/DQ would need a
    # scale of the input's rank, whose leading dims (S, Q) are dynamic.
    channel_scale = g.array(f"{a}.{kind}_scale", np.repeat(scale.numpy(), d))  # [Hkv*D]
    zero = g.array(f"{a}.{kind}_zero_point", np.zeros(scale.numel() * d, _ZERO_POINT[dtype]))
    codes = g.op(
        "QuantizeLinear",
        [new, channel_scale, zero],
        f"{a}/new_{kind}_quant",
        out=f"new_{kind}_{i}" if c.kv_slots is None else None,
        axis=-1,
        saturate=1,
    )  # [S, Q, Hkv*D] int8 | float8e4m3fn
    if dtype == "int8":
        full = _keys_or_values(g, a, kind, i, codes, pool, tables, c)  # [S, KV, Hkv*D] codes
        return g.op(
            "DequantizeLinear", [full, channel_scale, zero], f"{a}/{kind}_dequant", axis=-1
        )  # [S, KV, Hkv*D] float32
    # fp8: the past is uint8 bytes (no float8 Gather / Concat in opset 23): byte -> its E4M3FN
    # value by table, times the scale, which is DequantizeLinear's float(code) * scale.
    past = g.op("Gather", [pool, tables], f"{a}/{kind}_gather", axis=0)  # [S, MB, B, Hkv, D]
    past = g.op("Reshape", [past, c.past], f"{a}/{kind}_past")  # [S, MB*B, Hkv*D] codes
    index = g.op("Cast", [past], f"{a}/{kind}_past_index", to=TensorProto.INT32)
    values = g.op("Gather", [c.fp8_values, index], f"{a}/{kind}_past_values", axis=0)
    past = g.op("Mul", [values, channel_scale], f"{a}/{kind}_past_dequant")  # [S, MB*B, Hkv*D]
    new = g.op(
        "DequantizeLinear", [codes, channel_scale, zero], f"{a}/new_{kind}_dequant", axis=-1
    )  # [S, Q, Hkv*D] float32
    return g.op("Concat", [past, new], f"{a}/{kind}_concat", axis=1)  # [S, KV, Hkv*D]


def rms_norm(g: GraphBuilder, x: str, module: torch.nn.Module, name: str, out: str | None = None):
    """`layers.RMSNorm` over the last axis of x; `layers.OffsetRMSNorm` too, whose scale
    (1 + weight) is its multiplier (`RMSNorm.multiplier`), computed here in float32."""
    scale = g.array(f"{name}.weight", module.multiplier.detach().float().numpy())
    return g.op(
        "RMSNormalization", [x, scale], f"{name}/RMSNorm", out=out, axis=-1, epsilon=module.eps
    )


# The blocks a family names (`ModelFamily.norm`, `.activation`), as ONNX nodes: the IR's
# `layers.NORMS` and `layers.ACTIVATIONS`, emitted.
NORMS: dict[str, Callable[..., str]] = {"rms": rms_norm, "gemma_rms": rms_norm}
ACTIVATIONS: dict[str, Callable[[GraphBuilder, str, str], str]] = {
    "silu": _silu,
    "gelu_pytorch_tanh": _gelu_tanh,
}


def norm(
    g: GraphBuilder,
    cfg: ModelConfig,
    x: str,
    module: torch.nn.Module,
    name: str,
    out: str | None = None,
) -> str:
    """The family's norm `module` (IR name `name`) over the last axis of x."""
    return NORMS[cfg.family.norm](g, x, module, name, out)


def _describe(value_info: Any) -> dict[str, Any]:
    t = value_info.type.tensor_type
    dims = [dim.dim_param or dim.dim_value for dim in t.shape.dim]
    return {"name": value_info.name, "dtype": _DTYPE_NAMES[t.elem_type], "shape": dims}
