"""/metrics: Prometheus text with vLLM's names and a model_name label; counters move."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server_support import MODEL

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
