"""What the Generator asks of a drafter, and where a drafter keeps what it knows of a sequence.

A drafter subclasses `Drafter` and overrides what it uses; the defaults do nothing. `propose`
is the one every drafter has. The Generator calls the others at fixed points of a step
(runtime/generate.py's docstring says when) and names no drafter: what a drafter reads of the
target it declares (`needs_hidden`, `needs_features`: the target session then binds those
outputs, and the Generator hands the rows over through `record_hidden` / `record_features`).

Per-sequence state: a drafter keeps what it needs of one sequence in
`SequenceState.drafter_state`, an object of a type of its own module (draft_model.py's
`DraftModelSequence`, medusa.py's `MedusaSequence`, eagle.py's `EagleSequence`), None until the
drafter first sets it. The scheduler never reads it. The Generator drops it when the request
retires, and calls `preempted` when the scheduler preempts the sequence: its blocks went back,
and with them whatever a draft pool held of it (the default drops the state; a drafter keeps
what stays true, eagle.py's features of positions the recomputation passes again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ingot.runtime.batch import Batch
from ingot.runtime.scheduler import Chunk, SequenceState

__all__ = ["Drafter"]


class Drafter:
    # The Generator hands it the target's hidden row [H] of the position that produced each
    # sequence's last token (`record_hidden`; the session binds `hidden`).
    needs_hidden: ClassVar[bool] = False
    # The Generator hands it the target's aux_hidden rows [n, 3Ht] of the tokens each call
    # keeps (`record_features`; the session binds `aux_hidden`).
    needs_features: ClassVar[bool] = False
    # Its calls attend through the target's sliding window (or it keeps no K/V), so blocks the
    # window has left behind may be given back while a sequence runs (scheduler.py); False for
    # a drafter that attends over every position it holds.
    windowed: ClassVar[bool] = True

    def propose(self, seqs: Sequence[SequenceState], ks: Sequence[int]) -> list[list[int]]:
        """Up to ks[i] draft tokens to follow each sequence's last token."""
        raise NotImplementedError

    def observe(self, batch: Batch, chunks: Sequence[Chunk]) -> None:
        """The target ran a prefill `batch` of `chunks`: a drafter with a model computes it
        too (only while a step could draft)."""

    def record_hidden(self, seq: SequenceState, row: np.ndarray) -> None:
        """With `needs_hidden`: `row` [H] produced `seq`'s last token (a session buffer,
        written again by the next call: copy what you keep)."""

    def record_features(self, seq: SequenceState, start: int, rows: np.ndarray) -> None:
        """With `needs_features`: the target's rows [n, 3Ht] of `seq`'s positions start ..
        start + n - 1, which the call keeps (a session buffer: copy what you keep)."""

    def accepted(self, seq: SequenceState) -> None:
        """`seq`'s verification is done; its table holds the kept tokens only."""

    def preempted(self, seq: SequenceState) -> None:
        """The scheduler preempted `seq`: its blocks are released, it will be recomputed from
        its prompt and output so far (mostly from cached blocks). What was computed into a
        pool of the drafter's for it is no longer addressed: drop the state."""
        seq.drafter_state = None
