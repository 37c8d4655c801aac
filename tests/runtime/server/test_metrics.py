"""/metrics: Prometheus text with vLLM's names and a model_name label; counters move."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

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
