"""Automatic prefix caching: full KV blocks found again by the hash of everything before them.

A block's hash chains its parent's hash with its own tokens, so equal hashes mean equal token
prefixes, not just equal blocks. Only full, computed blocks are hashed; they are never written
again, so any number of sequences may share one by reference count. A cached block whose last
reference is dropped stays in the allocator's free list (LRU order) with its contents, and can
be revived by a later prompt; it is forgotten only when the allocator hands it out for
something else (the `on_evict` hook).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ingot.runtime.block_allocator import BlockAllocator

__all__ = ["PrefixCache", "chain_hashes"]


def chain_hashes(
    token_ids: Sequence[int], block_size: int, num_blocks: int, hashes: list[bytes]
) -> list[bytes]:
    """Extend `hashes` (the chain of the first blocks) to the first `num_blocks` full blocks.

    128-bit digests: a collision would silently share the wrong keys and values, so the odds
    are made negligible rather than checked.
    """
    for i in range(len(hashes), num_blocks):
        tokens = np.asarray(token_ids[i * block_size : (i + 1) * block_size], dtype=np.int64)
        if len(tokens) != block_size:
            raise ValueError(f"block {i} is not full ({len(tokens)} of {block_size} tokens)")
        parent = hashes[i - 1] if i else b""
        hashes.append(hashlib.blake2b(parent + tokens.tobytes(), digest_size=16).digest())
    return hashes


class PrefixCache:
    """Chain hash -> block id for full blocks whose keys and values are in the pool."""

    __slots__ = ("_block_of", "_hash_of")

    def __init__(self, allocator: BlockAllocator) -> None:
        self._block_of: dict[bytes, int] = {}
        self._hash_of: list[bytes | None] = [None] * allocator.num_blocks
        allocator.on_evict = self.forget

    def __len__(self) -> int:
        return len(self._block_of)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks of the longest cached run of `hashes` from the first one."""
        blocks = []
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def insert(self, block: int, block_hash: bytes) -> None:
        """Record that `block` holds the full block hashed `block_hash`.

        If another block already holds the same prefix, the first one stays the cached one:
        `block` is then an ordinary private block, freed like any other.
        """
        if block_hash in self._block_of or self._hash_of[block] is not None:
            return
        self._block_of[block_hash] = block
        self._hash_of[block] = block_hash

    def hash_of(self, block: int) -> bytes | None:
        return self._hash_of[block]

    def forget(self, block: int) -> None:
        """`block` is being reused for other tokens: it no longer holds its cached prefix."""
        block_hash = self._hash_of[block]
        if block_hash is not None:
            self._hash_of[block] = None
            del self._block_of[block_hash]
