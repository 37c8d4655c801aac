"""ingot's decoder as an OpenVINO model over PagedAttention, rebuilt from its exported graph.

The model (T = the call's new tokens packed sequence by sequence, no padding; N = the rows
whose logits the call wants):

    inputs   input_ids [T] i64, positions [T] i64, logits_indices [N] i64 (rows of the T),
             past_lens, subsequence_begins, block_indices, block_indices_begins,
             max_context_len (paged_attention.PagedParams), key_cache.{l}, value_cache.{l}
             (the plugin's layout: layout.py)
    outputs  logits [N, V] f32; on request hidden [N, hidden] (the final norm's output of
             those rows, what logits come from: the exported graph's `hidden`) and aux_hidden
             [T, len(aux) * hidden] (the residual streams entering the `aux` layers: its
             `aux_hidden`, packed)

The layer is the exported graph's (pipeline/export/decoder.py): RMSNorm, the q|k|v linear(s)
with their biases, per-head RMSNorms of q and k where the graph has them, rotate-half RoPE
from the graph's own cos / sin tables by position, paged attention (the model's window where
it has one), o_proj + residual, RMSNorm, gate|up, SiLU(gate) * up, down_proj + residual; the
final norm and lm_head for the `logits_indices` rows only. Norms
are written in the pattern OpenVINO's RMSFusion turns into its RMS kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ingot.runtime.engines.base import SessionError
from ingot.runtime.engines.openvino.paged_attention import (
    PagedParams,
    paged_attention,
    paged_params,
)
from ingot.runtime.engines.openvino.weights import GraphWeights

__all__ = ["ModelShape", "build_model"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the rebuild reads off the exported graph (`of`) and the loader (the windows)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    windows: tuple[int, ...]  # per layer, 0: attends to the whole context
    aux_layers: tuple[int, ...] = ()  # layers whose entering streams aux_hidden joins
    # A model mixing local and global layers: the local ones, which read blocks of their own
    # pool through a table of their own (block_indices_local / block_indices_begins_local).
    local_layers: tuple[int, ...] = ()
    # The leading channels of each head RoPE rotates (the graph's cos table holds half as
    # many columns; 0: head_dim), the rest pass through: partial rotary (Phi-4-mini).
    rotary_dim: int = 0
    gelu: bool = False  # the MLP's activation is GELU (tanh), else SiLU

    @classmethod
    def of(
        cls,
        w: GraphWeights,
        sliding_window: int | None,
        aux: bool,
        local_layers: tuple[int, ...] = (),
    ) -> ModelShape:
        """The shape of the graph `w` was read from; `sliding_window` the model's (every
        layer's, or with `local_layers` (the pool's) theirs only); `aux` reads the layers its
        aux_hidden output joins."""
        num_layers = sum(name.endswith(".attn_norm.weight") for name in w.names("layers."))
        hkv, d = w.pool_heads()
        if _has_linear(w, "layers.0.attn.qkv_proj"):  # fused: (Hq + 2 Hkv) * D columns
            hq = _columns(w, "layers.0.attn.qkv_proj") // d - 2 * hkv
        else:
            hq = _columns(w, "layers.0.attn.q_proj") // d
        return cls(
            num_layers=num_layers,
            num_heads=hq,
            num_kv_heads=hkv,
            head_dim=d,
            rms_eps=w.norm_epsilon("layers.0.attn_norm"),
            windows=tuple(
                (sliding_window or 0) if not local_layers or i in local_layers else 0
                for i in range(num_layers)
            ),
            aux_layers=tuple(w.entering_layers("aux_hidden")) if aux else (),
            local_layers=local_layers,
            rotary_dim=2 * w.shape("rope.cos_cache")[1],
            gelu=w.op_type("layers.0.mlp/gelu") == "Gelu",
        )


def _has_linear(w: GraphWeights, name: str) -> bool:
    """Whether the graph has linear `name` (its codes or float weight): q|k|v and gate|up are
    one fused linear where the export could fuse them (one scheme), else their parts."""
    return w.linear_columns(name) is not None


def _columns(w: GraphWeights, name: str) -> int:
    """Output width N of linear `name` (GraphWeights.linear_columns)."""
    columns = w.linear_columns(name)
    if columns is None:
        raise SessionError(f"the graph has no weights for {name} (.codes_t or .weight_t)")
    return columns


def _ints(values: list[int]) -> ov.Node:
    return ops.constant(np.array(values, np.int64))


def _rms_norm(x: ov.Output, weight: ov.Node, eps: float) -> ov.Output:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    square = ops.power(x, ops.constant(np.float32(2.0)))
    mean = ops.reduce_mean(square, _ints([-1]), True)
    root = ops.sqrt(ops.add(mean, ops.constant(np.float32(eps))))
    inverse = ops.divide(ops.constant(np.float32(1.0)), root)
    return ops.multiply(ops.multiply(x, inverse), weight).output(0)


def _head_norm(w: GraphWeights, x: ov.Output, name: str, heads: int, d: int) -> ov.Output:
    """The norm `name` over each head's D channels: x [T, H*D] -> [T, H*D]."""
    x = ops.reshape(x, _ints([0, heads, d]), True).output(0)  # [T, H, D]
    x = _rms_norm(x, w.constant(f"{name}.weight"), w.norm_epsilon(name))
    return ops.reshape(x, _ints([0, heads * d]), True).output(0)


def _rope(
    x: ov.Output, heads: int, d: int, cos: ov.Output, sin: ov.Output, rotary: int = 0
) -> ov.Output:
    """Rotate-half RoPE (ONNX RotaryEmbedding, interleaved 0) on the first `rotary` channels
    of each head (0: all D; the rest pass through): x [T, H*D], cos / sin [T, 1, R/2] ->
    [T, H*D]."""
    x = ops.reshape(x, _ints([0, heads, d]), True)  # [T, H, D]
    passed = []
    if 0 < rotary < d:
        x, rest = ops.variadic_split(x, ops.constant(np.int64(-1)), _ints([rotary, -1])).outputs()
        passed = [rest]  # [T, H, D - R]
    x1, x2 = ops.split(x, ops.constant(np.int64(-1)), 2).outputs()  # [T, H, R/2] each
    first = ops.subtract(ops.multiply(x1, cos), ops.multiply(x2, sin))
    second = ops.add(ops.multiply(x2, cos), ops.multiply(x1, sin))
    joined = ops.concat([first, second, *passed], -1)
    return ops.reshape(joined, _ints([0, heads * d]), True).output(0)


def _layer(
    w: GraphWeights,
    s: ModelShape,
    i: int,
    x: ov.Output,
    rope: tuple[ov.Output, ov.Output],
    caches: tuple[ov.Node, ov.Node],
    paged: PagedParams,
) -> ov.Output:
    """Decoder layer i: x [T, hidden] -> [T, hidden]."""
    name, hq, hkv, d = f"layers.{i}", s.num_heads, s.num_kv_heads, s.head_dim
    h = _rms_norm(x, w.constant(f"{name}.attn_norm.weight"), s.rms_eps)
    attn = f"{name}.attn"
    if _has_linear(w, f"{attn}.qkv_proj"):
        qkv = w.linear(h, f"{attn}.qkv_proj")  # [T, (Hq + 2 Hkv) * D]
        widths = _ints([hq * d, hkv * d, hkv * d])
        q, k, v = ops.variadic_split(qkv, ops.constant(np.int64(-1)), widths).outputs()
    else:
        q, k, v = (w.linear(h, f"{attn}.{p}_proj") for p in "qkv")
    if w.has(f"{attn}.q_norm.weight"):  # per-head q/k norms before RoPE (Qwen3, Gemma 3)
        q, k = _head_norm(w, q, f"{attn}.q_norm", hq, d), _head_norm(w, k, f"{attn}.k_norm", hkv, d)
    q, k = _rope(q, hq, d, *rope, s.rotary_dim), _rope(k, hkv, d, *rope, s.rotary_dim)
    query_scale = w.factor(f"{attn}/query_scale")
    if query_scale is not None:
        q = ops.multiply(q, query_scale).output(0)
    ctx = paged_attention((q, k, v), caches, paged, (hkv, d), s.windows[i])  # [T, Hq*D]
    x = ops.add(x, _post_norm(w, f"{name}.attn_post_norm", w.linear(ctx, f"{attn}.o_proj"), s))
    h = _rms_norm(x.output(0), w.constant(f"{name}.mlp_norm.weight"), s.rms_eps)
    mlp = f"{name}.mlp"
    if _has_linear(w, f"{mlp}.router"):  # the preflight refuses it first (engines/openvino)
        raise SessionError(
            f"{mlp}: a mixture of experts, which the OpenVINO engine does not run (use the "
            "onnxruntime engine)"
        )
    if _has_linear(w, f"{mlp}.gate_up_proj"):
        gate_up = w.linear(h, f"{mlp}.gate_up_proj")  # [T, 2 * ffn]
        gate, up = ops.split(gate_up, ops.constant(np.int64(-1)), 2).outputs()
    else:
        gate, up = w.linear(h, f"{mlp}.gate_proj"), w.linear(h, f"{mlp}.up_proj")
    gated = ops.gelu(gate, "tanh") if s.gelu else ops.swish(gate)
    act = ops.multiply(gated, up)  # SiLU(gate) * up, or GeGLU's GELU(gate) * up
    down = w.linear(act.output(0), f"{name}.mlp.down_proj")
    return ops.add(x, _post_norm(w, f"{name}.mlp_post_norm", down, s)).output(0)


def _post_norm(w: GraphWeights, name: str, x: ov.Output, s: ModelShape) -> ov.Output:
    """A sublayer's output x [T, hidden] through its post-norm `name` where the graph has one
    (Gemma's sandwich layer), else as it is."""
    if not w.has(f"{name}.weight"):
        return x
    return _rms_norm(x, w.constant(f"{name}.weight"), s.rms_eps)


def _rope_rows(
    w: GraphWeights, name: str, positions: ov.Output, d: int
) -> tuple[ov.Output, ov.Output] | None:
    """cos, sin [T, 1, R/2] of the graph's RoPE table `name` at `positions` (R: the rotated
    channels of a head, `d`); None without it."""
    if not w.has(f"{name}.cos_cache"):
        return None
    axis0 = ops.constant(np.int64(0))
    half = _ints([0, 1, d // 2])  # [T, 1, R/2]: 0 keeps T (special_zero)
    return tuple(
        ops.reshape(
            ops.gather(w.constant(f"{name}.{f}_cache"), positions, axis0), half, True
        ).output(0)
        for f in ("cos", "sin")
    )


def _result(value: ov.Output, name: str) -> ov.Node:
    result = ops.result(value, name=name)
    result.output(0).get_tensor().set_names({name})
    return result


def build_model(w: GraphWeights, s: ModelShape, hidden: bool = False) -> ov.Model:
    """The decoder over PagedAttention (module docstring); `hidden` adds that output, and
    `s.aux_layers` aux_hidden. The caches' type and shape are left to the plugin
    (KV_CACHE_PRECISION): the compiled model's inputs say what it picked."""
    ids = ops.parameter([-1], ov.Type.i64, name="input_ids")
    positions = ops.parameter([-1], ov.Type.i64, name="positions")
    rows = ops.parameter([-1], ov.Type.i64, name="logits_indices")
    paged = paged_params()
    # The local layers' own tables: the call's layout but their block indices.
    local = paged_params(paged, "_local") if s.local_layers else paged
    caches = [
        tuple(
            ops.parameter(ov.PartialShape.dynamic(4), ov.Type.dynamic, name=f"{kind}_cache.{i}")
            for kind in ("key", "value")
        )
        for i in range(s.num_layers)
    ]
    axis0 = ops.constant(np.int64(0))
    x = w.embedding(ids)  # [T, hidden]
    embedding_scale = w.factor("embed_tokens/scale")
    if embedding_scale is not None:  # the rows as the first layer reads them (Gemma: sqrt(H))
        x = ops.multiply(x, embedding_scale).output(0)
    ropes = {
        name: _rope_rows(w, name, positions, s.rotary_dim or s.head_dim)
        for name in ("rope", "rope.local")
    }
    entering = []
    for i in range(s.num_layers):
        entering.append(x)
        reads = local if i in s.local_layers else paged
        # The sliding layers' own RoPE where the graph has one (Gemma 3's local base).
        rope = ropes["rope.local"] if s.windows[i] and ropes["rope.local"] else ropes["rope"]
        x = _layer(w, s, i, x, rope, caches[i], reads)
    picked = ops.gather(x, rows, axis0).output(0)  # [N, hidden]
    normed = _rms_norm(picked, w.constant("norm.weight"), s.rms_eps)  # [N, hidden]
    if _has_linear(w, "lm_head"):
        logits = w.linear(normed, "lm_head")
    elif _has_linear(w, "embed_tokens"):  # tied to a quantized table: its compressed weight
        logits = w.linear(normed, "embed_tokens")
    else:  # tied: the embedding [V, hidden], transposed in the MatMul
        logits = ops.matmul(normed, w.constant("embed_tokens.weight"), False, True).output(0)
    results = [_result(logits, "logits")]
    if hidden:
        results.append(_result(normed, "hidden"))
    if s.aux_layers:
        aux = ops.concat([entering[i] for i in s.aux_layers], -1).output(0)  # [T, 3 hidden]
        results.append(_result(aux, "aux_hidden"))
    own = [local.block_indices, local.block_indices_begins] if s.local_layers else []
    parameters = [ids, positions, rows, *paged.parameters(), *own]
    parameters += [p for kv in caches for p in kv]
    return ov.Model(results, parameters, "ingot_decoder_paged")
