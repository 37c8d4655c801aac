"""The original model's next-token logits on the perplexity windows, kept so that the
quantized IR's and the engine's can be scored against them (mean per-token KL, kl.py).

The original and the quantized models are never in memory together (the evaluate stage keeps
the build's peak), so the original's logits are written as they are computed, to a float32
.npy memmap on disk ([W, L - 1, V]: the rows that predict the next token, the same
predictions perplexity scores), and read back window by window. float32, as computed: fp16
would move a near-zero KL by more than an fp32 engine does. Disk: W x (L - 1) x V x 4 bytes
(16 windows of 256 tokens over a 32k vocabulary: 0.5 GB), in the stage's output directory
while the stage runs, removed before it is stored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .kl import kl_sum

__all__ = ["KLMeter", "ReferenceLogits"]


class ReferenceLogits:
    """[W, L - 1, V] float32 on disk; `write` takes a batch's logits as `perplexity`'s
    ``on_logits`` gives them."""

    def __init__(self, file: Path, windows: int, length: int, vocab: int) -> None:
        self.array = np.lib.format.open_memmap(
            file, mode="w+", dtype=np.float32, shape=(windows, length - 1, vocab)
        )

    def write(self, start: int, logits: np.ndarray) -> None:
        """``logits`` [B, L, V] of windows start..start + B; the last row predicts nothing."""
        self.array[start : start + len(logits)] = logits[:, :-1]


class KLMeter:
    """Sums KL(original || model) over the reference's rows as a model's logits arrive
    (an ``on_logits`` callback of `perplexity` or `engine_perplexity`)."""

    def __init__(self, reference: ReferenceLogits) -> None:
        self.reference = reference.array
        self.total = 0.0  # float64 nats
        self.rows = 0

    def add(self, start: int, logits: np.ndarray) -> None:
        """``logits`` [B, L, V] of windows start..start + B, every row."""
        vocab = logits.shape[-1]
        ref = np.asarray(self.reference[start : start + len(logits)]).reshape(-1, vocab)
        self.total += kl_sum(ref, logits[:, :-1].reshape(-1, vocab))
        self.rows += len(ref)

    def mean(self) -> float:
        """Mean KL per scored token, nats."""
        return self.total / self.rows
