import pytest

from ingot.runtime.kv_pool import KVPool
from ingot.runtime.prefix_cache import PrefixCache, chain_hashes


def _pool(num_blocks=4, block_size=2):
    return KVPool(num_layers=1, num_blocks=num_blocks, block_size=block_size, num_kv_heads=1,
                  head_dim=1)  # fmt: skip


def test_chain_hash_depends_on_everything_before_the_block():
    a = chain_hashes([1, 2, 3, 4, 5], 2, 2, [])
    assert len(a) == 2 and len(set(a)) == 2
    assert chain_hashes([1, 2, 3, 4, 9], 2, 2, []) == a  # the partial block is not hashed
    b = chain_hashes([7, 2, 3, 4], 2, 2, [])
    assert b[0] != a[0] and b[1] != a[1]  # same second block, different prefix
    assert chain_hashes([1, 2, 3, 4], 2, 2, a[:1]) == a  # extends an existing chain
    with pytest.raises(ValueError, match="not full"):
        chain_hashes([1, 2, 3], 2, 2, [])


def test_lookup_returns_the_longest_cached_run_from_the_start():
    pool = _pool()
    cache = pool.prefix_cache
    h = chain_hashes([1, 2, 3, 4, 5, 6], 2, 3, [])
    cache.insert(2, h[0])
    cache.insert(0, h[2])
    assert cache.lookup(h) == [2]  # h[1] is missing: h[2] is unreachable
    cache.insert(3, h[1])
    assert cache.lookup(h) == [2, 3, 0] and len(cache) == 3
    cache.insert(1, h[0])  # a second block with the same prefix: the first stays cached
    assert cache.lookup(h[:1]) == [2] and cache.hash_of(1) is None


def test_a_cached_free_block_is_forgotten_only_when_reused():
    pool = _pool(num_blocks=2)
    table = pool.new_block_table()
    table.slots_for(4)  # two full blocks
    h = chain_hashes([1, 2, 3, 4], 2, 2, [])
    for block, block_hash in zip(table.block_ids, h, strict=True):
        pool.prefix_cache.insert(block, block_hash)
    first, second = table.block_ids
    table.release()  # last block first: the head of the prefix is evicted last
    assert pool.allocator.num_free == 2 and pool.prefix_cache.lookup(h) == [first, second]

    other = pool.new_block_table()
    other.slots_for(1)  # takes the least recently freed block: the tail
    assert other.block_ids == [second]
    assert pool.prefix_cache.lookup(h) == [first] and pool.prefix_cache.hash_of(second) is None

    again = pool.new_block_table()
    again.share([first])  # a hit on a free block revives it
    assert pool.allocator.refcount(first) == 1 and pool.allocator.num_free == 0
    assert again.num_tokens == 2
    with pytest.raises(ValueError, match="must come first"):
        again.share([first])


def test_every_pool_has_one_cache_hooked_to_its_allocator():
    pool = _pool()
    assert isinstance(pool.prefix_cache, PrefixCache)
    assert pool.allocator.on_evict == pool.prefix_cache.forget
