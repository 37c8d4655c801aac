"""Perplexity over fixed, consecutive, non-overlapping token windows, in fp32.

The same windows score the original and the quantized model, so the two numbers differ only
by the weights. A window of L tokens is scored on its L - 1 next-token predictions; windows do
not see each other (no sliding context), which makes each number reproducible on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ingot.runtime.tokenizer import load_tokenizer

from .errors import EvalDataError

__all__ = ["tokenize", "token_windows", "perplexity"]


def tokenize(text: str, tokenizer_json: Path) -> list[int]:
    """Token ids of `text` with the checkpoint's tokenizer (as transformers loads it),
    without special tokens."""
    return load_tokenizer(tokenizer_json).encode(text, add_special_tokens=False).ids


def token_windows(ids: list[int], seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """[W, seq_len] int64: the first W full windows of `ids` (a partial tail is dropped)."""
    count = len(ids) // seq_len
    if count == 0:
        raise EvalDataError(
            f"evaluate.perplexity: the dataset has {len(ids)} tokens, fewer than one window "
            f"of seq_len {seq_len}; use more text or a smaller seq_len"
        )
    if max_windows is not None:
        count = min(count, max_windows)
    return torch.tensor(ids[: count * seq_len], dtype=torch.int64).view(count, seq_len)


@torch.inference_mode()
def perplexity(
    model: nn.Module,
    windows: torch.Tensor,
    batch_size: int = 8,
    on_logits: Callable[[int, np.ndarray], None] | None = None,
) -> float:
    """exp(mean next-token NLL) of `model` (forward(ids) -> (logits, ...)) over `windows`.
    ``on_logits(start, logits)`` sees each batch's float32 logits [B, L, V] of windows
    start..start + B (the original's kept, a model's scored against them: reference.py)."""
    total = 0.0  # summed in float64: thousands of windows would lose digits in fp32
    scored = 0
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]  # [B, L]
        logits = model(batch)[0]  # [B, L, V]
        if on_logits is not None:
            on_logits(start, logits.float().numpy())
        targets = batch[:, 1:]  # [B, L - 1]
        nll = nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            reduction="sum",
        )
        total += float(nll.double())
        scored += targets.numel()
    return math.exp(total / scored)
