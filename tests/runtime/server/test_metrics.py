"""/metrics: Prometheus text with vLLM's names and a model_name label; counters move."""

from __future__ import annotations

import math

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ingot.runtime.server.metrics import build_1_2_5_buckets

from server_support import MODEL, LiveServer, artifact_llm

NAMES = {  # vLLM's metric -> its Prometheus type
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
}


def _scrape(base_url: str) -> dict[str, float]:
    response = httpx.get(f"{base_url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    values = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.labels.get("model_name") == MODEL and "le" not in sample.labels:
                values[sample.name] = values.get(sample.name, 0) + sample.value
    types = {f.name: f.type for f in text_string_to_metric_families(response.text)}
    for name, kind in NAMES.items():
        assert types.get(name) == kind, (name, types.get(name))
    return values


def test_metrics_have_vllms_names_and_move(live_server):
    before = _scrape(live_server.base_url)
    # The same long prompt twice: the second finds its full blocks in the prefix cache.
    body = {"prompt": "def add(a, b):\n    return a + b\n" * 3, "max_tokens": 5, "temperature": 0}
    for _ in range(2):
        response = httpx.post(f"{live_server.base_url}/v1/completions", json=body)
        assert response.status_code == 200
    after = _scrape(live_server.base_url)

    def moved(sample: str) -> float:
        return after[sample] - before.get(sample, 0)

    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    assert moved("vllm:prompt_tokens_total") == 2 * prompt_tokens
    assert moved("vllm:generation_tokens_total") == 10
    assert moved("vllm:time_to_first_token_seconds_count") == 2
    assert moved("vllm:time_per_output_token_seconds_count") == 8
    assert moved("vllm:e2e_request_latency_seconds_count") == 2
    assert moved("vllm:prefix_cache_queries_total") >= prompt_tokens
    assert moved("vllm:prefix_cache_hits_total") > 0
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:num_preemptions_total"] >= 0


SPEC_NAMES = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)


def test_speculative_counters_have_vllms_names_and_move(artifact):
    config = {"method": "ngram", "num_speculative_tokens": 3, "adaptive": False}
    with LiveServer(artifact_llm(artifact, speculative_config=config)) as server:
        body = {"prompt": "a b c d a b c d a b c d a b", "max_tokens": 100, "temperature": 0}
        response = httpx.post(f"{server.base_url}/v1/completions", json=body)
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 100
        text = httpx.get(f"{server.base_url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in SPEC_NAMES:
        assert families[name].type == "counter", name
    total = {
        name: sum(s.value for s in families[name].samples if s.name.endswith("_total"))
        for name in SPEC_NAMES
    }
    drafts, drafted, accepted, per_position = total.values()
    assert drafts > 0 and 0 < accepted <= drafted <= 3 * drafts
    assert per_position == accepted  # each accepted token counted at its draft position
    positions = {
        s.labels["position"]
        for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
    }
    assert positions <= {"0", "1", "2"} and "0" in positions


# vLLM 0.12's vllm/v1/metrics/loggers.py: the histograms vLLM's dashboards read, with its buckets.
_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75]
_ITL += [1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
_LATENCY += [120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
_ITERATION = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
_TOKENS = [1, 2, 5, 10, 20, 50, 100]  # build_1_2_5_buckets(128): the artifact's context length
VLLM_HISTOGRAMS = {
    "vllm:inter_token_latency_seconds": _ITL,
    "vllm:request_queue_time_seconds": _LATENCY,
    "vllm:request_prefill_time_seconds": _LATENCY,
    "vllm:request_decode_time_seconds": _LATENCY,
    "vllm:request_prompt_tokens": _TOKENS,
    "vllm:request_generation_tokens": _TOKENS,
    "vllm:iteration_tokens_total": _ITERATION,
}


def _histograms(base_url: str) -> dict[str, dict]:
    """name -> {"type", "bounds" (finite `le`s, in order), "count", "sum"} of this model's
    histograms."""
    text = httpx.get(f"{base_url}/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        mine = [s for s in family.samples if s.labels.get("model_name") == MODEL]
        bounds = [float(s.labels["le"]) for s in mine if s.name.endswith("_bucket")]
        found[family.name] = {
            "type": family.type,
            "bounds": [b for b in bounds if not math.isinf(b)],
            "count": next(s.value for s in mine if s.name.endswith("_count")),
            "sum": next(s.value for s in mine if s.name.endswith("_sum")),
        }
    return found


def test_vllm_dashboard_histograms_have_vllms_names_types_buckets_and_move(live_server):
    before = _histograms(live_server.base_url)
    for name, bounds in VLLM_HISTOGRAMS.items():
        assert before[name]["type"] == "histogram", name
        assert before[name]["bounds"] == [float(b) for b in bounds], name
    bodies = [
        {"prompt": "import os\n" * 4, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
        {"prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0, "ignore_eos": True},
    ]
    usages = []
    for body in bodies:  # one after the other: every step holds one request
        response = httpx.post(f"{live_server.base_url}/v1/completions", json=body)
        assert response.status_code == 200
        usages.append(response.json()["usage"])
    after = _histograms(live_server.base_url)

    def moved(name: str, field: str) -> float:
        return after[name][field] - before[name][field]

    prompt = sum(u["prompt_tokens"] for u in usages)
    generated = sum(u["completion_tokens"] for u in usages)
    assert generated == 9
    for name in ("queue_time", "prefill_time", "decode_time"):
        assert moved(f"vllm:request_{name}_seconds", "count") == 2
        assert moved(f"vllm:request_{name}_seconds", "sum") >= 0
    # A request's phases split its end-to-end latency exactly (the same clock readings).
    phases = sum(moved(f"vllm:request_{n}_seconds", "sum") for n in ("queue_time", "prefill_time"))
    phases += moved("vllm:request_decode_time_seconds", "sum")
    e2e = moved("vllm:e2e_request_latency_seconds", "sum")
    assert phases == pytest.approx(e2e, abs=1e-6)
    assert moved("vllm:request_prompt_tokens", "count") == 2
    assert moved("vllm:request_prompt_tokens", "sum") == prompt
    assert moved("vllm:request_generation_tokens", "sum") == generated
    # A gap after each token but a request's first: (6 - 1) + (3 - 1).
    assert moved("vllm:inter_token_latency_seconds", "count") == generated - 2
    # Each step's tokens, vLLM's way (the tokens sampled, plus the prompt of a request that
    # got its first): over all steps, every prompt and every sampled token once.
    assert moved("vllm:iteration_tokens_total", "count") == generated
    assert moved("vllm:iteration_tokens_total", "sum") == prompt + generated


def test_build_1_2_5_buckets_is_vllms():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]  # vLLM's docstring example
    assert build_1_2_5_buckets(1024) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    assert build_1_2_5_buckets(0) == []
