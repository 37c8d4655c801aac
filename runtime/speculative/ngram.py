"""Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (n from prompt_lookup_max down to prompt_lookup_min) are proposed.

Nothing is built and nothing runs on a model: it pays off where the output repeats its input
(code edits, extraction, quoting), and drafts nothing where no suffix recurs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ingot.runtime.scheduler import SequenceState
from ingot.runtime.speculative.drafter import Drafter

__all__ = ["NgramDrafter", "propose_ngram"]


def propose_ngram(token_ids: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to `k` tokens continuing the longest suffix n-gram of `token_ids` that occurred
    before (its latest earlier occurrence); [] when none did."""
    tokens = np.asarray(token_ids, dtype=np.int64)  # [L]
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # Windows starting at 0 .. L-n-1: every n-gram that has at least one token after it.
        windows = sliding_window_view(tokens[:-1], n)  # [L-n, n]
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # the token after the latest occurrence
            return tokens[start : start + k].tolist()
    return []


class NgramDrafter(Drafter):
    """Drafts from each sequence's own tokens (prompt and output so far): no state of its own,
    nothing to compute."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seqs: Sequence[SequenceState], ks: Sequence[int]) -> list[list[int]]:
        """Per sequence (all its tokens, the last one not yet computed), up to k drafts."""
        return [
            propose_ngram(seq.token_ids, k, self.min_n, self.max_n) if k else []
            for seq, k in zip(seqs, ks, strict=True)
        ]
