"""Whether speculating pays on this machine, measured: decode steps with and without drafts
are timed, and a batch size whose speculative steps emit fewer tokens per second than its
plain steps stops speculating.

Acceptance alone cannot say it: a verification call over k + 1 tokens per sequence, and a
draft model's own calls, cost more or less than a plain step depending on the model's size,
the batch and the machine (a small model on a CPU is compute-bound and verification costs
about k + 1 plain steps; a large one is bandwidth-bound and verification is almost free). So
the generator times both kinds of step per batch-size bucket (1, 2-3, 4-7, ...): each bucket
first runs `WARMUP` steps of each kind, then takes the faster kind, running the other one
step in `PROBE_EVERY` to follow a change (longer outputs, other prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["StepRates"]

WARMUP = 4  # steps of each kind per bucket before deciding
PROBE_EVERY = 32  # then one step of the slower kind in this many
_EMA_WEIGHT = 0.2


@dataclass(slots=True)
class _Bucket:
    rate: list[float] = field(default_factory=lambda: [0.0, 0.0])  # tokens/s: [plain, spec]
    steps: list[int] = field(default_factory=lambda: [0, 0])
    since_probe: int = 0


class StepRates:
    """Tokens per second of plain and speculative decode steps, per batch-size bucket."""

    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}

    def speculate(self, batch_size: int) -> bool:
        """Whether the next decode step of `batch_size` requests should draft."""
        b = self._bucket(batch_size)
        if min(b.steps) < WARMUP:
            return b.steps[1] <= b.steps[0]  # alternate until both kinds are measured
        faster = b.rate[1] >= b.rate[0]
        b.since_probe += 1
        if b.since_probe >= PROBE_EVERY:
            b.since_probe = 0
            return not faster
        return faster

    def record(self, batch_size: int, speculated: bool, tokens: int, seconds: float) -> None:
        """A decode step of `batch_size` requests emitted `tokens` in `seconds`."""
        if seconds <= 0:
            return
        b = self._bucket(batch_size)
        kind = int(speculated)
        rate = tokens / seconds
        b.rate[kind] = (
            rate if b.steps[kind] == 0 else b.rate[kind] + _EMA_WEIGHT * (rate - b.rate[kind])
        )
        b.steps[kind] += 1

    def rates(self, batch_size: int) -> tuple[float, float]:
        """(plain, speculative) tokens per second measured for `batch_size`'s bucket."""
        b = self._bucket(batch_size)
        return b.rate[0], b.rate[1]

    def _bucket(self, batch_size: int) -> _Bucket:
        return self._buckets.setdefault(batch_size.bit_length(), _Bucket())
