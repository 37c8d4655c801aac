"""Timed greedy decoding on each engine, one engine per process (run as a worker script).

    python benchmarks/decode_engines.py SPEC.json RESULT.json

A fresh process per (model, engine) keeps the peak RSS of one engine from leaking into the
next and lets the parent survive an engine that crashes or runs out of memory. Each runner
returns the token ids and a timestamp per token, so the prefill (time to first token) and
the decode steps are timed apart.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from machine import memory_status

__all__ = ["ENGINES", "run_spec", "summarize_runs"]

# (prompt ids, new tokens) -> (output ids, start time, one timestamp per output token)
Runner = Callable[[Sequence[int], int], tuple[list[int], float, list[float]]]


def load_transformers(path: str, threads: int, **_: Any) -> Runner:
    import torch
    import transformers
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(threads)
    model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    class Stamps(BaseStreamer):
        """generate() calls put() once with the prompt, then once per new token."""

        def __init__(self) -> None:
            self.seen_prompt = False
            self.times: list[float] = []

        def put(self, value) -> None:
            if self.seen_prompt:
                self.times.append(time.perf_counter())
            self.seen_prompt = True

        def end(self) -> None:
            pass

    def run(prompt: Sequence[int], n: int) -> tuple[list[int], float, list[float]]:
        ids = torch.tensor([list(prompt)])
        stamps = Stamps()
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,  # suppresses EOS: the fixed-length way to ignore it
            pad_token_id=model.config.eos_token_id,
            streamer=stamps,
        )
        return out[0, ids.shape[1] :].tolist(), start, stamps.times

    return run


def load_ir(path: str, threads: int, **_: Any) -> Runner:
    import torch

    from ingot.pipeline.model.load import load_model

    torch.set_num_threads(threads)
    model = load_model(path)

    @torch.inference_mode()
    def run(prompt: Sequence[int], n: int) -> tuple[list[int], float, list[float]]:
        # LlamaModel.generate_greedy (contiguous KV cache, EOS ignored), with a timestamp per token.
        start = time.perf_counter()
        logits, _, cache = model(torch.tensor([list(prompt)]))
        tokens, times = [], []
        for step in range(n):
            tokens.append(int(logits[0, -1].argmax()))
            times.append(time.perf_counter())
            if step + 1 < n:
                logits, _, cache = model(torch.tensor([[tokens[-1]]]), cache=cache)
        return tokens, start, times

    return run


def load_ingot_runtime(artifact: str, engine_file: str | None = None, **_: Any) -> Runner:
    from ingot.runtime import LoadedModel, SamplingParams

    loaded = LoadedModel.load(artifact)
    if engine_file is not None:
        # What-if: the same artifact (pool, tokenizer, interface) over another engine file.
        # The artifact's own session is dropped first, but it counts in the peak RSS.
        from ingot.runtime.session import EngineSession

        options = loaded.engine.session_options
        loaded.session = None
        loaded.session = EngineSession(engine_file, loaded.pool, options)
    generator = loaded.generator()

    def run(prompt: Sequence[int], n: int) -> tuple[list[int], float, list[float]]:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        request = generator.add(list(prompt), params)
        times = []
        while generator.has_unfinished():
            generator.step()  # one engine call; batch 1, so exactly one new token
            times.append(time.perf_counter())
        return generator.pop_completion(request).token_ids, start, times

    return run


ENGINES: dict[str, Callable[..., Runner]] = {
    "transformers-fp32": load_transformers,
    "ir-fp32": load_ir,
    "ingot-ort": load_ingot_runtime,
}


def summarize_runs(runs: list[dict[str, float]]) -> dict[str, float]:
    """Medians over the timed runs."""
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "ttft_s": statistics.median(r["ttft_s"] for r in runs),
        "decode_s": statistics.median(r["decode_s"] for r in runs),
    }


def _timed_run(runner: Runner, prompt: Sequence[int], n: int) -> tuple[list[int], dict]:
    tokens, start, times = runner(prompt, n)
    if len(tokens) != n or len(times) != n:
        raise RuntimeError(f"asked for {n} tokens, got {len(tokens)} ({len(times)} timestamps)")
    decode_s = times[-1] - times[0]  # n - 1 decode steps after the prefill's first token
    return tokens, {
        "ttft_s": times[0] - start,
        "decode_s": decode_s,
        "decode_tokens": n - 1,
        "tokens_per_s": (n - 1) / decode_s,
    }


def run_decode(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    runner = ENGINES[spec["engine"]](**spec["load"])
    load_s = time.perf_counter() - started
    prompt = spec["prompt_ids"]
    # Warm-up: pages in every weight (each step reads all of them), warms the allocators.
    _, warmup = _timed_run(runner, prompt, spec["warmup_tokens"])
    runs_n, tokens_n, reduced = _fit_budget(spec, warmup["tokens_per_s"])
    runs, tokens = [], []
    for _ in range(runs_n):
        tokens, run = _timed_run(runner, prompt, tokens_n)
        runs.append(run)
    result = {"load_s": load_s, "warmup": warmup, "runs": runs, "tokens": tokens}
    return result | summarize_runs(runs) | {"reduced": reduced}


def _fit_budget(spec: dict[str, Any], rate: float) -> tuple[int, int, dict | None]:
    """Runs and tokens per run that fit the case's time budget at the warm-up's rate.

    An engine too slow for the full protocol gets one shorter run, flagged in the report,
    rather than a timeout that would leave no number at all.
    """
    runs, tokens, budget = spec["runs"], spec["tokens"], spec["budget_s"]
    if runs * (tokens - 1) / rate <= budget:
        return runs, tokens, None
    short = max(spec["warmup_tokens"], min(tokens, int(spec["reduced_budget_s"] * rate) + 1))
    reason = (
        f"warm-up decoded {rate:.2f} tok/s: {runs} x {tokens} tokens would take "
        f"{runs * (tokens - 1) / rate:.0f} s > budget {budget:.0f} s"
    )
    return 1, short, {"runs": 1, "tokens": short, "reason": reason}


def run_build(spec: dict[str, Any]) -> dict[str, Any]:
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    started = time.perf_counter()
    result = build(spec["recipe"], spec["out"], cache=StageCache(Path(spec["cache"])))
    return {"seconds": time.perf_counter() - started, **result.to_json()}


def run_engine_build(spec: dict[str, Any]) -> dict[str, Any]:
    """An ORT engine for an exported graph, outside any artifact (the what-if rows)."""
    from ingot.pipeline.engines.onnxruntime import build_onnxruntime_engine

    out = Path(spec["out"])
    started = time.perf_counter()
    cached = (out / "engine.json").is_file()
    if not cached:
        record = build_onnxruntime_engine(
            Path(spec["onnx"]),
            out,
            optimization_level=spec["optimization_level"],
            intra_op_num_threads=spec["intra_op_num_threads"],
            matmul_accuracy_level=spec["matmul_accuracy_level"],
        )
        (out / "engine.json").write_text(json.dumps(record, indent=2))  # written last: complete
    return {
        "engine_file": str(out / "model.onnx"),
        "cached": cached,
        "seconds": time.perf_counter() - started,
        "record": json.loads((out / "engine.json").read_text()),
    }


_KINDS = {"decode": run_decode, "build": run_build, "engine": run_engine_build}


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        result = _KINDS[spec["kind"]](spec)
        result["ok"] = True
    except Exception as e:  # recorded in the report, never dropped
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": _tail(e)}
    return result | memory_status()


def _tail(e: BaseException, lines: int = 12) -> str:
    text = "".join(traceback.format_exception(e)).strip()
    return "\n".join(text.splitlines()[-lines:])


if __name__ == "__main__":
    spec_file, result_file = sys.argv[1:3]
    outcome = run_spec(json.loads(Path(spec_file).read_text()))
    Path(result_file).write_text(json.dumps(outcome))
