"""Drafting with Medusa heads (speculative.method medusa): K small heads on the target's final
hidden state, head k proposing the token k + 1 positions after the one the target's own logits
produce from that state.

The heads keep no K/V and see no prefill: each sequence's input is the hidden row of the
target call that produced its last token (`SequenceState.last_hidden`, recorded by the
Generator), so one heads call per step drafts for every sequence, all k tokens at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ingot.runtime.batch import Batch
from ingot.runtime.engines.onnxruntime.session import open_draft_graph
from ingot.runtime.scheduler import Chunk, SequenceState

__all__ = ["MedusaDrafter", "MedusaHeads"]


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


class MedusaDrafter:
    needs_hidden = True  # the Generator records SequenceState.last_hidden for it

    def __init__(self, heads: MedusaHeads) -> None:
        self.heads = heads  # anything with MedusaHeads.run (tests pass a double)

    def propose(self, seqs: Sequence[SequenceState], ks: Sequence[int]) -> list[list[int]]:
        """The first ks[i] heads' tokens for each sequence, from one heads call; none for a
        sequence with no hidden row yet."""
        drafts: list[list[int]] = [[] for _ in seqs]
        active = [
            i
            for i, (seq, k) in enumerate(zip(seqs, ks, strict=True))
            if k and seq.last_hidden is not None
        ]
        if not active:
            return drafts
        rows = np.stack([seqs[i].last_hidden for i in active])  # [A, H]
        tokens = self.heads.run(rows)  # [A, K]
        for j, i in enumerate(active):
            drafts[i] = tokens[j, : ks[i]].tolist()
        return drafts

    def observe(self, batch: Batch, chunks: Sequence[Chunk]) -> None:
        pass  # no K/V: the heads read the target's hidden state, nothing to compute

    def accepted(self, seq: SequenceState) -> None:
        pass
