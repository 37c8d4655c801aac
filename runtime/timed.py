"""Greedy runs of a Generator with the time each token arrived: how the sweep's speed worker
(ingot.pipeline.sweep.speed_worker) and the benchmarks (benchmarks/decode, benchmarks/serve)
time an artifact. Every request decodes exactly `max_tokens` tokens (EOS ignored)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ingot.runtime.generate import Generator
from ingot.runtime.sampling import SamplingParams

__all__ = ["Trace", "timed_greedy"]

# (when the requests were added, [(a request's output token ids, when each arrived)] in the
# prompts' order); times are time.perf_counter() seconds, a token's time when its step returned
Trace = tuple[float, list[tuple[list[int], list[float]]]]


def timed_greedy(generator: Generator, prompts: Sequence[Sequence[int]], max_tokens: int) -> Trace:
    """Add every prompt at once, step until all are done, and stamp each token as it comes."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    ids = [generator.add(p, params) for p in prompts]
    times: dict[int, list[float]] = {i: [] for i in ids}
    while generator.has_unfinished():
        outputs = generator.step()
        now = time.perf_counter()
        for out in outputs:
            times[out.request_id].append(now)
    return start, [(list(generator.pop_completion(i).token_ids), times[i]) for i in ids]
