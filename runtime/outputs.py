"""What the generator hands back: per-step token events, finished completions, scheduler stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Completion", "SchedulerStats", "StepOutput"]


@dataclass(slots=True)
class Completion:
    """A finished request."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    logprobs: list[float] | None = None  # of each token in token_ids, if requested
    top_logprobs: list[dict[int, float]] | None = None  # per token, if requested
    # vLLM's: the stop string, or the stop_token_ids entry, that ended it (None for EOS,
    # length, or a complete structured output).
    stop_reason: str | int | None = None
    # Sum of the sampled tokens' logprobs under the raw model distribution: None unless the
    # request asked for logprobs or is `ranked` (a best_of sample), as vLLM.
    cumulative_logprob: float | None = None
    # time.monotonic() when its prompt was first scheduled (vLLM's scheduled_ts): the end of
    # its queueing and the start of its prefill, for the server's metrics. A timing, not part
    # of what was generated: two equal completions may differ in it.
    scheduled_at: float | None = field(default=None, compare=False)


class StepOutput(NamedTuple):
    """One request's new token from one step."""

    request_id: int
    token: int
    finished: bool
    finish_reason: str | None  # "stop" | "length" once finished
    text_delta: str = ""  # text decided by this token (stop strings held back, then cut)
    logprob: float | None = None  # of `token`, if the request asked for logprobs
    top_logprobs: dict[int, float] | None = None  # {token id: logprob}, most likely first
    stop_reason: str | int | None = None  # once finished: as Completion.stop_reason


@dataclass(slots=True)
class SchedulerStats:
    """A snapshot of the scheduler and its KV pool, for /metrics (vLLM's SchedulerStats:
    its gauges and counters)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # blocks referenced by a sequence / all blocks (0..1)
    num_preemptions: int  # cumulative
    prefix_cache_queries: int  # cumulative, prompt tokens looked up
    prefix_cache_hits: int  # cumulative, of those, tokens found
    num_blocks: int
    block_size: int
    # Speculative decoding, cumulative (all 0 without it): vLLM's spec_decode counters.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()
