import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingot.runtime.kv_pool import BlockAllocator, KVPool, OutOfBlocks, kv_numpy_dtype


def test_allocator_reuses_least_recently_freed_block_first():
    alloc = BlockAllocator(4)
    blocks = [alloc.allocate() for _ in range(4)]
    assert sorted(blocks) == [0, 1, 2, 3] and alloc.num_free == 0
    alloc.free(2)
    alloc.free(0)
    assert alloc.allocate() == 2  # freed first, reused first
    assert alloc.allocate() == 0


def test_allocator_out_of_blocks_is_clear():
    alloc = BlockAllocator(1)
    alloc.allocate()
    with pytest.raises(OutOfBlocks, match="all 1 KV cache blocks are in use"):
        alloc.allocate()


def test_allocator_refcounts_and_double_free():
    alloc = BlockAllocator(2)
    b = alloc.allocate()
    alloc.incref(b)
    alloc.free(b)
    assert alloc.refcount(b) == 1 and not alloc.is_free(b)
    alloc.free(b)
    assert alloc.is_free(b)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(b)
    with pytest.raises(ValueError, match="out of range"):
        alloc.free(7)


def test_incref_of_a_free_block_takes_it_off_the_free_list():
    alloc = BlockAllocator(3)
    alloc.incref(1)  # a prefix-cache hit on a freed block
    assert alloc.refcount(1) == 1 and alloc.num_free == 2
    assert 1 not in {alloc.allocate(), alloc.allocate()}


def test_block_table_allocates_on_demand_and_returns_slots():
    pool = KVPool(num_layers=1, num_blocks=4, block_size=4, num_kv_heads=1, head_dim=2)
    table = pool.new_block_table()
    slots = table.slots_for(6)
    b0, b1 = table.block_ids
    np.testing.assert_array_equal(
        slots, [b0 * 4, b0 * 4 + 1, b0 * 4 + 2, b0 * 4 + 3, b1 * 4, b1 * 4 + 1]
    )
    assert table.num_tokens == 6 and pool.allocator.num_free == 2
    np.testing.assert_array_equal(table.slots_for(2), [b1 * 4 + 2, b1 * 4 + 3])
    assert len(table.block_ids) == 2  # still fits the second block
    table.reserve(1)  # the same allocation, no slots computed
    assert len(table.block_ids) == 3 and table.num_tokens == 9
    table.release()
    assert table.block_ids == [] and table.num_tokens == 0 and pool.allocator.num_free == 4


def test_block_table_allocation_is_all_or_nothing():
    pool = KVPool(num_layers=1, num_blocks=2, block_size=2, num_kv_heads=1, head_dim=1)
    table = pool.new_block_table()
    with pytest.raises(OutOfBlocks, match="need 3 more KV cache blocks, 2 of 2 are free"):
        table.slots_for(5)
    with pytest.raises(OutOfBlocks):
        table.reserve(5)
    assert table.block_ids == [] and table.num_tokens == 0 and pool.allocator.num_free == 2


def test_pool_write_scatters_into_the_bound_arrays():
    pool = KVPool(num_layers=2, num_blocks=3, block_size=2, num_kv_heads=2, head_dim=3)
    k = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)  # [n, Hkv, D]
    k_ptr = pool.k[1].ctypes.data
    pool.write(np.array([5, 0]), 1, k, -k)
    np.testing.assert_array_equal(pool.k[1][2, 1], k[0])  # slot 5 = block 2, offset 1
    np.testing.assert_array_equal(pool.v[1][0, 0], -k[1])
    assert pool.k[1].ctypes.data == k_ptr  # written in place
    assert not pool.k[0].any()


def test_pool_sizing_from_budget():
    per_block = KVPool.bytes_per_block(2, 16, 2, 8, np.float16)
    assert per_block == 2 * 2 * 16 * 2 * 8 * 2
    pool = KVPool.from_budget(10 * per_block + 1, 2, 16, 2, 8, np.float16)
    # 10 blocks to hand out, plus the scratch block padded rows write into
    assert pool.num_blocks == 10 and pool.dtype == np.float16 and pool.nbytes == 10 * per_block
    assert pool.scratch_block == 10 and pool.k[0].shape[0] == 11
    assert KVPool.from_budget(10 * per_block, 2, 16, 2, 8, np.float16, max_blocks=3).num_blocks == 3
    with pytest.raises(ValueError, match="holds no block"):
        KVPool.from_budget(per_block - 1, 2, 16, 2, 8, np.float16)


def test_kv_dtype_names():
    assert kv_numpy_dtype("fp16") == np.float16 and kv_numpy_dtype("fp32") == np.float32
    # 8-bit codes; fp8 as its E4M3FN bytes (numpy has no float8, the runtime only copies them)
    assert kv_numpy_dtype("int8") == np.int8 and kv_numpy_dtype("fp8") == np.uint8
    with pytest.raises(ValueError, match="'int4'.*supported: fp32, fp16, int8, fp8"):
        kv_numpy_dtype("int4")


@pytest.mark.parametrize(("kv", "itemsize"), [("fp32", 4), ("fp16", 2), ("int8", 1), ("fp8", 1)])
def test_quantized_pool_bytes_per_block(kv, itemsize):
    # 2 layers x 16 tokens x 2 heads x 8 dims, K and V: an 8-bit pool is half an fp16 one
    dtype = kv_numpy_dtype(kv)
    per_block = KVPool.bytes_per_block(2, 16, 2, 8, dtype)
    assert per_block == 2 * 2 * 16 * 2 * 8 * itemsize
    pool = KVPool.from_budget(10 * per_block, 2, 16, 2, 8, dtype)
    assert pool.num_blocks == 10 and pool.dtype == dtype and pool.nbytes == 10 * per_block
    assert all(a.dtype == dtype and not a.any() for a in pool.k + pool.v)  # zero codes: 0.0


def test_quantized_pool_stores_codes_as_given():
    # The graph's new K/V are already codes: the pool copies them, bit for bit.
    pool = KVPool(1, 2, 4, 2, 8, np.uint8)
    codes = np.arange(3 * 16, dtype=np.uint8).reshape(3, 16)  # [n, Hkv*D] E4M3FN bytes
    pool.write(np.array([1, 5, 6]), 0, codes, codes[::-1].copy())
    assert (pool.k[0].reshape(-1, 16)[[1, 5, 6]] == codes).all()  # 2 blocks + scratch: 12 slots
    assert (pool.v[0].reshape(-1, 16)[[1, 5, 6]] == codes[::-1]).all()


_ops = st.lists(st.tuples(st.sampled_from(["allocate", "free", "incref"]), st.integers(0, 63)))


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(1, 8), ops=_ops)
def test_allocator_invariants_hold_for_any_sequence(num_blocks, ops):
    alloc = BlockAllocator(num_blocks)
    held: list[int] = []  # one entry per reference we own
    for op, pick in ops:
        if op == "allocate":
            if alloc.num_free == 0:
                with pytest.raises(OutOfBlocks):
                    alloc.allocate()
            else:
                held.append(alloc.allocate())
        elif op == "free" and held:
            alloc.free(held.pop(pick % len(held)))
        elif op == "incref":
            block = pick % num_blocks  # any block: a free one is revived
            alloc.incref(block)
            held.append(block)
        for block in range(num_blocks):
            refs = alloc.refcount(block)
            assert refs == held.count(block) >= 0
            assert alloc.is_free(block) == (refs == 0)
        assert alloc.num_free == sum(alloc.refcount(b) == 0 for b in range(num_blocks))
    for block in held:
        alloc.free(block)
    assert alloc.num_free == num_blocks
