"""KL divergence of a model's next-token distributions from a reference model's, on the same
token positions: how far quantization moved the whole distribution, not only the probability
of the observed token (perplexity). numpy only, so it scores an engine's logits (the runtime's
arrays) and the IR's (``tensor.numpy()``) alike."""

from __future__ import annotations

import numpy as np

__all__ = ["kl_sum", "mean_kl"]

_ROWS_PER_CHUNK = 64  # rows converted to float64 at a time (large vocabularies)


def kl_sum(reference: np.ndarray, logits: np.ndarray) -> float:
    """Sum over rows of KL(softmax(reference) || softmax(logits)) in nats, float64.

    reference, logits: [N, V] (any float dtype), row i of both at the same position."""
    if reference.shape != logits.shape or reference.ndim != 2:
        raise ValueError(
            f"KL needs two [N, V] arrays of one shape, got {reference.shape} and {logits.shape}"
        )
    total = 0.0
    for start in range(0, len(reference), _ROWS_PER_CHUNK):
        p_log = _log_softmax(reference[start : start + _ROWS_PER_CHUNK])  # [n, V]
        q_log = _log_softmax(logits[start : start + _ROWS_PER_CHUNK])  # [n, V]
        total += float((np.exp(p_log) * (p_log - q_log)).sum())
    return total


def mean_kl(reference: np.ndarray, logits: np.ndarray) -> float:
    """Mean per-row (per-token) KL(softmax(reference) || softmax(logits)) in nats."""
    return kl_sum(reference, logits) / len(reference)


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)  # [n, V]
    top = rows.max(axis=-1, keepdims=True)
    return rows - top - np.log(np.exp(rows - top).sum(axis=-1, keepdims=True))
