"""`LLM("oci://…")` and `ingot serve oci://…` pull (or reuse the store), then load."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from ingot.artifacts.oci import push
from ingot.artifacts.registry_client import Retry
from ingot.artifacts.signing import sign_artifact
from ingot.cli import main

pytestmark = pytest.mark.registry
FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05, timeout=5.0)


def test_llm_loads_a_registry_reference(registry, artifact, tmp_path, monkeypatch):
    from ingot import LLM, SamplingParams

    monkeypatch.setenv("INGOT_STORE_DIR", str(tmp_path / "store"))
    pushed = push(artifact, registry.ref("serve/tiny:v1"), retry=FAST)
    llm = LLM(f"oci://{pushed.reference}")
    assert llm.model.root == tmp_path / "store" / "artifacts" / pushed.digest.removeprefix(
        "sha256:"
    )
    [out] = llm.generate(["def add"], SamplingParams(max_tokens=4, temperature=0))
    assert len(out.outputs[0].token_ids) == 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _complete(port: int, deadline: float) -> dict:
    body = json.dumps({"model": "tiny", "prompt": "def add", "max_tokens": 2}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, ConnectionError):  # not listening / not loaded yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_ingot_serve_pulls_verifies_and_serves(registry, artifact, keys, tmp_path):
    sign_artifact(artifact, keys["private"])
    pushed = push(artifact, registry.ref("serve/signed:v1"), retry=FAST)
    env = {**os.environ, "INGOT_STORE_DIR": str(tmp_path / "store")}
    cli = [sys.executable, "-c", "from ingot.cli import main; main()"]
    reference = f"oci://{pushed.reference}"

    wrong_key = ["serve", reference, "--verify-key", str(keys["other_public"])]
    refused = CliRunner().invoke(main, wrong_key, env={"INGOT_STORE_DIR": env["INGOT_STORE_DIR"]})
    assert refused.exit_code == 1 and "does not verify" in refused.output

    port = _free_port()
    server = subprocess.Popen(
        [*cli, "serve", reference, "--port", str(port), "--verify-key", str(keys["public"])],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        reply = _complete(port, time.monotonic() + 60)
        assert reply["choices"][0]["text"] is not None
    finally:
        server.terminate()
        server.wait(timeout=30)
