"""How many threads the quantizers' small-matrix work gets.

GPTQ's solve (a Cholesky of a K x K Hessian, then one tiny step per column) and AWQ's searches
(fake-quantizing one layer's weights per candidate) are latency-bound below a few thousand
input channels: intra-op threads only add synchronization. Measured on a busy 2-core host,
two threads made them 10-60x slower than one. Wide layers keep every thread for their large
factorizations and matrix products.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["SINGLE_THREAD_MAX_WIDTH", "solver_threads"]

SINGLE_THREAD_MAX_WIDTH = 4096


@contextmanager
def solver_threads(width: int) -> Iterator[None]:
    """One intra-op thread while active if ``width`` (input channels) is at most 4096."""
    before = torch.get_num_threads()
    if width <= SINGLE_THREAD_MAX_WIDTH:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
