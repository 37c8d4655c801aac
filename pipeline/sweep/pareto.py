"""The Pareto front of a sweep: a variant is on it when no other built variant is at least as
good on quality, speed and size and strictly better on one.

Quality is `kl` (lower is better: the engine's mean per-token KL to the original, the measure
that sees the whole distribution move; perplexity follows it), size `artifact_bytes` (lower),
and speed both throughputs, `tok_s_batch1` and `tok_s_batch32` (higher): the single-user and
the serving figure, which a recipe can trade against each other (speculation helps one,
int8 activations the other). TTFT is left out: at a fixed prompt length it follows the
prefill speed that tok_s_batch32 already measures. A failed variant is never on the front
and dominates nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["LOWER", "HIGHER", "dominates", "pareto_flags"]

LOWER = ("kl", "artifact_bytes")  # lower is better
HIGHER = ("tok_s_batch1", "tok_s_batch32")  # higher is better


def dominates(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """`a` is at least as good as `b` on every objective and better on one."""
    as_good = all(a[k] <= b[k] for k in LOWER) and all(a[k] >= b[k] for k in HIGHER)
    better = any(a[k] < b[k] for k in LOWER) or any(a[k] > b[k] for k in HIGHER)
    return as_good and better


def pareto_flags(rows: Sequence[Mapping[str, Any]]) -> list[bool]:
    """One flag per row: built (no `error`) and dominated by no other built row."""
    built = [r for r in rows if r.get("error") is None]
    return [
        r.get("error") is None and not any(dominates(o, r) for o in built if o is not r)
        for r in rows
    ]
