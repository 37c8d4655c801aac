"""OpenVINO's PagedAttention operation (`PagedAttentionExtension`) as one node per layer, and the
graph parameters every layer shares (the call's sequence layout over the block tables).

openvino 2026.4 exposes the op to Python only as `openvino._pyopenvino.op._PagedAttentionExtension`
("experimental, no backward compatibility"), built from a list of 28 inputs; the list and its
ranks / types are src/core/src/op/paged_attention.cpp's `validate_and_infer_types`:

     0 query [T, Hq*D]          1 key [T, Hkv*D]           2 value [T, Hkv*D]
     3 key_cache                4 value_cache              (layout: the plugin's, below)
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
causally over the sequence's past and new tokens: ingot's block tables, context lengths and
slots map onto it directly (ov_runner.py). The CPU plugin also wants the head counts and
sizes in the node's runtime info (paged_attn.cpp: "k_head_size and num_k_heads are
required"), and decides the caches' element type and shape itself at compile time
(`KV_CACHE_PRECISION`): f32 / f16 [blocks, Hkv, 32, D]; u8 (its default) key
[blocks, Hkv, 32 + 8, D] (per-channel scale and zero point rows after each block's tokens),
value [blocks, Hkv, 32, D + 8] (per-token scale and zero point). The block size is 32 on CPU.

The op and its shared parameters are the engine's own (runtime/engines/openvino/
paged_attention.py, promoted from this file); the spike keeps its block-size constant.
"""

from __future__ import annotations

from ingot.runtime.engines.openvino.paged_attention import (
    PagedParams,
    paged_attention,
    paged_params,
)

__all__ = ["CPU_BLOCK_SIZE", "PagedParams", "paged_attention", "paged_params"]

CPU_BLOCK_SIZE = 32  # what the CPU plugin sets on the cache inputs, whatever the model says
