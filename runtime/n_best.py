"""n and best_of: which of a request's samples it returns.

A request with n > 1 (or best_of) runs as one generator request per sample
(`sampling.fan_out`); `pick_best` chooses among the finished samples, the same way for
LLM.generate and the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

__all__ = ["pick_best"]


class _Scored(Protocol):
    @property
    def cumulative_logprob(self) -> float | None: ...  # set on `ranked` samples


S = TypeVar("S", bound=_Scored)


def pick_best(completions: Sequence[S], n: int) -> list[S]:
    """The `n` samples to return, from the finished `completions` of one request's
    `fan_out` (in its order): Completions, or the server's finished samples.

    best_of > n (more completions than n): the n of highest cumulative_logprob, best first
    (equal ones in sample order), as vLLM; otherwise all of them in sample order.
    """
    if not 1 <= n <= len(completions):
        raise ValueError(f"n must be in [1, {len(completions)}] (the samples), got {n}")
    if len(completions) == n:
        return list(completions)
    if any(c.cumulative_logprob is None for c in completions):
        raise ValueError("best_of > n ranks samples by cumulative logprob: fan_out's `ranked`")
    ranked = sorted(range(len(completions)), key=lambda i: (-completions[i].cumulative_logprob, i))
    return [completions[i] for i in ranked[:n]]
