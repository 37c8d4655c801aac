"""ingot's Llama decoder as an OpenVINO model over PagedAttention, from ingot's own weights.

Inputs (T = the call's new tokens packed sequence by sequence, no padding; N = rows whose
logits the call wants):

    input_ids [T] i64, positions [T] i64, logits_indices [N] i64 (rows of the T tokens),
    past_lens, subsequence_begins, block_indices, block_indices_begins, max_context_len
    (ov_paged_attention.PagedParams), key_cache.{l}, value_cache.{l} (the plugin's layout)

Output: logits [N, V] f32. The layer is the IR's and ingot's exported graph's (decoder.py):
RMSNorm, one q|k|v linear, rotate-half RoPE from ingot's own cos / sin tables indexed by
position, paged attention, o_proj + residual, RMSNorm, gate|up linear, SiLU(gate) * up,
down_proj + residual; the final norm and lm_head only for the `logits_indices` rows.
The norms are written in the pattern OpenVINO's RMSFusion turns into its RMS kernel.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from benchmarks.spike.ov_paged_attention import PagedParams, paged_attention, paged_params
from benchmarks.spike.ov_weights import IngotWeights, ModelShape

__all__ = ["build_model"]


def _ints(values: list[int]) -> ov.Node:
    return ops.constant(np.array(values, np.int64))


def _rms_norm(x: ov.Output, weight: np.ndarray, eps: float) -> ov.Output:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    square = ops.power(x, ops.constant(np.float32(2.0)))
    mean = ops.reduce_mean(square, _ints([-1]), True)
    root = ops.sqrt(ops.add(mean, ops.constant(np.float32(eps))))
    inverse = ops.divide(ops.constant(np.float32(1.0)), root)
    return ops.multiply(ops.multiply(x, inverse), ops.constant(weight.astype(np.float32))).output(0)


def _rope(x: ov.Output, heads: int, d: int, cos: ov.Output, sin: ov.Output) -> ov.Output:
    """Rotate-half RoPE: x [T, H*D], cos / sin [T, 1, D/2] -> [T, H*D]."""
    x = ops.reshape(x, _ints([0, heads, d]), True)  # [T, H, D]
    x1, x2 = ops.split(x, ops.constant(np.int64(-1)), 2).outputs()  # [T, H, D/2] each
    first = ops.subtract(ops.multiply(x1, cos), ops.multiply(x2, sin))
    second = ops.add(ops.multiply(x2, cos), ops.multiply(x1, sin))
    return ops.reshape(ops.concat([first, second], -1), _ints([0, heads * d]), True).output(0)


def _layer(
    w: IngotWeights,
    s: ModelShape,
    i: int,
    x: ov.Output,
    rope: tuple[ov.Output, ov.Output],
    caches: tuple[ov.Node, ov.Node],
    paged: PagedParams,
) -> ov.Output:
    """One decoder layer: x [T, hidden] -> [T, hidden]."""
    name, hq, hkv, d = f"layers.{i}", s.num_heads, s.num_kv_heads, s.head_dim
    h = _rms_norm(x, w.array(f"{name}.attn_norm.weight"), s.rms_eps)
    qkv = w.linear(h, f"{name}.attn.qkv_proj")  # [T, (Hq + 2 Hkv) * D]
    sizes = ops.constant(np.array([hq * d, hkv * d, hkv * d], np.int64))
    q, k, v = ops.variadic_split(qkv, ops.constant(np.int64(-1)), sizes).outputs()
    q, k = _rope(q, hq, d, *rope), _rope(k, hkv, d, *rope)
    ctx = paged_attention((q, k, v), caches, paged, (hkv, d))  # [T, Hq*D]
    x = ops.add(x, w.linear(ctx, f"{name}.attn.o_proj")).output(0)
    h = _rms_norm(x, w.array(f"{name}.mlp_norm.weight"), s.rms_eps)
    gate_up = w.linear(h, f"{name}.mlp.gate_up_proj")  # [T, 2 * ffn]
    gate, up = ops.split(gate_up, ops.constant(np.int64(-1)), 2).outputs()
    act = ops.multiply(ops.swish(gate), up)
    return ops.add(x, w.linear(act.output(0), f"{name}.mlp.down_proj")).output(0)


def build_model(w: IngotWeights, cache_type: ov.Type = ov.Type.dynamic) -> ov.Model:
    """The decoder over PagedAttention. `cache_type` dynamic lets the plugin pick the caches'
    type and shape (KV_CACHE_PRECISION); the compiled model's inputs say what it picked."""
    s = w.shape
    ids = ops.parameter([-1], ov.Type.i64, name="input_ids")
    positions = ops.parameter([-1], ov.Type.i64, name="positions")
    rows = ops.parameter([-1], ov.Type.i64, name="logits_indices")
    paged = paged_params()
    caches = [
        (
            ops.parameter(ov.PartialShape.dynamic(4), cache_type, name=f"key_cache.{i}"),
            ops.parameter(ov.PartialShape.dynamic(4), cache_type, name=f"value_cache.{i}"),
        )
        for i in range(s.num_layers)
    ]
    axis0 = ops.constant(np.int64(0))
    x = ops.gather(w.constant("embed_tokens.weight"), ids, axis0).output(0)  # [T, hidden]
    half = [0, 1, s.head_dim // 2]  # [T, 1, D/2]: 0 keeps T (special_zero)
    cos = ops.reshape(ops.gather(w.constant("rope.cos_cache"), positions, axis0), _ints(half), True)
    sin = ops.reshape(ops.gather(w.constant("rope.sin_cache"), positions, axis0), _ints(half), True)
    for i in range(s.num_layers):
        x = _layer(w, s, i, x, (cos.output(0), sin.output(0)), caches[i], paged)
    picked = ops.gather(x, rows, axis0).output(0)  # [N, hidden]
    hidden = _rms_norm(picked, w.array("norm.weight"), s.rms_eps)
    if w.has("lm_head.codes_t") or w.has("lm_head.weight_t"):
        logits = w.linear(hidden, "lm_head")
    else:  # tied and unquantized: the embedding table, transposed in the MatMul
        logits = ops.matmul(hidden, w.constant("embed_tokens.weight"), False, True).output(0)
    result = ops.result(logits, name="logits")
    result.output(0).get_tensor().set_names({"logits"})
    parameters = [ids, positions, rows, *paged.parameters(), *(p for kv in caches for p in kv)]
    return ov.Model([result], parameters, "ingot_decoder_paged")
