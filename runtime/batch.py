"""Pack the sequences of one engine call into the graph's padded inputs, and unpack its K/V.

Two layouts, one per way new K/V reach the pool (docs/design.md, "Paged KV contract"):

- The graph writes them (`scratch_block` given: the graph has a `kv_slots` input). The block
  tables list the blocks of every position up to the call's last token; key slot j < MB*B of
  the mask is slot j of the table, position j, the call's own tokens included (the graph writes
  them before it gathers). `kv_slots` [S, Q, 2] is each row's (block, offset); padded rows
  write into the pool's scratch block.
- The runtime writes them (older graphs). The tables list only the blocks of tokens already in
  the pool; key slot j < MB*B is past position j and slot MB*B + i the call's i-th new token.

Either way everything that is padding (short sequences, unused block-table entries, slots past
the context) is masked out, and MB = the most blocks any sequence lists, at least 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ingot.runtime.kv_pool import BlockTable, HybridTable, KVPool, slots_of

__all__ = ["Batch", "DecodeInputs", "LOCAL_INPUTS", "LocalLayers", "STEP_INPUTS", "build_inputs"]

# The graph inputs built per call (`Batch`'s fields of those names); a session binds the pools
# once. `kv_slots` only in a graph that writes its K/V into the pool itself, the `*_local`
# ones only in a graph whose local layers have a pool of their own.
STEP_INPUTS = (
    "input_ids",
    "positions",
    "block_tables",
    "context_lens",
    "attention_mask",
    "logits_indices",
    "kv_slots",
    "block_tables_local",
    "kv_slots_local",
    "attention_mask_local",
)
# Of those, the ones only a graph mixing local and global layers has (`LocalLayers`).
LOCAL_INPUTS = ("block_tables_local", "kv_slots_local", "attention_mask_local")


@dataclass(frozen=True, slots=True)
class LocalLayers:
    """The local (sliding-window) layers of a model mixing local and global layers: their
    window and their pool's scratch block (`KVPool.local_scratch_block`). A batch for such a
    model reads each sequence's `HybridTable`: the global layers' inputs from its `main`
    table without a window, the local layers' (`*_local`) from its `local` table with one."""

    window: int
    scratch_block: int


@dataclass(slots=True)
class Batch:
    """The graph inputs of one call and where each sequence's new tokens go in the pool."""

    input_ids: np.ndarray  # [S, Q] int64, 0 where padded
    positions: np.ndarray  # [S, Q] int64
    block_tables: np.ndarray  # [S, MB] int64, 0 where padded (masked)
    context_lens: np.ndarray  # [S] int64: tokens already in the pool
    attention_mask: np.ndarray  # [S, 1, Q, MB*B + Q] bool, True = attend
    # [N] int64 rows s*Q + q whose logits the call computes; build_inputs: each sequence's
    # last new token (N = S), which is what sampling reads, or with all_logits every real
    # token (N = T, in `slots` order: what speculative verification reads).
    logits_indices: np.ndarray
    slots: np.ndarray  # [T] int64 pool slots of every real new token, sequence by sequence
    real_rows: np.ndarray | None  # [T] their rows in the call's S*Q; None: every row is real
    # [S, Q, 2] int64 (block, offset) each row's K/V is written to by the graph itself; None
    # for a graph that returns them (the runtime writes them: write_kv).
    kv_slots: np.ndarray | None = None
    # A model mixing local and global layers (`LocalLayers`): the local layers' block tables
    # [S, MBL], (block, offset) of each row [S, Q, 2] and mask [S, 1, Q, MBL*B].
    block_tables_local: np.ndarray | None = None
    kv_slots_local: np.ndarray | None = None
    attention_mask_local: np.ndarray | None = None

    def write_kv(self, pool: KVPool, new_kv: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Scatter the real rows of each layer's new_k, new_v [S, Q, Hkv*D] (older engines:
        [S, Q, Hkv, D]) into the pool.

        Padded rows are never written: their slots would belong to someone else.
        """
        rows, calls, slots = self.real_rows, self.input_ids.size, self.slots
        for layer, (k, v) in enumerate(new_kv):
            k, v = k.reshape(calls, -1), v.reshape(calls, -1)  # [S*Q, Hkv*D]
            if rows is not None:
                k, v = k[rows], v[rows]
            pool.write(slots, layer, k, v)  # [T, Hkv*D]

    def write_kv_of(
        self, pool: KVPool, new_kv: Sequence[tuple[np.ndarray, np.ndarray]], tokens: np.ndarray
    ) -> None:
        """Scatter only the real new tokens `tokens` [n] (indices into `slots`) of each layer's
        new K/V into the pool: speculative verification keeps the accepted tokens' K/V only."""
        rows = tokens if self.real_rows is None else self.real_rows[tokens]
        calls, slots = self.input_ids.size, self.slots[tokens]
        for layer, (k, v) in enumerate(new_kv):
            pool.write(slots, layer, k.reshape(calls, -1)[rows], v.reshape(calls, -1)[rows])


def build_inputs(
    seqs: Sequence[tuple[BlockTable, Sequence[int], int]],
    sliding_window: int | None = None,
    all_logits: bool = False,
    scratch_block: int | None = None,
    local: LocalLayers | None = None,
) -> Batch:
    """Inputs for sequences given as (block table, new token ids, start position).

    The block table must already hold blocks for positions start .. start+n-1 (see
    `BlockTable.reserve`); tokens before `start` are read from the pool. With `all_logits`
    the call computes the logits of every real new token, not only each sequence's last. With
    `scratch_block` (the pool's, `KVPool.scratch_block`) the inputs are for a graph that writes
    the call's K/V into the pool itself (`kv_slots`), else for one that returns them. With
    `local` the tables are `HybridTable`s and the batch has the local layers' inputs too.
    """
    if not seqs:
        raise ValueError("build_inputs needs at least one sequence")
    if local is not None:
        return _hybrid_inputs(seqs, sliding_window, all_logits, scratch_block, local)
    if all(len(ids) == 1 for _, ids, _ in seqs):
        return _decode_inputs(seqs, sliding_window, scratch_block)
    batch = _general_inputs(seqs, sliding_window, scratch_block)
    if all_logits:
        real = batch.real_rows
        batch.logits_indices = np.arange(batch.input_ids.size) if real is None else real
    return batch


def _hybrid_inputs(
    seqs: Sequence[tuple[HybridTable, Sequence[int], int]],
    sliding_window: int | None,
    all_logits: bool,
    scratch_block: int | None,
    local: LocalLayers,
) -> Batch:
    """`build_inputs` for a model mixing local and global layers: the global layers' inputs
    from the `main` tables, the local layers' from the `local` tables (same rows, same
    positions: only the blocks, the scratch block and the window differ)."""
    if scratch_block is None:
        raise ValueError("a model mixing local and global layers writes its K/V in the graph")
    main = [(table.main, ids, start) for table, ids, start in seqs]
    batch = build_inputs(main, sliding_window, all_logits, scratch_block)
    own = [(table.local, ids, start) for table, ids, start in seqs]
    local_batch = build_inputs(own, local.window, all_logits, local.scratch_block)
    batch.block_tables_local = local_batch.block_tables
    batch.kv_slots_local = local_batch.kv_slots
    batch.attention_mask_local = local_batch.attention_mask
    return batch


def _general_inputs(
    seqs: Sequence[tuple[BlockTable, Sequence[int], int]],
    sliding_window: int | None,
    scratch_block: int | None,
) -> Batch:
    """`build_inputs` for any call: padded to the longest chunk."""
    block_size = seqs[0][0].block_size
    num_seqs = len(seqs)
    q_len = max(len(ids) for _, ids, _ in seqs)
    in_graph = scratch_block is not None
    # The blocks each table lists: the past's, or (in_graph) up to the call's last token.
    listed = [
        _blocks_of(start + (len(ids) if in_graph else 0), block_size) for _, ids, start in seqs
    ]
    max_blocks = max(1, *listed)
    past_len = max_blocks * block_size

    input_ids = np.zeros((num_seqs, q_len), dtype=np.int64)
    positions = np.zeros((num_seqs, q_len), dtype=np.int64)
    block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int64)
    context_lens = np.zeros(num_seqs, dtype=np.int64)
    num_new = np.zeros(num_seqs, dtype=np.int64)
    slots = []
    for s, (table, ids, start) in enumerate(seqs):
        n = len(ids)
        if n == 0:
            raise ValueError(f"sequence {s}: no new tokens")
        if table.block_size != block_size:
            raise ValueError(f"sequence {s}: block size {table.block_size} != {block_size}")
        if start + n > len(table.block_ids) * block_size:
            raise ValueError(
                f"sequence {s}: positions {start}..{start + n - 1} are beyond its "
                f"{len(table.block_ids)} blocks; allocate with BlockTable.reserve first"
            )
        input_ids[s, :n] = ids
        positions[s, :n] = np.arange(start, start + n)
        block_tables[s, : listed[s]] = table.block_ids[: listed[s]]
        context_lens[s] = start
        num_new[s] = n
        slots.append(slots_of(table.block_ids, block_size, positions[s, :n]))

    real_query = np.arange(q_len)[None, :] < num_new[:, None]  # [S, Q]
    first_row = np.arange(num_seqs, dtype=np.int64) * q_len  # [S]
    real_rows = None
    if not real_query.all():
        real_rows = np.concatenate([first_row[s] + np.arange(n) for s, n in enumerate(num_new)])
    batch = Batch(
        input_ids,
        positions,
        block_tables,
        context_lens,
        None,  # the mask, below
        first_row + num_new - 1,  # logits_indices
        np.concatenate(slots),
        real_rows,
    )
    if in_graph:
        batch.attention_mask = _table_mask(positions, real_query, past_len, sliding_window)
        batch.kv_slots = _kv_slots(batch.slots, real_query, block_size, scratch_block)
    else:
        batch.attention_mask = _past_and_new_mask(
            positions, real_query, context_lens, past_len, sliding_window
        )
    return batch


def _table_mask(
    positions: np.ndarray, real_query: np.ndarray, num_keys: int, sliding_window: int | None
) -> np.ndarray:
    """[S, 1, Q, K] for a graph that writes the pool: table slot j holds position j, the call's
    own tokens included, so a query sees the real slots at or before its position."""
    key_pos = np.arange(num_keys)  # [K]
    mask = key_pos[None, None, :] <= positions[:, :, None]  # [S, Q, K]
    if sliding_window is not None:
        mask &= positions[:, :, None] - key_pos[None, None, :] < sliding_window
    mask &= real_query[:, :, None]
    # A padded query row attends to slot 0 only (always listed), so its softmax stays finite.
    pad_s, pad_q = np.nonzero(~real_query)
    mask[pad_s, pad_q, 0] = True
    return mask[:, None]


def _kv_slots(
    slots: np.ndarray, real_query: np.ndarray, block_size: int, scratch_block: int
) -> np.ndarray:
    """[S, Q, 2] (block, offset) of each row: a real row's slot (`slots`, in row-major order,
    sequence by sequence), a padded row's the scratch block."""
    kv_slots = np.empty((*real_query.shape, 2), dtype=np.int64)
    kv_slots[..., 0], kv_slots[..., 1] = scratch_block, 0
    rows = np.nonzero(real_query)  # row-major: the order of `slots`
    kv_slots[rows[0], rows[1], 0] = slots // block_size
    kv_slots[rows[0], rows[1], 1] = slots % block_size
    return kv_slots


def _past_and_new_mask(
    positions: np.ndarray,
    real_query: np.ndarray,
    context_lens: np.ndarray,
    num_past: int,
    sliding_window: int | None,
) -> np.ndarray:
    """[S, 1, Q, K + Q] for a graph that returns its K/V: K past table slots, then the call's
    own Q tokens."""
    q_len = real_query.shape[1]
    query = np.arange(q_len)  # [Q]
    # Past keys: slot j holds position j; visible if already in the pool.
    key_pos = np.arange(num_past)  # [K]
    past = key_pos[None, None, :] < context_lens[:, None, None]  # [S, 1, K]
    past = past & real_query[:, :, None]  # [S, Q, K]
    # New keys: causal among the real new tokens.
    new = (query[None, :] <= query[:, None])[None] & real_query[:, None, :]  # [S, Q, Q]
    new = new & real_query[:, :, None]

    if sliding_window is not None:
        # Key at position p is visible to the query at position q iff q - p < window.
        past &= positions[:, :, None] - key_pos[None, None, :] < sliding_window
        new &= (query[:, None] - query[None, :] < sliding_window)[None]

    # A padded query row attends to its own slot only, so its softmax stays finite.
    pad_s, pad_q = np.nonzero(~real_query)
    new[pad_s, pad_q, pad_q] = True
    return np.concatenate([past, new], axis=-1)[:, None]  # [S, 1, Q, K + Q]


def _decode_inputs(
    seqs: Sequence[tuple[BlockTable, Sequence[int], int]],
    sliding_window: int | None,
    scratch_block: int | None,
) -> Batch:
    """`build_inputs` for a call of one new token per sequence (every decode step): the same
    arrays with a few vector operations and no padding, since this runs once per token."""
    block_size = seqs[0][0].block_size
    num_seqs = len(seqs)
    in_graph = scratch_block is not None
    listed = [_blocks_of(start + in_graph, block_size) for _, _, start in seqs]
    max_blocks = max(1, *listed)
    block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int64)
    where = []  # block, offset of each new token in turn: plain ints, one array below
    for s, (table, _, start) in enumerate(seqs):
        blocks = table.block_ids
        if table.block_size != block_size:
            raise ValueError(f"sequence {s}: block size {table.block_size} != {block_size}")
        if start >= len(blocks) * block_size:
            raise ValueError(
                f"sequence {s}: position {start} is beyond its {len(blocks)} blocks; "
                "allocate with BlockTable.reserve first"
            )
        block_tables[s, : listed[s]] = blocks[: listed[s]]
        where += (blocks[start // block_size], start % block_size)
    block_offset = np.array(where, dtype=np.int64).reshape(num_seqs, 2)  # [S, 2]
    slots = block_offset[:, 0] * block_size + block_offset[:, 1]  # [S]
    context_lens = np.fromiter((start for _, _, start in seqs), np.int64, num_seqs)  # [S]
    positions = context_lens[:, None]  # [S, 1], a view
    input_ids = np.fromiter((ids[0] for _, ids, _ in seqs), np.int64, num_seqs)[:, None]
    key_pos = np.arange(max_blocks * block_size)  # [K]
    kv_slots = None
    if in_graph:  # the new token is table slot `start`: visible up to and including it
        visible = key_pos <= positions  # [S, K]
        if sliding_window is not None:
            visible &= positions - key_pos < sliding_window
        mask = visible[:, None, None, :]
        kv_slots = block_offset[:, None, :]  # [S, 1, 2]
    else:
        past = key_pos < positions  # [S, K]
        if sliding_window is not None:
            past &= positions - key_pos < sliding_window
        mask = np.ones((num_seqs, 1, 1, key_pos.size + 1), dtype=bool)  # the new token: itself
        mask[:, 0, 0, :-1] = past
    return Batch(
        input_ids,
        positions,
        block_tables,
        context_lens,
        mask,
        np.arange(num_seqs, dtype=np.int64),  # logits_indices: every row
        slots,
        None,  # no padding
        kv_slots,
    )


class DecodeInputs:
    """`build_inputs` for one caller's plain decode steps, updated in place while the same
    sequences advance a token a step, as a steady decode batch does: the step writes the new
    tokens, positions, slots and block-table entries and flips the mask's one or two changed
    slots per sequence instead of building every array anew. The arrays (and so the Batch)
    are the same objects from step to step, which lets a session keep them bound.

    Anything else (another set or order of sequences, a sequence that moved by more than one
    token, a table that lost blocks since (`BlockTable.generation`), a row needing a block
    column the arrays do not have) builds a new Batch. The Batch is valid until the next
    `build`."""

    __slots__ = ("_sliding_window", "_scratch_block", "_local", "_batch", "_rows")

    def __init__(
        self,
        sliding_window: int | None,
        scratch_block: int | None,
        local: LocalLayers | None = None,
    ) -> None:
        self._sliding_window = sliding_window
        self._scratch_block = scratch_block
        self._local = local
        self._batch: Batch | None = None
        self._rows: list[tuple[BlockTable, int, int]] = []  # (table, its generation, start)

    def build(self, seqs: Sequence[tuple[BlockTable, Sequence[int], int]]) -> Batch:
        """The inputs of a call of one new token per sequence (each given as in build_inputs)."""
        if self._local is not None:  # a mixed model: built anew each step (a first cut)
            window, scratch = self._sliding_window, self._scratch_block
            return build_inputs(seqs, window, scratch_block=scratch, local=self._local)
        if not self._advance(seqs):
            self._batch = _decode_inputs(seqs, self._sliding_window, self._scratch_block)
        self._rows = [(table, table.generation, start) for table, _, start in seqs]
        return self._batch

    def _advance(self, seqs: Sequence[tuple[BlockTable, Sequence[int], int]]) -> bool:
        """Update the last Batch in place for `seqs`, each one token further; False (and
        nothing changed) if it does not fit them."""
        batch = self._batch
        if batch is None or len(seqs) != len(self._rows):
            return False
        in_graph = self._scratch_block is not None
        block_size = seqs[0][0].block_size
        max_blocks = batch.block_tables.shape[1]
        for (table, _, start), (old, generation, old_start) in zip(seqs, self._rows, strict=True):
            if table is not old or table.generation != generation or start != old_start + 1:
                return False
            if _blocks_of(start + in_graph, block_size) > max_blocks:
                return False
            if start >= len(table.block_ids) * block_size:
                return False  # a fresh build says what is wrong
        window = self._sliding_window
        mask = batch.attention_mask[:, 0, 0]  # [S, K] (+ the new token's slot: fp8 layout)
        for s, (table, ids, start) in enumerate(seqs):
            blocks = table.block_ids
            block, offset = blocks[start // block_size], start % block_size
            listed = _blocks_of(start + in_graph, block_size)
            batch.block_tables[s, listed - 1] = blocks[listed - 1]  # new when a block began
            batch.input_ids[s, 0] = ids[0]
            batch.slots[s] = block * block_size + offset
            # The key slot that became visible: the new token's own (in_graph), else the
            # previous token's, now in the pool; and the one a sliding window lost.
            mask[s, start if in_graph else start - 1] = True
            if window is not None and start - window >= 0:
                mask[s, start - window] = False
            if in_graph:
                batch.kv_slots[s, 0] = block, offset
        batch.context_lens += 1  # positions is a view of it
        return True


def _blocks_of(num_tokens: int, block_size: int) -> int:
    """Blocks holding a sequence's first `num_tokens` positions: all the graph gathers. A graph
    that returns its K/V reads none of the call's own tokens from the pool (they come from
    the call), so a first prefill chunk attends over its own tokens only, not over empty
    slots; one that writes them reads them back from their blocks."""
    return -(-num_tokens // block_size)
