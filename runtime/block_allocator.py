"""Block ids handed out by reference count, the free ones in LRU order.

The paged KV cache (kv_pool.py) takes its blocks from here and re-exports both names; the
prefix cache (prefix_cache.py) listens on `BlockAllocator.on_evict`. A module of its own so
that both import it and the prefix cache never imports the pool back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

__all__ = ["BlockAllocator", "OutOfBlocks"]


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than an allocation needs."""


class BlockAllocator:
    """Reference-counted block ids with a free list in LRU order.

    A block freed last goes to the back of the free list and is reused last, so a block
    whose contents a prefix cache may still want survives as long as possible; `on_evict`
    (if set) is told each time a block leaves the free list for new contents.
    """

    __slots__ = ("_free", "_refs", "on_evict")

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        # OrderedDict as an ordered set: O(1) pop from the front and removal from the middle.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks
        self.on_evict: Callable[[int], None] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self._refs)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._refs) - len(self._free)

    def refcount(self, block: int) -> int:
        return self._refs[self._check(block)]

    def is_free(self, block: int) -> bool:
        return self._check(block) in self._free

    def allocate(self) -> int:
        """The least recently freed block, now referenced once."""
        if not self._free:
            raise OutOfBlocks(f"all {self.num_blocks} KV cache blocks are in use")
        block, _ = self._free.popitem(last=False)
        if self.on_evict is not None:
            self.on_evict(block)
        self._refs[block] = 1
        return block

    def incref(self, block: int) -> None:
        """One more reference; a free block is taken back off the free list (a cache hit)."""
        self._check(block)
        if self._refs[block] == 0:
            del self._free[block]
        self._refs[block] += 1

    def free(self, block: int) -> None:
        """Drop one reference; the last one returns the block to the back of the free list."""
        self._check(block)
        if self._refs[block] == 0:
            raise ValueError(f"block {block} is already free (double free)")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free[block] = None

    def _check(self, block: int) -> int:
        if not 0 <= block < len(self._refs):
            raise ValueError(f"block {block} out of range [0, {len(self._refs)})")
        return block
