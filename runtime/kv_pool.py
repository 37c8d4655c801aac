"""The paged KV cache: per-layer block pools, a reference-counted allocator, per-sequence tables.

An engine graph reads past keys and values through block tables. Its new K/V reach the pool
one of two ways (docs/design.md, "Paged KV contract"): a graph with a `kv_slots` input writes
them itself (ScatterND into the pool, whose output the session binds to the pool's own memory),
an older graph returns them and the runtime scatters them (slot = block_id * block_size +
offset). Every pool has one scratch block after the allocator's blocks, never handed out,
where a graph writes the K/V of padded rows. Allocation lives in a `BlockTable` per sequence
so prefix caching (sharing full blocks by reference count) and preemption (release, recompute
later) can be added without touching the pool itself. The allocator and its `OutOfBlocks`
live in block_allocator.py (re-exported here); the pool's `PrefixCache` (prefix_cache.py)
hears through `BlockAllocator.on_evict` when a cached free block is handed out again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ingot.common.errors import IngotError
from ingot.runtime.block_allocator import BlockAllocator, OutOfBlocks
from ingot.runtime.memory import format_bytes
from ingot.runtime.prefix_cache import PrefixCache

__all__ = [
    "BlockAllocator",
    "BlockShapes",
    "BlockTable",
    "HybridTable",
    "KVCacheAllocationFailed",
    "KVCacheTooSmall",
    "KVLayout",
    "KVPool",
    "OutOfBlocks",
    "kv_numpy_dtype",
    "slots_of",
]

# The pool holds what the graph's k_pool_{l} inputs take: values (fp32, fp16) or 8-bit codes
# (int8; fp8 as its E4M3FN bytes: numpy has no float8 type and the runtime never does
# arithmetic on them, it only copies what the graph's new_k / new_v outputs hold).
_KV_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8, "fp8": np.uint8}


def kv_numpy_dtype(kv_dtype: str) -> np.dtype:
    """The numpy dtype of a manifest `graph.kv_dtype` ("fp32" | "fp16" | "int8" | "fp8")."""
    if kv_dtype not in _KV_DTYPES:
        supported = ", ".join(_KV_DTYPES)
        raise ValueError(f"kv_dtype {kv_dtype!r} is not supported (supported: {supported})")
    return np.dtype(_KV_DTYPES[kv_dtype])


class KVCacheTooSmall(IngotError, ValueError):
    """The KV cache budget holds less than it must (a block, or one full-length sequence):
    a setting to raise, not a bug.

    It carries the numbers, so each caller words the message with the name of the setting its
    user wrote (`explain`): LLM's `kv_cache_memory`, `ingot serve`'s `--kv-cache-memory`.
    """

    def __init__(
        self,
        message: str,
        *,
        capacity_tokens: int = 0,
        needs: str = "one block",
        needed_bytes: int = 0,
        auto: str | None = None,
    ) -> None:
        super().__init__(message)
        self.capacity_tokens = capacity_tokens  # what the cache holds
        self.needs = needs  # what it must hold, e.g. "one sequence of max_seq_len 2048"
        self.needed_bytes = needed_bytes  # what that takes
        self.auto = auto  # how an automatic size was found, e.g. "0.5 of 3 GiB available"

    def worded(self, setting: str, given: str) -> KVCacheTooSmall:
        """The same error, its message from `explain`."""
        return KVCacheTooSmall(
            self.explain(setting, given),
            capacity_tokens=self.capacity_tokens,
            needs=self.needs,
            needed_bytes=self.needed_bytes,
            auto=self.auto,
        )

    def explain(self, setting: str, given: str) -> str:
        """The message in the caller's words: `setting` is the parameter the user sets, `given`
        how they set it, e.g. ("--kv-cache-memory", "--kv-cache-memory 4MiB")."""
        needed = format_bytes(self.needed_bytes)
        if self.auto is not None:
            return (
                f"{given} (auto: {self.auto}) holds {self.capacity_tokens} tokens; "
                f"{self.needs} needs {needed} (free memory, or set {setting} explicitly)"
            )
        return (
            f"{given} holds {self.capacity_tokens} tokens; {self.needs} needs {needed} "
            f"(raise {setting})"
        )


class KVCacheAllocationFailed(IngotError, MemoryError):
    """The KV cache budget is more memory than this process may allocate (RAM, or a limit
    such as `ulimit -v`): a setting to lower, not a bug."""

    def __init__(self, nbytes: int) -> None:
        size = f"{nbytes / 2**30:.1f} GiB"
        super().__init__(f"cannot allocate the KV cache ({size}): out of memory")
        self.nbytes = nbytes

    def explain(self, setting: str, given: str) -> str:
        """The message in the caller's words, as KVCacheTooSmall.explain."""
        return (
            f"{given}: cannot allocate the KV cache, more memory than this process may use "
            f"(lower {setting})"
        )


@dataclass(slots=True)
class BlockTable:
    """The blocks of one sequence, in order, and how many token slots of them are filled."""

    allocator: BlockAllocator
    block_size: int
    block_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0
    # Bumped whenever blocks leave the table or it starts anew (share, truncate, release,
    # free_before): while it stands still, `block_ids` only grew, and a batch built from it
    # earlier is still right about the blocks it listed (batch.DecodeInputs).
    generation: int = 0
    # Leading blocks given back while the sequence runs, wholly outside a sliding window
    # (`free_before`): their entries are `released_block`, the pool's scratch block.
    num_freed: int = 0

    @property
    def released_block(self) -> int:
        """What a released entry of `block_ids` holds: the pool's scratch block (the id after
        the allocator's), which an engine may gather (finite contents) but whose slots the
        mask never shows, since every position of a released block is outside the window."""
        return self.allocator.num_blocks

    def free_before(self, position: int) -> int:
        """Give back every block all of whose positions are below `position` (sliding window:
        no query at `position` or later sees them); how many went. A block another sequence
        shares (a cached prefix) only loses this reference; a cached one keeps its contents on
        the free list, findable until reused."""
        end = max(0, min(position // self.block_size, len(self.block_ids)))
        if end <= self.num_freed:
            return 0
        released = self.released_block
        for i in range(self.num_freed, end):
            self.allocator.free(self.block_ids[i])
            self.block_ids[i] = released
        freed, self.num_freed = end - self.num_freed, end
        self.generation += 1
        return freed

    def blocks_needed(self, n_new: int) -> int:
        """How many more blocks `n_new` more tokens take."""
        total = -(-(self.num_tokens + n_new) // self.block_size)
        return max(0, total - len(self.block_ids))

    def capacity(self) -> int:
        """How many more tokens the table can take with its blocks and the free ones."""
        unused = len(self.block_ids) * self.block_size - self.num_tokens
        return unused + self.allocator.num_free * self.block_size

    def slots_for(self, n_new: int) -> np.ndarray:
        """Pool slots [n_new] int64 for the next `n_new` tokens, allocating blocks on demand
        (`reserve`, which see)."""
        first = self.num_tokens
        self.reserve(n_new)
        positions = np.arange(first, first + n_new, dtype=np.int64)
        return slots_of(self.block_ids, self.block_size, positions)

    def reserve(self, n_new: int) -> None:
        """Take the next `n_new` positions, allocating blocks on demand: `slots_for` without
        computing the slots (the scheduler's per-step call; build_inputs finds them).

        All or nothing: if the pool cannot hold them, OutOfBlocks is raised and the table is
        unchanged, so the caller can preempt something and retry.
        """
        need = self.blocks_needed(n_new)
        if need > self.allocator.num_free:
            raise OutOfBlocks(
                f"{n_new} new tokens need {need} more KV cache blocks, "
                f"{self.allocator.num_free} of {self.allocator.num_blocks} are free"
            )
        for _ in range(need):
            self.block_ids.append(self.allocator.allocate())
        self.num_tokens += n_new

    def share(self, blocks: list[int]) -> None:
        """Start the table with full blocks that already hold its first tokens (cache hits)."""
        if self.num_tokens:
            raise ValueError("shared prefix blocks must come first in a block table")
        for block in blocks:
            self.allocator.incref(block)
        self.block_ids.extend(blocks)
        self.num_tokens = len(blocks) * self.block_size
        self.generation += 1

    def truncate(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` slots; blocks past them go back to the pool.

        Speculative decoding reserves slots for every drafted token and keeps those of the
        accepted ones only: the rejected tokens' slots are never written and are free again.
        """
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"cannot truncate {self.num_tokens} tokens to {num_tokens}")
        keep = -(-num_tokens // self.block_size)
        for block in reversed(self.block_ids[max(keep, self.num_freed) :]):
            self.allocator.free(block)
        del self.block_ids[keep:]
        self.num_freed = min(self.num_freed, keep)
        self.num_tokens = num_tokens
        self.generation += 1

    def release(self) -> None:
        """Drop this sequence's reference to every block (it can be recomputed later).

        Last block first: the free list is LRU, so a prefix's head, the part other prompts
        are likeliest to share, is evicted last.
        """
        for block in reversed(self.block_ids[self.num_freed :]):
            self.allocator.free(block)
        self.block_ids.clear()
        self.num_tokens = 0
        self.num_freed = 0
        self.generation += 1


@dataclass(slots=True)
class HybridTable:
    """One sequence's blocks in a pool whose local (sliding-window) layers have blocks of
    their own (a model mixing local and global layers): `main` in the global layers' blocks,
    `local` in the local layers'. Both always hold the same positions; only `local` gives
    blocks back behind the window (`free_before`), so the local layers' KV stays bounded by
    it while the global layers keep the whole context. Reads as `main` where a caller needs one
    table (its ids, its token count); every change goes to both, all or nothing."""

    main: BlockTable
    local: BlockTable

    @property
    def block_size(self) -> int:
        return self.main.block_size

    @property
    def block_ids(self) -> list[int]:
        return self.main.block_ids

    @property
    def num_tokens(self) -> int:
        return self.main.num_tokens

    @property
    def num_freed(self) -> int:
        return self.main.num_freed  # the global layers never free: 0

    @property
    def generation(self) -> int:
        # Both only grow: their sum changes whenever either table loses blocks.
        return self.main.generation + self.local.generation

    def free_before(self, position: int) -> int:
        """The window frees the local layers' blocks only."""
        return self.local.free_before(position)

    def blocks_needed(self, n_new: int) -> int:
        return self.main.blocks_needed(n_new)

    def capacity(self) -> int:
        """The smaller of the two tables' room: a token needs a slot in both."""
        return min(self.main.capacity(), self.local.capacity())

    def reserve(self, n_new: int) -> None:
        """Both tables, or neither (OutOfBlocks, nothing changed)."""
        if self.local.blocks_needed(n_new) > self.local.allocator.num_free:
            raise OutOfBlocks(
                f"{n_new} new tokens need {self.local.blocks_needed(n_new)} more local-layer "
                f"KV cache blocks, {self.local.allocator.num_free} of "
                f"{self.local.allocator.num_blocks} are free"
            )
        self.main.reserve(n_new)
        self.local.reserve(n_new)

    def slots_for(self, n_new: int) -> np.ndarray:
        """The global layers' slots of the next `n_new` tokens, both tables reserved."""
        first = self.num_tokens
        self.reserve(n_new)
        positions = np.arange(first, first + n_new, dtype=np.int64)
        return slots_of(self.main.block_ids, self.block_size, positions)

    def share(self, blocks: list[int]) -> None:
        """Cached prefix blocks hold the global layers' K/V only: none are shared (the
        scheduler runs a mixed model without prefix caching)."""
        if blocks:
            raise ValueError("a model mixing local and global layers shares no prefix blocks")
        self.main.share([])
        self.local.share([])

    def truncate(self, num_tokens: int) -> None:
        self.main.truncate(num_tokens)
        self.local.truncate(num_tokens)

    def release(self) -> None:
        self.main.release()
        self.local.release()


# The shape of one block of K and of V when an engine's blocks are not [B, Hkv, D] (KVLayout).
BlockShapes = tuple[tuple[int, ...], tuple[int, ...]]


def _zero_filled(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    array = np.empty(shape, dtype)
    array.fill(0)
    return array


def slots_of(block_ids: list[int], block_size: int, positions: np.ndarray) -> np.ndarray:
    """Pool slot of each token position [n] of a sequence whose blocks are `block_ids`."""
    table = np.asarray(block_ids, dtype=np.int64)
    return table[positions // block_size] * block_size + positions % block_size


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The pool an engine's session reads, but for its number of blocks: per layer, K and V
    arrays [blocks + 1, block_size, num_kv_heads, head_dim] of `dtype`, or, with
    `block_shapes`, [blocks + 1, *k_block] and [blocks + 1, *v_block]: an engine whose cache
    blocks have a form of their own (OpenVINO's: head-major, an 8-bit cache with its scales and
    zero points inside each block). An engine's runtime plug-in declares it
    (`EngineRuntime.kv_layout`); the pool is built from it."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: np.dtype
    block_shapes: BlockShapes | None = None
    # A model mixing local and global layers: the local (sliding-window) layers, whose blocks
    # are a pool of their own (`KVPool.local_allocator`).
    local_layers: tuple[int, ...] = ()

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block across every layer (of a mixed model: the global layers')."""
        return self.layer_block_bytes * (self.num_layers - len(self.local_layers))

    @property
    def local_bytes_per_block(self) -> int:
        """Bytes of one block of the local layers' pool (0: the model has none)."""
        return self.layer_block_bytes * len(self.local_layers)

    @property
    def layer_block_bytes(self) -> int:
        """Bytes of one block of one layer, keys and values."""
        shape = (1, self.block_size, self.num_kv_heads, self.head_dim)
        return KVPool.bytes_per_block(*shape, self.dtype, block_shapes=self.block_shapes)

    def pool(self, num_blocks: int, num_local_blocks: int | None = None) -> KVPool:
        """A pool of `num_blocks` blocks (plus the scratch block) in this layout; its local
        layers' pool of `num_local_blocks` (default: as many)."""
        shape = (self.block_size, self.num_kv_heads, self.head_dim)
        return KVPool(
            self.num_layers,
            num_blocks,
            *shape,
            self.dtype,
            block_shapes=self.block_shapes,
            local_layers=self.local_layers,
            num_local_blocks=num_local_blocks,
        )


class KVPool:
    """Per-layer key and value arrays [NB + 1, B, Hkv, D], shared by every sequence: NB blocks
    the allocator hands out, then the scratch block (`scratch_block`) padded rows write into.
    With `block_shapes` (k_block, v_block) the arrays are [NB + 1, *k_block] and
    [NB + 1, *v_block]: blocks in an engine's own form, which only its graph reads or writes
    (`write` refuses them).

    The arrays are allocated once and only ever written in place, so an engine session can
    bind them without copying and see every write.
    """

    __slots__ = (
        "allocator",
        "block_size",
        "k",
        "v",
        "prefix_cache",
        "local_layers",
        "local_allocator",
        "_k_flat",
        "_v_flat",
    )

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: np.dtype | type = np.float32,
        *,
        block_shapes: BlockShapes | None = None,
        local_layers: tuple[int, ...] = (),
        num_local_blocks: int | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        block = (block_size, num_kv_heads, head_dim)
        k_block, v_block = block_shapes or (block, block)
        # The local layers of a model mixing local and global layers: arrays of their own
        # block count, blocks from their own allocator, tables of their own (`HybridTable`).
        num_local_blocks = num_blocks if num_local_blocks is None else num_local_blocks
        blocks = [num_local_blocks if i in local_layers else num_blocks for i in range(num_layers)]
        # zeros, not empty: masked slots still go through the attention matmul, and garbage
        # (NaN) there would poison the output even with a zero weight.
        # Zero-filled by writing, not np.zeros' lazily mapped pages: otherwise the first write
        # to every page faults inside a decode step (tens of µs per step of a fresh server),
        # and the resident size would creep up instead of being what the log line says.
        try:  # + 1: the scratch block
            self.k = [_zero_filled((n + 1, *k_block), dtype) for n in blocks]
            self.v = [_zero_filled((n + 1, *v_block), dtype) for n in blocks]
        except MemoryError as e:
            elements = int(np.prod(k_block)) + int(np.prod(v_block))
            nbytes = sum(n + 1 for n in blocks) * elements * np.dtype(dtype).itemsize
            raise KVCacheAllocationFailed(nbytes) from e
        # Reshapes of contiguous arrays are views: writing through them writes the pool.
        # [NB*B, Hkv*D] views: a slot is one row, whatever shape the new K/V come in. Blocks
        # in an engine's own form have no such rows: only its graph writes them.
        own_form = block_shapes is not None
        self._k_flat = None if own_form else [a.reshape(-1, a[0, 0].size) for a in self.k]
        self._v_flat = None if own_form else [a.reshape(-1, a[0, 0].size) for a in self.v]
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self.local_layers = tuple(local_layers)
        self.local_allocator = BlockAllocator(num_local_blocks) if local_layers else None
        # One per pool: every generator on this pool must see the same cached blocks.
        self.prefix_cache = PrefixCache(self.allocator)

    @staticmethod
    def bytes_per_block(
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: np.dtype | type = np.float32,
        *,
        block_shapes: BlockShapes | None = None,
    ) -> int:
        """Bytes one block takes across all layers, keys and values (a pool of n blocks holds
        n + 1: the scratch block)."""
        block = (block_size, num_kv_heads, head_dim)
        k_block, v_block = block_shapes or (block, block)
        elements = int(np.prod(k_block)) + int(np.prod(v_block))
        return num_layers * elements * np.dtype(dtype).itemsize

    @classmethod
    def from_budget(
        cls,
        budget_bytes: int,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: np.dtype | type = np.float32,
        max_blocks: int | None = None,
    ) -> KVPool:
        """As many blocks as fit in `budget_bytes` (at most `max_blocks`)."""
        per_block = cls.bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
        num_blocks = budget_bytes // per_block
        if max_blocks is not None:
            num_blocks = min(num_blocks, max_blocks)
        if num_blocks < 1:
            raise KVCacheTooSmall(
                f"a KV cache budget of {budget_bytes} bytes holds no block "
                f"({per_block} bytes per block)",
                needed_bytes=per_block,
            )
        return cls(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype)

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def scratch_block(self) -> int:
        """The block id after the allocator's: no table ever lists it, so a graph can write the
        K/V of padded rows there (build_inputs' `scratch_block`)."""
        return self.allocator.num_blocks

    @property
    def dtype(self) -> np.dtype:
        return self.k[0].dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks the allocators hand out: the KV cache's capacity (the arrays
        hold one block more, the scratch block)."""
        return sum((len(a) - 1) * a[0].nbytes for a in (*self.k, *self.v))

    @property
    def local_scratch_block(self) -> int | None:
        """The local layers' scratch block (after their allocator's); None: no local layers."""
        return None if self.local_allocator is None else self.local_allocator.num_blocks

    def new_block_table(self) -> BlockTable | HybridTable:
        """A sequence's table: a `HybridTable` when the pool has local layers."""
        table = BlockTable(self.allocator, self.block_size)
        if self.local_allocator is None:
            return table
        return HybridTable(table, BlockTable(self.local_allocator, self.block_size))

    def write(self, slots: np.ndarray, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Scatter k, v [n, Hkv*D] (or [n, Hkv, D]) into `slots` [n] of `layer` (cast to the
        pool dtype)."""
        if self._k_flat is None:
            raise ValueError("a pool of blocks in an engine's own form is written by its graph")
        if k.ndim != 2:
            k, v = k.reshape(len(slots), -1), v.reshape(len(slots), -1)
        self._k_flat[layer][slots] = k
        self._v_flat[layer][slots] = v
