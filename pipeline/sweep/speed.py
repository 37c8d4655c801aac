"""Speed of built artifacts, each timed alone in a fresh interpreter (speed_worker.py): batch-1
decode tok/s, total output tok/s of `concurrency` requests at once and their TTFT p50; rounds
interleaved across variants (round r runs every variant, the order rotated per round), medians
over rounds; the host's load recorded before and after (ingot.pipeline.host_load)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SpeedReport", "SpeedResult", "measure_speed"]


@dataclass(frozen=True)
class SpeedResult:
    tok_s_batch1: float  # decode tok/s, one request, median over rounds
    tok_s_batch32: float  # total output tok/s, 32 requests at once (in-process Generator)
    ttft_ms_p50: float  # TTFT p50 of the 32-request burst, median over rounds


@dataclass(frozen=True)
class SpeedReport:
    results: dict[str, SpeedResult]  # by variant name
    load: dict  # the host load record (before/after, threads, quiet: bool)


def measure_speed(
    artifacts: Mapping[str, Path],
    *,
    rounds: int = 3,
    prompt_tokens: int = 64,
    output_tokens: int = 32,
    concurrency: int = 32,
    refuse_loaded: bool = False,
) -> SpeedReport:
    """Time every artifact (see the module); `refuse_loaded` raises a one-line IngotError when
    the host is loaded, otherwise a loaded run is reported in `load["quiet"]`."""
    raise NotImplementedError
