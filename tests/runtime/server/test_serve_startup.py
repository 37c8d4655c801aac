"""`ingot serve` start-up: a load failure (KV cache too small, an artifact that does not verify)
stops the process within seconds with one line in the user's words, instead of a server stuck
at 503; the default KV cache is `auto` and its size is printed; --chat-template serves chat for
an artifact without a template."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ingot.artifacts import write_manifest

from fixtures import CHAT_TEMPLATE
from server_support import LiveServer, artifact_llm, free_port, wait_healthy

INGOT = str(Path(sys.executable).parent / "ingot")  # the console script beside python
EXIT_WITHIN_S = 10  # a failed load must end the process this fast (start-up included)
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}


def serve(artifact: Path, *args: str, preexec_fn=None) -> subprocess.Popen:
    return subprocess.Popen(
        [INGOT, "serve", str(artifact), "--port", str(free_port()), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )


def exits(process: subprocess.Popen) -> tuple[float, str]:
    """Seconds until `process` exited on its own, and its stderr."""
    started = time.monotonic()
    try:
        _, err = process.communicate(timeout=EXIT_WITHIN_S * 3)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return time.monotonic() - started, err


def test_a_kv_cache_too_small_exits_naming_the_flag(artifact):
    # 2 layers x 2 KV heads x head_dim 16, fp32, K and V: 512 bytes a token, 64 KiB a sequence.
    elapsed, err = exits(serve(artifact, "--kv-cache-memory", "32KiB"))
    assert err.splitlines()[-1] == (
        "error: --kv-cache-memory 32KiB holds 64 tokens; one sequence of max_seq_len 128 "
        "needs 64 KiB (raise --kv-cache-memory)"
    )
    assert "Traceback" not in err and "kv_cache_bytes" not in err
    assert elapsed < EXIT_WITHIN_S


def test_a_load_failure_prints_its_error_without_uvicorn_lines(artifact):
    """uvicorn announced itself (started, running on ..., shutting down, finished) around the
    error line of a server that never served: its lines wait for the model, and go."""
    process = serve(artifact, "--kv-cache-memory", "32KiB")
    _, err = exits(process)
    assert process.returncode == 1
    assert err.splitlines()[-1].startswith("error: --kv-cache-memory 32KiB holds")
    for chatter in ("Uvicorn running", "Started server", "startup", "Shutting down", "Finished"):
        assert chatter not in err, err
    assert "loading the model failed" not in err  # the error line says it


def _limit_address_space() -> None:  # in the child, before exec: `ulimit -v 6000000`
    resource.setrlimit(resource.RLIMIT_AS, (6 * 10**9, 6 * 10**9))


def test_a_kv_cache_beyond_the_memory_limit_exits_naming_the_flag(artifact):
    process = serve(artifact, "--kv-cache-memory", "100GiB", preexec_fn=_limit_address_space)
    elapsed, err = exits(process)
    assert process.returncode == 1, err
    assert err.splitlines()[-1] == (
        "error: --kv-cache-memory 100GiB: cannot allocate the KV cache, more memory than this "
        "process may use (lower --kv-cache-memory)"
    )
    assert "Traceback" not in err and "MemoryError" not in err
    assert elapsed < EXIT_WITHIN_S


def test_an_artifact_that_does_not_verify_exits(artifact, tmp_path):
    tampered = tmp_path / "art"
    shutil.copytree(artifact, tampered)
    (tampered / "config.json").write_text("{}")
    process = serve(tampered)
    elapsed, err = exits(process)
    assert process.returncode == 1
    assert f"error: refusing to serve {tampered}: " in err  # then one line per problem
    assert "config.json: size mismatch" in err.splitlines()[-1]
    assert elapsed < EXIT_WITHIN_S


@pytest.fixture(scope="module")
def untemplated(artifact, tmp_path_factory) -> Path:
    """The tiny artifact as a checkpoint without a chat template would build it."""
    root = tmp_path_factory.mktemp("untemplated") / "art"
    shutil.copytree(artifact, root)
    (root / "chat_template.jinja").unlink()
    fields = json.loads((root / "manifest.json").read_text())
    del fields["files"]
    fields["tokenizer"]["chat_template"] = None
    write_manifest(root, fields)
    return root


def test_without_a_template_chat_is_a_400(untemplated):
    with LiveServer(artifact_llm(untemplated)) as server:
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 400
    assert "--chat-template" in r.json()["error"]["message"]


def test_chat_template_flag_serves_chat_and_auto_kv_cache_is_printed(untemplated, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text(CHAT_TEMPLATE)
    port = free_port()
    process = subprocess.Popen(
        [INGOT, "serve", str(untemplated), "--port", str(port), "--chat-template", str(template)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base)
        r = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=30)
        tokens = httpx.post(f"{base}/tokenize", json={"messages": CHAT["messages"]}, timeout=30)
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    assert tokens.json()["count"] > 0
    assert process.returncode == 0, output
    # The default, auto: 64 sequences of 128 tokens at 512 bytes each (plenty of memory here).
    kv_line = next(line for line in output.splitlines() if "KV cache:" in line)
    assert "= 8192 tokens (4 MiB, 512 bytes/token, fp32); auto: 0.5 of" in kv_line


@pytest.mark.parametrize(
    ("content", "message"),
    [("{% for %}", "chat template does not parse"), (b"\xff\xfe", "not UTF-8 text")],
)
def test_a_bad_chat_template_file_is_refused_before_loading(artifact, tmp_path, content, message):
    template = tmp_path / "t.jinja"
    template.write_bytes(content if isinstance(content, bytes) else content.encode())
    process = serve(artifact, "--chat-template", str(template))
    _, err = exits(process)
    assert process.returncode == 1
    assert err.splitlines()[-1].startswith(f"error: --chat-template {template}: ")
    assert message in err


def test_a_missing_chat_template_file_is_a_usage_error(artifact, tmp_path):
    process = serve(artifact, "--chat-template", str(tmp_path / "missing.jinja"))
    _, err = exits(process)
    assert process.returncode == 2 and "does not exist" in err
