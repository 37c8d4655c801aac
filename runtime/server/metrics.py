"""Prometheus metrics under vLLM's names, so vLLM's dashboards and alerts read ingot unchanged.

Names, types, help texts and buckets follow vLLM 0.12's vllm/v1/metrics/loggers.py (the
release that hides time_per_output_token_seconds behind inter_token_latency_seconds; ingot
keeps both). Each server has its own `CollectorRegistry` (two servers in one process, as in
tests, never share counters). Counters are exposed with the `_total` suffix, as vLLM's are.

A request's phases, as vLLM measures them: queued from arrival until its prompt is first
scheduled, prefill from then to its first token, decode from its first token to its last.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics", "build_1_2_5_buckets"]

# vLLM's buckets, so histograms compare bucket for bucket.
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_TPOT_BUCKETS = (  # time_per_output_token and inter_token_latency
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_LATENCY_BUCKETS = (  # e2e latency and each phase of a request
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to `max_value`."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


# (attribute, vLLM's name, vLLM's help text): one labelled child per served model.
_GAUGES = (
    ("num_requests_running", "vllm:num_requests_running",
     "Number of requests in model execution batches."),
    ("num_requests_waiting", "vllm:num_requests_waiting",
     "Number of requests waiting to be processed."),
    ("kv_cache_usage_perc", "vllm:kv_cache_usage_perc",
     "KV-cache usage. 1 means 100 percent usage."),
)  # fmt: skip
_COUNTERS = (
    ("num_preemptions", "vllm:num_preemptions", "Cumulative number of preemption."),
    ("prompt_tokens", "vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("generation_tokens", "vllm:generation_tokens", "Number of generation tokens processed."),
    ("prefix_cache_queries", "vllm:prefix_cache_queries",
     "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits", "vllm:prefix_cache_hits",
     "Prefix cache hits, in terms of number of cached tokens."),
    ("spec_decode_num_drafts", "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
    ("spec_decode_num_draft_tokens", "vllm:spec_decode_num_draft_tokens",
     "Number of draft tokens."),
    ("spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens",
     "Number of accepted tokens."),
)  # fmt: skip
# (attribute, vLLM's name, help text, buckets)
_HISTOGRAMS = (
    ("time_to_first_token", "vllm:time_to_first_token_seconds",
     "Histogram of time to first token in seconds.", _TTFT_BUCKETS),
    ("time_per_output_token", "vllm:time_per_output_token_seconds",
     "Histogram of time per output token in seconds.", _TPOT_BUCKETS),
    ("inter_token_latency", "vllm:inter_token_latency_seconds",
     "Histogram of inter-token latency in seconds.", _TPOT_BUCKETS),
    ("e2e_request_latency", "vllm:e2e_request_latency_seconds",
     "Histogram of end to end request latency in seconds.", _REQUEST_LATENCY_BUCKETS),
    ("request_queue_time", "vllm:request_queue_time_seconds",
     "Histogram of time spent in WAITING phase for request.", _REQUEST_LATENCY_BUCKETS),
    ("request_prefill_time", "vllm:request_prefill_time_seconds",
     "Histogram of time spent in PREFILL phase for request.", _REQUEST_LATENCY_BUCKETS),
    ("request_decode_time", "vllm:request_decode_time_seconds",
     "Histogram of time spent in DECODE phase for request.", _REQUEST_LATENCY_BUCKETS),
    ("iteration_tokens", "vllm:iteration_tokens_total",
     "Histogram of number of tokens per engine_step.", _ITERATION_TOKENS_BUCKETS),
)  # fmt: skip
# Bucketed up to the model's context length, so made once it is known (`bind_model`).
_TOKEN_HISTOGRAMS = (
    ("request_prompt_tokens", "vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    ("request_generation_tokens", "vllm:request_generation_tokens",
     "Number of generation tokens processed."),
)  # fmt: skip


class Metrics:
    """The server's gauges, counters and latency histograms for one served model."""

    def __init__(self, model_name: str) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._model_name = model_name
        labels = ["model_name"]
        for attr, name, doc in _GAUGES:
            setattr(self, attr, Gauge(name, doc, labels, registry=r).labels(model_name))
        for attr, name, doc in _COUNTERS:
            setattr(self, attr, Counter(name, doc, labels, registry=r).labels(model_name))
        for attr, name, doc, buckets in _HISTOGRAMS:
            metric = Histogram(name, doc, labels, buckets=buckets, registry=r)
            setattr(self, attr, metric.labels(model_name))
        self._spec_accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            ["model_name", "position"],
            registry=r,
        )
        self._request_success = Counter(
            "vllm:request_success",
            "Count of finished requests by finish reason (stop, length, abort).",
            ["model_name", "finished_reason"],
            registry=r,
        )
        # The scheduler's counters are cumulative; these remember what the Prometheus counters hold.
        self._seen = dict.fromkeys(
            ("preemptions", "queries", "hits", "drafts", "draft_tokens", "accepted"), 0
        )
        self._seen_per_pos: list[int] = []

    def observe_stats(self, stats: object) -> None:
        """Copy a `SchedulerStats` snapshot into the gauges and cumulative counters."""
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        self.kv_cache_usage_perc.set(stats.kv_cache_usage)
        for key, total, counter in (
            ("preemptions", stats.num_preemptions, self.num_preemptions),
            ("queries", stats.prefix_cache_queries, self.prefix_cache_queries),
            ("hits", stats.prefix_cache_hits, self.prefix_cache_hits),
            ("drafts", stats.spec_num_drafts, self.spec_decode_num_drafts),
            ("draft_tokens", stats.spec_num_draft_tokens, self.spec_decode_num_draft_tokens),
            ("accepted", stats.spec_num_accepted_tokens, self.spec_decode_num_accepted_tokens),
        ):
            if total > self._seen[key]:
                counter.inc(total - self._seen[key])
                self._seen[key] = total
        seen = self._seen_per_pos
        for position, total in enumerate(stats.spec_accepted_per_position):
            if position == len(seen):
                seen.append(0)
            if total > seen[position]:
                self._spec_accepted_per_pos.labels(self._model_name, str(position)).inc(
                    total - seen[position]
                )
                seen[position] = total

    def bind_model(self, max_model_len: int) -> None:
        """Add the histograms bucketed by the served model's context length (vLLM's
        build_1_2_5_buckets(max_model_len)); called once the model is loaded."""
        if hasattr(self, "request_prompt_tokens"):
            return  # bound already (a registry takes each name once)
        buckets = build_1_2_5_buckets(max_model_len)
        for attr, name, doc in _TOKEN_HISTOGRAMS:
            metric = Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry)
            setattr(self, attr, metric.labels(self._model_name))

    def request_finished(self, reason: str) -> None:
        self._request_success.labels(self._model_name, reason).inc()

    def observe_finished(
        self,
        *,
        arrival: float,
        scheduled: float,
        first_token: float,
        finished: float,
        num_prompt_tokens: int,
        num_generation_tokens: int,
    ) -> None:
        """A request that ended with stop or length: its latency, its phases (times are
        time.monotonic() seconds) and its token counts."""
        self.e2e_request_latency.observe(finished - arrival)
        self.request_queue_time.observe(scheduled - arrival)
        self.request_prefill_time.observe(first_token - scheduled)
        self.request_decode_time.observe(finished - first_token)
        self.request_prompt_tokens.observe(num_prompt_tokens)
        self.request_generation_tokens.observe(num_generation_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
