"""/tokenize is bounded as completions are: more tokens than the model's max_model_len (or
--max-tokenize-tokens) is a 400, refused before tokenizing when the prompt's length proves it;
/detokenize likewise; and a burst of 9 MB /tokenize bodies leaves the server's resident memory
where it was (it grew from 176 MB to 2.3 GB and stayed there before)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from server_support import MAX_LEN, LiveServer, fake_llm, free_port, wait_healthy

INGOT = str(Path(sys.executable).parent / "ingot")
BIG = "hello world " * (9_000_000 // 12)  # 9 MB
# Resident memory may end this far above where the burst started; it grew by gigabytes when
# /tokenize was unbounded, and by 13-18 MB here without heap.give_back_freed_memory.
RSS_SLACK_MB = 8


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    llm, _ = fake_llm(tmp_path_factory.mktemp("tok"))
    with LiveServer(llm) as live:
        yield live.base_url


def post(base_url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(base_url + path, json=body, timeout=60)


@pytest.mark.parametrize(
    ("body", "param"),
    [({"prompt": BIG}, "prompt"), ({"messages": [{"role": "user", "content": BIG}]}, "messages")],
    ids=["prompt", "messages"],
)
def test_a_9mb_prompt_is_refused_before_it_is_tokenized(base_url, body, param):
    started = time.monotonic()
    r = post(base_url, "/tokenize", body)
    elapsed = time.monotonic() - started
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(f"`{param}` holds 9000000 characters, at least ")
    limit = f"this server tokenizes at most {MAX_LEN} tokens (the model's max_model_len"
    assert limit in error["message"]
    assert elapsed < 5  # parsing the body, not tokenizing it (20-30 s unbounded)


def test_a_prompt_over_the_limit_is_refused_after_tokenizing(base_url):
    prompt = "a " * MAX_LEN  # short enough to pass the length check, over the limit in tokens
    r = post(base_url, "/tokenize", {"prompt": prompt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("`prompt` holds ")
    fits = post(base_url, "/tokenize", {"prompt": "a " * 10})
    assert fits.status_code == 200 and fits.json()["count"] <= MAX_LEN


def test_detokenize_is_bounded_alike(base_url):
    r = post(base_url, "/detokenize", {"tokens": [5] * (MAX_LEN + 1)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    assert post(base_url, "/detokenize", {"tokens": [5] * MAX_LEN}).status_code == 200


def test_max_tokenize_tokens_raises_the_limit(tmp_path):
    llm, _ = fake_llm(tmp_path, max_tokenize_tokens=10 * MAX_LEN)
    with LiveServer(llm) as live:
        r = post(live.base_url, "/tokenize", {"prompt": "a " * MAX_LEN})
        over = post(live.base_url, "/tokenize", {"prompt": "a " * 20 * MAX_LEN})
    assert r.status_code == 200 and r.json()["count"] > MAX_LEN
    assert r.json()["max_model_len"] == MAX_LEN
    assert over.status_code == 400
    assert f"at most {10 * MAX_LEN} tokens (its limit;" in over.json()["error"]["message"]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_burst_of_big_tokenize_requests_leaves_memory_flat(artifact):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [INGOT, "serve", str(artifact), "--port", str(port), "--kv-cache-memory", "4MiB"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(base)
        post(base, "/tokenize", {"prompt": "warm up"})
        before = rss_mb(process.pid)
        statuses: list[int] = []

        def send() -> None:
            statuses.append(post(base, "/tokenize", {"prompt": BIG}).status_code)

        for _ in range(3):  # three rounds of three at once, as the report sent them
            senders = [threading.Thread(target=send) for _ in range(3)]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()
        time.sleep(0.5)
        after = rss_mb(process.pid)
    finally:
        process.terminate()
        process.wait(30)
    assert statuses == [400] * 9
    print(f"RSS before {before:.0f} MB, after 9 x 9 MB /tokenize {after:.0f} MB")
    assert after - before < RSS_SLACK_MB, (before, after)
