"""Iteration-level scheduling: which sequences compute which of their tokens in the next step.

A step is one decode call (every running sequence with one token left to compute, i.e. its
last sampled token) and the prefill: chunks of prompts, one per row, padded to the longest
chunk. Both share one token budget, counted as the engine sees it: decode tokens plus the
prefill padded as one call. Decodes go first, so a long prompt never stalls the requests already
generating; it is prefilled a chunk per step instead (chunked prefill). Chunks of mixed lengths
run as up to MAX_PREFILL_CALLS calls of similar lengths (`split_prefill`) where that saves more
padding than the extra calls cost: a prefill of prompts of 64-256 tokens in one call computed
1.5-1.65x its real tokens. Each chunk keeps a row of its own whose keys start at table slot 0,
so a sequence's numerics do not depend on what it is batched with (a packed row, two chunks
side by side, would shift one's keys and with them the rounding of its attention sums).

Two policies, vLLM's (`SCHEDULING_POLICIES`). "fcfs": sequences are served first come, first
served; when the pool runs out of blocks, the newest running sequence not yet scheduled in this
step is preempted: its blocks are released and it goes back to the front of the waiting queue,
to be recomputed from its prompt and output so far (with prefix caching on, mostly from its own
blocks, still cached). "priority": the waiting queue is ordered by (priority, arrival), lower
values first, a preempted sequence going back to its place in that order; the sequence
preempted is the running one of the highest (priority, arrival), even one already scheduled
in this step (its chunk is dropped from the step), as vLLM's scheduler does. Waiting sequences
never preempt running ones under either policy. `on_preempt` tells whoever keeps per-sequence
state beside the pool (the Generator, for its drafter). Finished sequences leave at once;
waiting ones fill their slots in the same step.

With a `sliding_window` W (a model whose every layer slides: Mistral), a sequence about to
compute from position p gives back, before it is scheduled, each block whose positions are all
below p - W + 1: no query at p or later sees them (`BlockTable.free_before`). Its KV then stays
within W + the chunk + a block, however long it runs. A block shared through the prefix cache
only loses that reference; a cached one stays findable on the free list until reused.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ingot.runtime.kv_pool import BlockTable, HybridTable, KVPool
from ingot.runtime.prefix_cache import chain_hashes

__all__ = [
    "SCHEDULING_POLICIES",
    "Chunk",
    "Scheduler",
    "SchedulerOutput",
    "SequenceState",
    "split_prefill",
]

# vLLM's `--scheduling-policy` values: first come first served, or by request priority.
SCHEDULING_POLICIES = ("fcfs", "priority")

# A prefill call more costs about this many tokens' work (every node dispatched again, every
# weight read again; a small M runs the matmuls less efficiently): a split must save more
# padding than that.
CALL_COST_TOKENS = 64
MAX_PREFILL_CALLS = 4


@dataclass(slots=True, eq=False)  # identity: two sequences are never "equal"
class SequenceState:
    """The tokens of one request and where their keys and values are in the pool."""

    id: int
    token_ids: list[int]  # the prompt, then the output so far
    num_prompt_tokens: int
    table: BlockTable | HybridTable  # HybridTable: a model mixing local and global layers
    block_hashes: list[bytes] = field(default_factory=list)  # chain hashes of full blocks
    num_cached_blocks: int = 0  # leading blocks of `table` the prefix cache knows
    priority: int = 0  # lower first, under the "priority" policy (ignored under "fcfs")
    arrival: int = 0  # the scheduler's count when it was added: ties of priority go by it
    # The drafter's own per-sequence state, of the drafter's own type (speculative/drafter.py):
    # None until the drafter sets it. The scheduler never reads it; on preemption it calls
    # `on_preempt`, through which the drafter decides what survives.
    drafter_state: object | None = None

    @property
    def num_computed(self) -> int:
        """Tokens whose keys and values are in the pool (or being computed this step)."""
        return self.table.num_tokens

    @property
    def num_remaining(self) -> int:
        return len(self.token_ids) - self.table.num_tokens


@dataclass(slots=True)
class Chunk:
    """`num_tokens` tokens of `seq` from position `start`, computed in one call."""

    seq: SequenceState
    start: int
    num_tokens: int

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start : self.start + self.num_tokens]

    @property
    def completes(self) -> bool:
        """The last chunk of what the sequence has: its last logits pick the next token."""
        return self.start + self.num_tokens == len(self.seq.token_ids)


@dataclass(slots=True)
class SchedulerOutput:
    decode: list[Chunk] = field(default_factory=list)  # one token each
    prefill: list[Chunk] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.decode or self.prefill)

    @property
    def prefill_calls(self) -> list[list[Chunk]]:
        """The prefill chunks as the engine calls that run them (`split_prefill`)."""
        return split_prefill(self.prefill)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens the step's calls hold as the engine sees them: the decodes plus the
        prefill call padded to its longest chunk (what the token budget counts)."""
        return len(self.decode) + len(self.prefill) * _longest(self.prefill)


class Scheduler:
    """Waiting and running queues over one KV pool; blocks are allocated as it schedules."""

    def __init__(
        self,
        pool: KVPool,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_prefix_caching: bool = True,
        on_preempt: Callable[[SequenceState], None] | None = None,
        policy: str = "fcfs",
        sliding_window: int | None = None,
    ) -> None:
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling policy {policy!r} is not one of {', '.join(SCHEDULING_POLICIES)}"
            )
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_seqs ({max_num_seqs}) and max_num_batched_tokens "
                f"({max_num_batched_tokens}) must be >= 1"
            )
        self.pool = pool
        self.block_size = pool.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # A mixed model's local layers hold no cached prefix (their blocks are freed behind
        # the window): no prefix caching for it, as a first cut (the Generator logs it).
        caching = enable_prefix_caching and pool.local_allocator is None
        self.cache = pool.prefix_cache if caching else None
        # Told of each preempted sequence, after its blocks went back: whoever keeps state of
        # it beside the pool (a drafter, through the Generator) drops what the blocks held.
        self.on_preempt = on_preempt
        self.policy = policy
        # Blocks wholly before a sequence's next position - this + 1 are given back as it runs.
        self.sliding_window = sliding_window
        # fcfs: in arrival order, preempted ones in front; priority: by (priority, arrival).
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []  # in admission order; fcfs preempts the last
        self._arrivals = 0
        self.num_preemptions = 0
        self.prefix_cache_queries = 0  # tokens of admitted sequences looked up
        self.prefix_cache_hits = 0  # of those, tokens found in the cache

    def add(self, seq: SequenceState) -> None:
        seq.arrival = self._arrivals
        self._arrivals += 1
        self._enqueue(seq, preempted=False)

    def _enqueue(self, seq: SequenceState, preempted: bool) -> None:
        if self.policy == "priority":
            bisect.insort(self.waiting, seq, key=_priority_order)
        elif preempted:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: SequenceState) -> None:
        """`seq` is done: its blocks go back to the pool (cached ones stay findable)."""
        self.running.remove(seq)
        seq.table.release()

    def abort(self, seq: SequenceState) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.table.release()

    def schedule(self) -> SchedulerOutput:
        """The chunks of the next step, with blocks allocated for every one of them."""
        out = SchedulerOutput()
        scheduled: set[SequenceState] = set()
        preempted = self.num_preemptions
        budget = self.max_num_batched_tokens

        for seq in [s for s in self.running if s.num_remaining == 1]:
            if len(out.decode) == budget:
                break
            if seq in self.running:
                self._grow(seq, 1, scheduled, out, out.decode)
        budget_left = budget - len(out.decode)

        for seq in [s for s in self.running if s.num_remaining > 1]:
            allowed = budget_left // (len(out.prefill) + 1)
            if allowed < max(1, _longest(out.prefill)):
                break
            if seq in self.running:
                self._grow(seq, min(seq.num_remaining, allowed), scheduled, out, out.prefill)

        # As vLLM: a step that had to preempt admits nobody, or it would preempt again.
        while self.waiting and self.num_preemptions == preempted:
            if len(self.running) >= self.max_num_seqs:
                break
            allowed = budget_left // (len(out.prefill) + 1)
            if allowed < max(1, _longest(out.prefill)) or not self._admit(allowed, out.prefill):
                break
        return out

    def cache_computed_blocks(self, seq: SequenceState) -> None:
        """After a call: hash the blocks of `seq` it filled, so later prompts can share them."""
        if self.cache is None:
            return
        full = seq.num_computed // self.block_size
        if full <= seq.num_cached_blocks:
            return
        chain_hashes(seq.token_ids, self.block_size, full, seq.block_hashes)
        for i in range(max(seq.num_cached_blocks, seq.table.num_freed), full):
            self.cache.insert(seq.table.block_ids[i], seq.block_hashes[i])
        seq.num_cached_blocks = full

    def _grow(
        self,
        seq: SequenceState,
        n: int,
        scheduled: set[SequenceState],
        out: SchedulerOutput,
        into: list[Chunk],
    ) -> int:
        """Schedule up to `n` more tokens of running `seq` (as many as fit) into `into` (a
        list of `out`), preempting (`_victim`) until some fit; 0 if `seq` itself was
        preempted."""
        self._free_outside_window(seq)
        while True:
            fit = min(n, self.capacity(seq))
            if fit:
                into.append(Chunk(seq, seq.num_computed, fit))
                seq.table.reserve(fit)
                scheduled.add(seq)
                return fit
            victim = self._victim(scheduled)
            if victim in scheduled:  # priority: its chunk leaves the step with its blocks
                scheduled.discard(victim)
                out.decode[:] = [c for c in out.decode if c.seq is not victim]
                out.prefill[:] = [c for c in out.prefill if c.seq is not victim]
            self._preempt(victim)
            if victim is seq:
                return 0

    def _victim(self, scheduled: set[SequenceState]) -> SequenceState:
        """The running sequence to preempt: fcfs, the newest not yet scheduled in this step;
        priority, the one of the highest (priority, arrival), scheduled or not (vLLM's)."""
        if self.policy == "priority":
            return max(self.running, key=_priority_order)
        return next(s for s in reversed(self.running) if s not in scheduled)

    def _free_outside_window(self, seq: SequenceState) -> None:
        """Give back the blocks of `seq` that no query from its next position on can see."""
        if self.sliding_window is not None:
            seq.table.free_before(seq.num_computed - self.sliding_window + 1)

    def capacity(self, seq: SequenceState) -> int:
        """How many more tokens `seq` can take with the blocks it has and the free ones (in
        both pools of a mixed model)."""
        return seq.table.capacity()

    def _preempt(self, seq: SequenceState) -> None:
        self.running.remove(seq)
        seq.table.release()
        seq.num_cached_blocks = 0
        self._enqueue(seq, preempted=True)
        self.num_preemptions += 1
        if self.on_preempt is not None:
            self.on_preempt(seq)

    def _admit(self, allowed: int, prefill: list[Chunk]) -> bool:
        """Start the first waiting sequence with a chunk of at most `allowed` tokens, reusing
        its cached prefix; False (and no change) if the pool cannot hold the chunk."""
        seq = self.waiting[0]
        hits = self._cached_prefix(seq)
        start = len(hits) * self.block_size
        n = min(len(seq.token_ids) - start, allowed)
        allocator = self.pool.allocator
        new_blocks = -(-(start + n) // self.block_size) - len(hits)
        revived = sum(allocator.is_free(b) for b in hits)  # cached, but on the free list
        if new_blocks > allocator.num_free - revived:
            return False
        if not hits and n > seq.table.capacity():  # a mixed model's local layers' pool too
            return False
        self.waiting.popleft()
        seq.table.share(hits)  # before allocating: the allocator must not evict the hits
        seq.num_cached_blocks = len(hits)
        self._free_outside_window(seq)  # hits that the window has already left behind
        seq.table.reserve(n)
        self.running.append(seq)
        prefill.append(Chunk(seq, start, n))
        if self.cache is not None:
            self.prefix_cache_queries += len(seq.token_ids)
            self.prefix_cache_hits += start
        return True

    def _cached_prefix(self, seq: SequenceState) -> list[int]:
        """Cached blocks holding the first tokens of `seq`.

        Only blocks before the last token: that token is always computed, since its logits
        pick the next token (a fully cached prompt recomputes its last block).
        """
        if self.cache is None:
            return []
        num = (len(seq.token_ids) - 1) // self.block_size
        chain_hashes(seq.token_ids, self.block_size, num, seq.block_hashes)
        return self.cache.lookup(seq.block_hashes[:num])


def _priority_order(seq: SequenceState) -> tuple[int, int]:
    """Lower first: the waiting queue's order under "priority"; the highest is preempted."""
    return seq.priority, seq.arrival


def _longest(chunks: list[Chunk]) -> int:
    return max((c.num_tokens for c in chunks), default=0)


def split_prefill(chunks: list[Chunk]) -> list[list[Chunk]]:
    """`chunks` as the calls that compute the fewest padded tokens plus CALL_COST_TOKENS per
    call, at most MAX_PREFILL_CALLS of them: runs of the chunks sorted longest first (each call
    padded to its first), found by dynamic programming. Calls in the order of their first
    chunk, chunks within one in their order in `chunks`."""
    if len(chunks) < 2:
        return [chunks] if chunks else []
    order = sorted(range(len(chunks)), key=lambda i: -chunks[i].num_tokens)
    lengths = [chunks[i].num_tokens for i in order]
    n = len(lengths)
    # cost[j]: the cheapest run of the longest j chunks in at most g calls; starts[g][j]: where
    # that run's last call starts (None: it needs no more than g - 1 calls).
    cost = [lengths[0] * j + CALL_COST_TOKENS for j in range(n + 1)]
    starts: list[list[int | None]] = [[0] * (n + 1)]
    for _ in range(1, min(MAX_PREFILL_CALLS, n)):
        new, start = cost[:], [None] * (n + 1)
        for j in range(2, n + 1):
            for i in range(1, j):  # the last call: chunks i .. j-1, padded to lengths[i]
                candidate = cost[i] + lengths[i] * (j - i) + CALL_COST_TOKENS
                if candidate < new[j]:
                    new[j], start[j] = candidate, i
        cost = new
        starts.append(start)
    calls, end, g = [], n, len(starts) - 1
    while end > 0:
        first = starts[g][end]
        if first is not None:
            calls.append(sorted(order[first:end]))
            end = first
        g -= 1
    return [[chunks[i] for i in call] for call in sorted(calls)]
