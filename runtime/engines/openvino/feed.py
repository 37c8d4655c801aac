"""One of the Generator's batches as the OpenVINO model's inputs (graph.py).

`build_inputs` pads a call to [S, Q] rows (a prefill chunk beside one-token decodes, k + 1
verification rows beside others); PagedAttention takes the real rows only, packed sequence by
sequence (T tokens):

| the model's input          | from the `Batch`                                               |
|----------------------------|----------------------------------------------------------------|
| input_ids, positions [T]   | the real rows (`real_rows`; every row when it is None)         |
| logits_indices [N]         | `logits_indices` (rows s*Q + q) mapped to their packed rows   |
| past_lens [S]              | `context_lens`                                                 |
| subsequence_begins [S+1]   | running sum of each sequence's new tokens                      |
| block_indices              | each `block_tables` row up to the call's last token, joined   |
| block_indices_begins [S+1] | running sum of those lengths                                   |
| max_context_len []         | max(context + new)                                             |

A model mixing local and global layers adds block_indices_local and block_indices_begins_local:
the same from `block_tables_local`, which its local layers read.

The op writes each new token's K/V through the same table at the slot the Generator reserved
(`kv_slots` is not read: no padded row reaches the op, so nothing goes to the scratch block).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ingot.runtime.batch import Batch

__all__ = ["PackedCall", "paged_feed"]


@dataclass(slots=True)
class PackedCall:
    """The model's inputs for one call, and where its packed rows sit among the call's S*Q."""

    feed: dict[str, np.ndarray]
    rows: np.ndarray | None  # [T] the packed rows' s*Q + q; None: every row is real
    padded_rows: int  # S*Q


def paged_feed(batch: Batch, block_size: int) -> PackedCall:
    """The model's inputs for `batch` (module docstring)."""
    s, q = batch.input_ids.shape
    rows = batch.real_rows
    ids, positions = batch.input_ids.reshape(-1), batch.positions.reshape(-1)
    logits_rows = batch.logits_indices
    if rows is None:  # every row real: Q new tokens per sequence
        num_new = np.full(s, q, dtype=np.int64)
    else:
        num_new = np.bincount(rows // q, minlength=s)
        packed = np.full(s * q, -1, dtype=np.int64)
        packed[rows] = np.arange(len(rows))
        ids, positions, logits_rows = ids[rows], positions[rows], packed[logits_rows]
    ends = batch.context_lens + num_new  # [S] tokens in the cache after the call
    blocks = -(-ends // block_size)
    feed = {
        "input_ids": ids,
        "positions": positions,
        "logits_indices": logits_rows,
        "past_lens": batch.context_lens.astype(np.int32),
        "subsequence_begins": _starts(num_new),
        "block_indices": _joined(batch.block_tables, blocks),
        "block_indices_begins": _starts(blocks),
        "max_context_len": np.array(ends.max(), dtype=np.int32),
    }
    if batch.block_tables_local is not None:  # a mixed model's local layers: their table
        feed["block_indices_local"] = _joined(batch.block_tables_local, blocks)
        feed["block_indices_begins_local"] = feed["block_indices_begins"]
    return PackedCall(feed, rows, s * q)


def _joined(tables: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """[sum blocks] int32: each table row [S, MB] up to its sequence's `blocks`, joined."""
    return np.concatenate([tables[i, : blocks[i]] for i in range(len(blocks))]).astype(np.int32)


def _starts(counts: np.ndarray) -> np.ndarray:
    """[len + 1] int32: 0, then the running sum of `counts`."""
    starts = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=starts[1:])
    return starts
