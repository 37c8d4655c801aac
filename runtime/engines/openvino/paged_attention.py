"""OpenVINO's PagedAttention operation (`PagedAttentionExtension`) as one node per layer, and the
graph parameters every layer shares (the call's sequence layout over the block tables).

openvino 2026.4 exposes the op to Python only as `openvino._pyopenvino.op._PagedAttentionExtension`
("experimental, no backward compatibility": the engine's record pins the minor version), built
from a list of 28 inputs; the list and its ranks / types are src/core/src/op/paged_attention.cpp's
`validate_and_infer_types`:

     0 query [T, Hq*D]          1 key [T, Hkv*D]           2 value [T, Hkv*D]
     3 key_cache                4 value_cache              (layout: the plugin's, layout.py)
     5 past_lens [S] i32        6 subsequence_begins [S+1] i32
     7 block_indices [*] i32    8 block_indices_begins [S+1] i32
     9 scale [] f32            10 sliding_window [] i32 (0: none)
    11 alibi_slopes [0] f32    12 max_context_len [] i32
    13 score_aggregation_window [0] i32
    14-16 rotated_block_indices, rotation_deltas, rotation_trig_lut (KV rotation: unused)
    17-19 xattention_threshold, _block_size, _stride (sparse prefill: unused)
    20 sinks [0]               21-24 adaptive_rkv_* (KV eviction: unused)
    25 token_type_ids [0]      26-27 qq_bias, qq_bias_begins (unused)

T = the call's new tokens packed sequence by sequence (no padding), S = sequences. The op
writes each new token's K/V into the caches itself, at position past_lens[s] + i of sequence
s, i.e. block block_indices[block_indices_begins[s] + pos // B], row pos % B, then attends
causally over the sequence's past and new tokens (the last `sliding_window` of them where that
is not 0): ingot's block tables, context lengths and slots map onto it directly (feed.py). The
CPU plugin also wants the head counts and sizes in the node's runtime info (paged_attn.cpp:
"k_head_size and num_k_heads are required").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset16 as ops
from openvino._pyopenvino.op import _PagedAttentionExtension

__all__ = ["PagedParams", "paged_attention", "paged_params"]


@dataclass(frozen=True, slots=True)
class PagedParams:
    """The call's layout over the block tables: graph parameters shared by every layer."""

    past_lens: ov.Node  # [S] i32: tokens of each sequence already in the cache
    subsequence_begins: ov.Node  # [S+1] i32: each sequence's first row in the packed tokens
    block_indices: ov.Node  # [sum blocks] i32: every sequence's block table, concatenated
    block_indices_begins: ov.Node  # [S+1] i32: where each sequence's table starts there
    max_context_len: ov.Node  # [] i32: the longest past + new of the call

    def parameters(self) -> list[ov.Node]:
        return [
            self.past_lens,
            self.subsequence_begins,
            self.block_indices,
            self.block_indices_begins,
            self.max_context_len,
        ]


def paged_params(shared: PagedParams | None = None, suffix: str = "") -> PagedParams:
    """The parameters, named as feed.py's `paged_feed` keys; with `shared`, the block indices
    of another table (their names + `suffix`: a mixed model's local layers') beside
    `shared`'s layout of the call."""

    def vector(name: str) -> ov.Node:
        return ops.parameter([-1], ov.Type.i32, name=name)

    if shared is not None:
        return PagedParams(
            shared.past_lens,
            shared.subsequence_begins,
            vector("block_indices" + suffix),
            vector("block_indices_begins" + suffix),
            shared.max_context_len,
        )
    return PagedParams(
        vector("past_lens"),
        vector("subsequence_begins"),
        vector("block_indices"),
        vector("block_indices_begins"),
        ops.parameter([], ov.Type.i32, name="max_context_len"),
    )


def _const(value: object, dtype: type) -> ov.Node:
    return ops.constant(np.array(value, dtype=dtype))


def paged_attention(
    qkv: tuple[ov.Output, ov.Output, ov.Output],
    caches: tuple[ov.Node, ov.Node],
    paged: PagedParams,
    heads: tuple[int, int],
    sliding_window: int = 0,
) -> ov.Output:
    """Attention of the packed new tokens over their sequences' cached and new K/V: query
    [T, Hq*D], key / value [T, Hkv*D] (K already rotated), `heads` (Hkv, D) -> [T, Hq*D]."""
    num_kv_heads, head_dim = heads
    none_i32, none_f32 = _const(np.zeros(0), np.int32), _const(np.zeros(0), np.float32)
    zero_i32 = _const(0, np.int32)
    inputs = [
        *qkv,
        *caches,
        paged.past_lens,
        paged.subsequence_begins,
        paged.block_indices,
        paged.block_indices_begins,
        _const(1.0 / np.sqrt(head_dim), np.float32),  # scale
        _const(sliding_window, np.int32),
        none_f32,  # alibi_slopes
        paged.max_context_len,
        none_i32,  # score_aggregation_window
        none_i32,  # rotated_block_indices
        none_i32,  # rotation_deltas
        none_f32,  # rotation_trig_lut
        none_f32,  # xattention_threshold
        zero_i32,  # xattention_block_size
        zero_i32,  # xattention_stride
        none_f32,  # sinks
        zero_i32,  # adaptive_rkv_start_size
        none_i32,  # adaptive_rkv_evictable_sizes
        none_i32,  # adaptive_rkv_diversity_block_set_indices
        none_i32,  # adaptive_rkv_diversity_block_set_indices_begins
        none_i32,  # token_type_ids
        _const(np.zeros(0), np.uint8),  # qq_bias
        none_i32,  # qq_bias_begins
    ]
    node = _PagedAttentionExtension(
        [x if isinstance(x, ov.Output) else x.output(0) for x in inputs]
    )
    info = node.get_rt_info()
    for name, number in (
        ("num_k_heads", num_kv_heads),
        ("k_head_size", head_dim),
        ("num_v_heads", num_kv_heads),
        ("v_head_size", head_dim),
    ):
        info[name] = number
    return node.output(0)  # outputs 1, 2: scores and diversity, unused
