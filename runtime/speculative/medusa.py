"""Drafting with Medusa heads (speculative.method medusa): K small heads on the target's final
hidden state, head k proposing the token k + 1 positions after the one the target's own logits
produce from that state.

The heads keep no K/V and see no prefill: each sequence's input is the hidden row of the
target call that produced its last token (its `MedusaSequence`, SequenceState.drafter_state:
the Generator hands the row over through `record_hidden`), so one heads call per step drafts
for every sequence, all k tokens at once. Preemption drops it (the default `preempted`): the
recomputation's last chunk records the row again before the sequence can draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ingot.runtime.engines.onnxruntime.session import open_draft_graph
from ingot.runtime.scheduler import SequenceState
from ingot.runtime.speculative.drafter import Drafter

__all__ = ["MedusaDrafter", "MedusaHeads", "MedusaSequence"]


@dataclass(slots=True)
class MedusaSequence:
    """What the heads read of one sequence (its SequenceState.drafter_state)."""

    # [H] float32: the target's final-norm hidden state at the position whose logits produced
    # the last token (a copy: the session's buffer is written again by the next call).
    last_hidden: np.ndarray


class MedusaHeads:
    """The heads graph: `hidden` float32 [N, H] in, `draft_tokens` int64 [N, K] out (column k:
    head k's greedy token)."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self._session = session  # opened by `open`, which checks its interface

    @classmethod
    def open(cls, path: Path | str) -> MedusaHeads:
        # The drafter options (draft_session_options): one thread that does not spin between
        # calls, optimized at load. The heads only propose: the target's verification decides
        # every token, so their rounding moves acceptance, not output.
        return cls(open_draft_graph(path, "Medusa heads graph", "hidden", "draft_tokens"))

    def run(self, rows: np.ndarray) -> np.ndarray:
        """rows [N, H] float32 -> draft tokens [N, K] int64."""
        feed = {"hidden": np.ascontiguousarray(rows, dtype=np.float32)}
        return self._session.run(["draft_tokens"], feed)[0]


class MedusaDrafter(Drafter):
    needs_hidden = True  # the Generator hands it the row of each sequence's last token

    def __init__(self, heads: MedusaHeads) -> None:
        self.heads = heads  # anything with MedusaHeads.run (tests pass a double)

    def record_hidden(self, seq: SequenceState, row: np.ndarray) -> None:
        state = seq.drafter_state
        if state is None:
            seq.drafter_state = MedusaSequence(row.copy())
        else:
            state.last_hidden = row.copy()

    def propose(self, seqs: Sequence[SequenceState], ks: Sequence[int]) -> list[list[int]]:
        """The first ks[i] heads' tokens for each sequence, from one heads call; none for a
        sequence with no hidden row yet."""
        drafts: list[list[int]] = [[] for _ in seqs]
        active = [
            i
            for i, (seq, k) in enumerate(zip(seqs, ks, strict=True))
            if k and seq.drafter_state is not None
        ]
        if not active:
            return drafts
        rows = np.stack([seqs[i].drafter_state.last_hidden for i in active])  # [A, H]
        tokens = self.heads.run(rows)  # [A, K]
        for j, i in enumerate(active):
            drafts[i] = tokens[j, : ks[i]].tolist()
        return drafts
