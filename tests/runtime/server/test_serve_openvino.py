"""`ingot serve --engine openvino` as a real process answers a completion with the tokens the
onnxruntime engine gives (greedy, both exact), and its metrics count them; an engine the
artifact does not have is refused before the server starts, naming the ones it has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from ingot.runtime import LoadedModel, SamplingParams

from server_support import free_port, wait_healthy

INGOT = str(Path(sys.executable).parent / "ingot")  # the console script beside python
BODY = {"prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0, "ignore_eos": True}


def test_serve_with_the_openvino_engine(openvino_artifact):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [INGOT, "serve", str(openvino_artifact), "--port", str(port), "--engine", "openvino",
         "--kv-cache-memory", "8MiB", "--served-model-name", "served"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        wait_healthy(base)
        response = httpx.post(f"{base}/v1/completions", json={**BODY, "model": "served"})
        metrics = httpx.get(f"{base}/metrics").text
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    assert response.status_code == 200, response.text
    assert "engine openvino-cpu (openvino on cpu) selected" in output
    text = response.json()["choices"][0]["text"]
    model = LoadedModel.load(openvino_artifact, engine="onnxruntime")
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    assert text == model.generator().generate([BODY["prompt"]], params)[0].text
    assert 'vllm:generation_tokens_total{model_name="served"} 12.0' in metrics


def test_serve_refuses_an_engine_the_artifact_lacks(openvino_artifact):
    result = subprocess.run(
        [INGOT, "serve", str(openvino_artifact), "--engine", "tensorrt"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "--engine: engine 'tensorrt'" in result.stderr
    assert "onnxruntime-cpu (onnxruntime), openvino-cpu (openvino)" in result.stderr
