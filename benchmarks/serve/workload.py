"""The serve benchmark's workload and statistics: prompts, arrival times, per-request timings.

Every engine reports each request as a `RequestTiming` (its start and the time each output
token arrived); `summarize` turns a run's timings into vLLM's serving metrics: TTFT, TPOT
(per request: decode time / (output tokens - 1)), ITL (every gap between tokens), p50 / p99,
and output tokens per second over the run's makespan. Prompts are windows of a text held out of
the model's training (serve.py's --eval-text).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RequestTiming",
    "make_prompts",
    "poisson_arrivals",
    "shared_prefix_prompts",
    "summarize",
]


@dataclass(slots=True)
class RequestTiming:
    prompt_tokens: int
    start: float  # when the request was sent (or its batch started)
    token_times: list[float]  # when each output token (or streamed chunk) arrived
    output_tokens: int  # as the engine counted them (usage), may exceed len(token_times)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _corpus_ids(tokenizer_file: Path, text_file: Path) -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    return tokenizer.encode(text_file.read_text(encoding="utf-8")).ids


def make_prompts(
    tokenizer_file: Path, text_file: Path, n: int, min_len: int, max_len: int, seed: int = 0
) -> list[list[int]]:
    """`n` windows of `text_file`, lengths uniform in [min_len, max_len], each starting with
    BOS."""
    ids = _corpus_ids(tokenizer_file, text_file)
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        start = int(rng.integers(1, len(ids) - length))
        prompts.append([ids[0], *ids[start : start + length - 1]])
    return prompts


def shared_prefix_prompts(
    tokenizer_file: Path, text_file: Path, n: int, prefix_len: int, suffix_len: int, seed: int = 1
) -> tuple[list[list[int]], list[list[int]]]:
    """(cold, warm): `n` prompts of prefix_len + suffix_len tokens each, from `text_file`.

    The warm prompts share one prefix of `prefix_len` tokens and differ in their suffixes; the
    cold ones have a different prefix each, so none finds anything in the prefix cache.
    """
    ids = _corpus_ids(tokenizer_file, text_file)
    rng = np.random.default_rng(seed)
    total = prefix_len + suffix_len

    def window(length: int) -> list[int]:
        start = int(rng.integers(1, len(ids) - length))
        return ids[start : start + length]

    cold = [[ids[0], *window(total - 1)] for _ in range(n)]
    prefix = [ids[0], *window(prefix_len - 1)]
    warm = [prefix + window(suffix_len) for _ in range(n)]
    return cold, warm


def poisson_arrivals(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """Send offsets (s) of `n` requests: a Poisson process at `rate`/s, or all at 0 (burst)."""
    if rate is None:
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return [float(t) for t in np.cumsum(gaps)]


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    array = np.asarray(values)
    return {
        "mean": float(array.mean()),
        "p50": float(np.percentile(array, 50)),
        "p99": float(np.percentile(array, 99)),
    }


def summarize(timings: list[RequestTiming]) -> dict[str, Any]:
    """vLLM's serving metrics over one run (times in seconds)."""
    done = [t for t in timings if t.token_times]
    ttft = [t.token_times[0] - t.start for t in done]
    tpot = [
        (t.token_times[-1] - t.token_times[0]) / (t.output_tokens - 1)
        for t in done
        if t.output_tokens > 1
    ]
    itl = [b - a for t in done for a, b in zip(t.token_times, t.token_times[1:], strict=False)]
    e2e = [t.token_times[-1] - t.start for t in done]
    output_tokens = sum(t.output_tokens for t in done)
    makespan = max(t.token_times[-1] for t in done) - min(t.start for t in done) if done else 0
    return {
        "requests": len(timings),
        "completed": len(done),
        "prompt_tokens": sum(t.prompt_tokens for t in done),
        "output_tokens": output_tokens,
        # Timed arrivals: fewer than output_tokens where a server sends several tokens a chunk
        # (ITL then counts the gaps between chunks; TPOT is unaffected).
        "streamed_chunks": sum(len(t.token_times) for t in done),
        "makespan_s": makespan,
        "output_tokens_per_s": output_tokens / makespan if makespan else None,
        "ttft_s": _percentiles(ttft),
        "tpot_s": _percentiles(tpot),
        "itl_s": _percentiles(itl),
        "e2e_s": _percentiles(e2e),
        "median_output_tokens": statistics.median(t.output_tokens for t in done) if done else 0,
    }
