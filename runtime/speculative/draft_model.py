"""Drafting with a small model built into the artifact (speculative.method draft_model).

The draft has its own KV pool but no block tables of its own: its pool has as many blocks as
the target's, and a token's draft K/V live in the same slot as its target K/V, so the
target's block tables (prefix-cache sharing and preemption included) address both.

The draft computes what the target computes: every prefill call is run on the draft too
(`observe`). While drafting, it first catches up on the tokens it has not seen (the last
sampled one, plus the last accepted draft, or every token of steps that did not speculate),
then drafts greedily one token per call. After verification it forgets the K/V of rejected
drafts (`accepted`): those slots are written again next time. What the draft holds of a
sequence is its `DraftModelSequence` (SequenceState.drafter_state), which preemption drops (the
sequence's blocks, and so its draft K/V, went back); a prefix found in the cache is not trusted
(the draft may not have computed it), so the first draft call of such a sequence computes its
whole prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ingot.runtime.batch import Batch, build_inputs
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.scheduler import Chunk, SequenceState
from ingot.runtime.speculative.drafter import Drafter

__all__ = ["DraftModelDrafter", "DraftModelSequence"]


@dataclass(slots=True)
class DraftModelSequence:
    """What the draft holds of one sequence (its SequenceState.drafter_state)."""

    computed: int = 0  # leading tokens whose draft K/V are in the draft pool


def _state(seq: SequenceState) -> DraftModelSequence:
    """`seq`'s state, made on first use (none yet: the draft holds none of its tokens)."""
    state = seq.drafter_state
    if state is None:
        state = seq.drafter_state = DraftModelSequence()
    return state


class DraftModelDrafter(Drafter):
    def __init__(self, session, pool: KVPool, sliding_window: int | None = None) -> None:
        self.session = session  # a ModelRunner over the draft engine, bound to `pool`
        self.pool = pool
        self.sliding_window = sliding_window

    def observe(self, batch: Batch, chunks: Sequence[Chunk]) -> None:
        """The target just ran `batch` (prefill chunks): the draft computes the same K/V. Both
        engines come from one build, so the batch's layout is the draft's too (a graph that
        writes the pool addresses the draft pool's scratch block: same id, same block count)."""
        _, new_kv = self.session.run(batch)
        batch.write_kv(self.pool, new_kv)
        for chunk in chunks:
            state = _state(chunk.seq)
            if state.computed >= chunk.start:  # contiguous with what it holds
                state.computed = chunk.start + chunk.num_tokens

    def propose(self, seqs: Sequence[SequenceState], ks: Sequence[int]) -> list[list[int]]:
        """Up to k greedy drafts per sequence. Each table must already hold slots for the
        positions of its last token and the k - 1 drafts fed back (the target reserves them
        for verification anyway)."""
        drafts: list[list[int]] = [[] for _ in seqs]
        active = [i for i, k in enumerate(ks) if k]
        if not active:
            return drafts
        # Call 1: each sequence's unseen tokens up to its last one -> the first draft.
        feeds = []
        for i in active:
            seq = seqs[i]
            last = len(seq.token_ids) - 1
            done = min(_state(seq).computed, last)
            feeds.append((seq.table, seq.token_ids[done:], done))
        tokens = self._step(feeds)
        for i, token in zip(active, tokens, strict=True):
            drafts[i].append(token)
        # Calls 2..k: the previous draft in, the next one out.
        for step in range(1, max(ks)):
            active = [i for i in active if ks[i] > step]
            if not active:
                break
            feeds = [
                (seqs[i].table, [drafts[i][-1]], len(seqs[i].token_ids) - 1 + step) for i in active
            ]
            for i, token in zip(active, self._step(feeds), strict=True):
                drafts[i].append(token)
        for i, k in enumerate(ks):
            if k:  # its last token and k - 1 drafts are in the draft pool now
                _state(seqs[i]).computed = len(seqs[i].token_ids) - 1 + k
        return drafts

    def accepted(self, seq: SequenceState) -> None:
        """After verification: only the draft K/V of tokens the target kept stay valid."""
        state = _state(seq)
        state.computed = min(state.computed, seq.num_computed)

    def _step(self, feeds: list) -> list[int]:
        scratch = getattr(self.session, "scratch_block", None)  # set: its graph writes the pool
        batch = build_inputs(feeds, self.sliding_window, scratch_block=scratch)
        logits, new_kv = self.session.run(batch)  # [S, V]: each feed's last token
        batch.write_kv(self.pool, new_kv)
        return np.argmax(logits, axis=-1).tolist()
