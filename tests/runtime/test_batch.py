import numpy as np
import pytest

import ingot.runtime.batch as batch_module
from ingot.runtime.batch import STEP_INPUTS, DecodeInputs, build_inputs
from ingot.runtime.kv_pool import BlockTable, KVPool

T, F = True, False


@pytest.fixture
def pool():
    return KVPool(num_layers=2, num_blocks=6, block_size=2, num_kv_heads=1, head_dim=2)


def _two_sequences(pool):
    # A: 3 tokens in the pool (positions 0-2), 2 new ones at positions 3, 4; blocks 4, 1, 3.
    # B: a fresh 1-token prompt; block 2.
    a = BlockTable(pool.allocator, 2, [4, 1, 3], num_tokens=5)
    b = BlockTable(pool.allocator, 2, [2], num_tokens=1)
    return [(a, [7, 8], 3), (b, [9], 0)]


def test_inputs_for_a_decode_and_a_prefill_together(pool):
    batch = build_inputs(_two_sequences(pool))
    np.testing.assert_array_equal(batch.input_ids, [[7, 8], [9, 0]])
    np.testing.assert_array_equal(batch.positions, [[3, 4], [0, 0]])
    # Only blocks of tokens already in the pool: A's 3 tokens fill 4 and 1; B has none yet.
    np.testing.assert_array_equal(batch.block_tables, [[4, 1], [0, 0]])
    np.testing.assert_array_equal(batch.context_lens, [3, 0])
    # position 3 -> block_ids[1] = 1, offset 1 -> slot 3; position 4 -> block 3, offset 0 -> 6
    np.testing.assert_array_equal(batch.slots, [3, 6, 4])  # A's two, then B's one
    np.testing.assert_array_equal(batch.real_rows, [0, 1, 2])  # row 3 (B's second) is padding
    np.testing.assert_array_equal(batch.logits_indices, [1, 2])  # each sequence's last token
    assert batch.attention_mask.shape == (2, 1, 2, 2 * 2 + 2)
    assert batch.attention_mask.dtype == np.bool_
    expected = np.array(
        [
            #  past slots 0-3  new 0, 1
            [[T, T, T, F, T, F], [T, T, T, F, T, T]],  # A
            [[F, F, F, F, T, F], [F, F, F, F, F, T]],  # B (row 1 is padding)
        ]
    )
    np.testing.assert_array_equal(batch.attention_mask[:, 0], expected)


def test_sliding_window_hides_keys_that_are_too_far_back(pool):
    batch = build_inputs(_two_sequences(pool), sliding_window=2)
    expected_a = np.array(
        [
            [F, F, T, F, T, F],  # position 3 sees positions 2, 3
            [F, F, F, F, T, T],  # position 4 sees positions 3, 4
        ]
    )
    np.testing.assert_array_equal(batch.attention_mask[0, 0], expected_a)


def test_sliding_window_within_the_new_tokens(pool):
    table = pool.new_block_table()
    table.slots_for(4)
    mask = build_inputs([(table, [1, 2, 3, 4], 0)], sliding_window=2).attention_mask
    new = mask[0, 0, :, -4:]
    np.testing.assert_array_equal(
        new, np.tril(np.ones((4, 4), bool)) & ~np.tril(np.ones((4, 4), bool), -2)
    )
    assert not mask[0, 0, :, :-4].any()  # nothing in the pool yet


def test_every_query_row_attends_somewhere(pool):
    batch = build_inputs(_two_sequences(pool), sliding_window=1)
    assert batch.attention_mask.any(axis=-1).all()


def test_write_kv_writes_real_rows_only(pool):
    batch = build_inputs(_two_sequences(pool))
    new_k = np.arange(2 * 2 * 1 * 2, dtype=np.float32).reshape(2, 2, 1, 2) + 1  # [S,Q,Hkv,D]
    new_kv = [(new_k, -new_k), (2 * new_k, -2 * new_k)]
    batch.write_kv(pool, new_kv)
    flat_k1 = pool.k[1].reshape(-1, 1, 2)
    np.testing.assert_array_equal(flat_k1[[3, 6, 4]], 2 * new_k[[0, 0, 1], [0, 1, 0]])
    np.testing.assert_array_equal(pool.v[0].reshape(-1, 1, 2)[6], -new_k[0, 1])
    written = {3, 6, 4}
    untouched = [s for s in range(12) if s not in written]
    assert not pool.k[0].reshape(-1, 2)[untouched].any()  # the padded row went nowhere


def test_a_decode_batch_has_no_padding_and_writes_every_row(pool):
    tables = [pool.new_block_table() for _ in range(3)]
    for n, table in zip((3, 2, 5), tables, strict=True):
        table.slots_for(n)
    batch = build_inputs([(t, [n], n - 1) for n, t in zip((3, 2, 5), tables, strict=True)])
    assert batch.real_rows is None
    np.testing.assert_array_equal(batch.logits_indices, [0, 1, 2])
    new_k = np.arange(3 * 2, dtype=np.float32).reshape(3, 1, 2) + 1  # [S, Q, Hkv*D]
    batch.write_kv(pool, [(new_k, new_k), (new_k, new_k)])
    np.testing.assert_array_equal(pool.k[0].reshape(-1, 2)[batch.slots], new_k[:, 0])


def test_unallocated_positions_are_refused(pool):
    table = pool.new_block_table()
    table.slots_for(2)
    with pytest.raises(ValueError, match="reserve first"):
        build_inputs([(table, [1], 2)])
    with pytest.raises(ValueError, match="at least one"):
        build_inputs([])


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("in_graph", [False, True])
def test_a_decode_call_matches_the_general_packing(window, in_graph):
    # Decode steps take a shorter path (one token per sequence); it must give the same arrays,
    # in either layout (the graph writes its K/V, or returns them).
    rng = np.random.default_rng(0)
    pool = KVPool(num_layers=1, num_blocks=64, block_size=4, num_kv_heads=1, head_dim=2)
    scratch = pool.scratch_block if in_graph else None
    seqs = []
    for length in (1, 4, 5, 13, 9):
        table = pool.new_block_table()
        table.slots_for(length)
        seqs.append((table, [int(rng.integers(320))], length - 1))
    fast = build_inputs(seqs, sliding_window=window, scratch_block=scratch)
    general = batch_module._general_inputs(seqs, window, scratch)
    names = ["input_ids", "positions", "block_tables", "context_lens", "attention_mask"]
    for name in names + (["kv_slots"] if in_graph else []):
        np.testing.assert_array_equal(getattr(fast, name), getattr(general, name), err_msg=name)
    np.testing.assert_array_equal(fast.slots, general.slots)
    np.testing.assert_array_equal(fast.logits_indices, general.logits_indices)
    assert fast.real_rows is None and general.real_rows is None


def test_inputs_for_a_graph_that_writes_the_pool():
    # The tables list every block up to the call's last token; key slot j is position j, the
    # call's own tokens included; kv_slots name each real row's (block, offset), padded rows
    # the scratch block.
    pool = KVPool(num_layers=1, num_blocks=8, block_size=2, num_kv_heads=1, head_dim=2)
    a, b = pool.new_block_table(), pool.new_block_table()
    a.slots_for(5)  # 2 tokens in the pool, 3 new: positions 2, 3, 4 (blocks 0, 1, 2)
    b.slots_for(1)  # 1 new token, padded to 3 rows
    batch = build_inputs([(a, [7, 8, 9], 2), (b, [4], 0)], scratch_block=pool.scratch_block)
    assert batch.block_tables.tolist() == [a.block_ids[:3], [b.block_ids[0], 0, 0]]
    mask = batch.attention_mask[:, 0]  # [S, Q, MB*B]
    assert mask.shape == (2, 3, 6)
    assert mask[0].tolist() == [[j <= p for j in range(6)] for p in (2, 3, 4)]
    assert mask[1, 0].tolist() == [True] + [False] * 5
    assert mask[1, 1:].tolist() == [[True] + [False] * 5] * 2  # padded rows: slot 0 only
    slots = [(block, offset) for block, offset in batch.kv_slots.reshape(-1, 2).tolist()]
    assert slots[:3] == [(a.block_ids[1], 0), (a.block_ids[1], 1), (a.block_ids[2], 0)]
    assert slots[3] == (b.block_ids[0], 0)
    assert slots[4:] == [(pool.scratch_block, 0)] * 2


# What a session binds (kv_slots in one layout only), and where the K/V go.
_FIELDS = [*(n for n in STEP_INPUTS if n != "kv_slots"), "slots"]


@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("in_graph", [False, True])
def test_decode_inputs_updated_in_place_equal_a_fresh_build(window, in_graph):
    # A decode batch steps on: each step every sequence is one token further, blocks begin,
    # and now and then the batch changes (a sequence leaves, the order changes, a table loses
    # blocks and gets new ones: speculative truncation, preemption). Whether DecodeInputs
    # advanced its arrays or built anew, they must be what build_inputs gives.
    rng = np.random.default_rng(1)
    pool = KVPool(num_layers=1, num_blocks=96, block_size=4, num_kv_heads=1, head_dim=2)
    scratch = pool.scratch_block if in_graph else None
    decode = DecodeInputs(window, scratch)
    rows = []  # [table, start]
    for length in (1, 3, 4, 7, 9):
        table = pool.new_block_table()
        table.reserve(length)
        rows.append([table, length - 1])
    previous, in_place = None, 0
    for _ in range(60):
        event = rng.integers(10)
        if event == 0 and len(rows) > 1:  # one finishes
            table, _ = rows.pop(int(rng.integers(len(rows))))
            table.release()
        elif event == 1:  # the order changes
            rows.reverse()
        elif event == 2:  # drafts were rejected: the table is cut back and grows again
            table, start = rows[int(rng.integers(len(rows)))]
            table.reserve(3)
            table.truncate(start + 1)
        elif event == 3:  # preempted and recomputed: new blocks
            table, start = rows[int(rng.integers(len(rows)))]
            table.release()
            table.reserve(start + 1)
        seqs = [(table, [int(rng.integers(320))], start) for table, start in rows]
        batch = decode.build(seqs)
        fresh = build_inputs(seqs, sliding_window=window, scratch_block=scratch)
        for name in _FIELDS + (["kv_slots"] if in_graph else []):
            np.testing.assert_array_equal(getattr(batch, name), getattr(fresh, name), name)
        assert batch.real_rows is None
        in_place += batch is previous
        previous = batch
        for row in rows:  # the step's tokens go into the pool: one position further
            row[0].reserve(1)
            row[1] += 1
    assert in_place > 20  # most steps updated the arrays in place


def test_decode_inputs_build_anew_when_a_row_needs_another_block_column():
    pool = KVPool(num_layers=1, num_blocks=8, block_size=2, num_kv_heads=1, head_dim=2)
    decode = DecodeInputs(None, pool.scratch_block)
    table = pool.new_block_table()
    table.reserve(2)
    first = decode.build([(table, [5], 1)])  # position 1: one block listed
    table.reserve(1)
    second = decode.build([(table, [6], 2)])  # position 2: a second block, a wider table
    assert second is not first and second.block_tables.shape == (1, 2)
    table.reserve(1)
    assert decode.build([(table, [7], 3)]) is second  # still two blocks: in place
