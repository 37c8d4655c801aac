"""In-process baselines of the serve benchmark, one engine per process (run as a worker,
harness.launch).

    python -m benchmarks.serve.engines SPEC.json RESULT.json

- ingot-batch1: the ingot Generator, one request at a time (no HTTP).
- ingot-offline: the ingot Generator with all requests added at once (continuous batching,
  no HTTP): the engine's ceiling, which the server's numbers can be read against.
- transformers-static: `generate` on fp32 weights, batches of the same requests left-padded to
  the longest prompt, every request in a batch starting and ending with it.
- ortgenai-static / ortgenai-batch1: onnxruntime-genai's Generator on its int4 model builder
  output, one static batch of all requests (padded) / one request at a time.
- ovgenai-continuous: OpenVINO GenAI's ContinuousBatchingPipeline on optimum-intel's int4
  export, all requests added at once (the decode benchmark's runner, decode/ovgenai.py): it
  ships no HTTP server (OpenVINO Model Server is not on PyPI), so this is its in-process ceiling.

Every request generates exactly `output_len` tokens (EOS ignored), greedy. The onnxruntime-genai
engines run under that peer's interpreter, so this module imports nothing of ingot, torch or
onnxruntime-genai at module level: each engine imports its library when it loads.
"""

from __future__ import annotations

import collections
import json
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import worker_main
from benchmarks.harness.machine import memory_status
from benchmarks.serve.workload import RequestTiming, summarize

Run = Callable[[list[list[int]], int], list[RequestTiming]]


def ingot_batch1(spec: dict) -> Run:
    generator = _ingot_generator(spec)

    def run(prompts: list[list[int]], n: int) -> list[RequestTiming]:
        return [_ingot_run(generator, [p], n)[0] for p in prompts]

    return run


def ingot_offline(spec: dict) -> Run:
    generator = _ingot_generator(spec)
    return lambda prompts, n: _ingot_run(generator, prompts, n)


def _ingot_generator(spec: dict):
    from ingot.runtime import LoadedModel

    model = LoadedModel.load(
        spec["artifact"],
        kv_cache_bytes=spec["kv_cache_bytes"],
        max_num_seqs=spec["max_num_seqs"],
        engine=spec.get("engine"),  # the artifact's engine by name or kind; None: its order
    )
    return model.generator()


def _ingot_run(generator, prompts: list[list[int]], n: int) -> list[RequestTiming]:
    from ingot.runtime.timed import timed_greedy

    start, sequences = timed_greedy(generator, prompts, n)
    return [
        RequestTiming(len(p), start, times, n)
        for p, (_, times) in zip(prompts, sequences, strict=True)
    ]


def transformers_static(spec: dict) -> Run:
    import torch
    import transformers
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(spec["threads"])
    model = transformers.LlamaForCausalLM.from_pretrained(spec["hf_dir"], dtype=torch.float32)
    model.eval()
    pad = model.config.eos_token_id

    class Stamps(BaseStreamer):
        """generate() calls put() once with the prompts, then once per new token (batch)."""

        def __init__(self) -> None:
            self.calls, self.times = 0, []

        def put(self, value) -> None:
            if self.calls:
                self.times.append(time.perf_counter())
            self.calls += 1

        def end(self) -> None:
            pass

    def run(prompts: list[list[int]], n: int) -> list[RequestTiming]:
        timings = []
        for i in range(0, len(prompts), spec["batch_size"]):
            batch = prompts[i : i + spec["batch_size"]]
            longest = max(map(len, batch))
            ids = torch.full((len(batch), longest), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, p in enumerate(batch):  # left padding: every prompt ends at the same column
                ids[row, longest - len(p) :] = torch.tensor(p)
                mask[row, longest - len(p) :] = 1
            stamps = Stamps()
            start = time.perf_counter()
            with torch.inference_mode():
                model.generate(
                    ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    pad_token_id=pad,
                    streamer=stamps,
                )
            timings += [RequestTiming(len(p), start, list(stamps.times), n) for p in batch]
        return timings

    return run


def ortgenai_static(spec: dict) -> Run:
    model, pad = _ortgenai_model(spec), spec["pad_id"]
    return lambda prompts, n: _ortgenai_run(model, prompts, n, pad)


def ortgenai_batch1(spec: dict) -> Run:
    model, pad = _ortgenai_model(spec), spec["pad_id"]
    return lambda prompts, n: [_ortgenai_run(model, [p], n, pad)[0] for p in prompts]


def _ortgenai_model(spec: dict):
    import onnxruntime_genai as og

    return og.Model(spec["ortgenai_dir"])


def _ortgenai_run(model, prompts: list[list[int]], n: int, pad: int) -> list[RequestTiming]:
    import numpy as np
    import onnxruntime_genai as og

    longest = max(map(len, prompts))
    ids = np.full((len(prompts), longest), pad, dtype=np.int32)
    for row, p in enumerate(prompts):  # left padding, as the genai tokenizer pads batches
        ids[row, longest - len(p) :] = p
    params = og.GeneratorParams(model)
    total = longest + n
    params.set_search_options(
        max_length=total, min_length=total, do_sample=False, batch_size=len(prompts)
    )
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(ids)
    times = []
    while not generator.is_done():
        generator.generate_next_token()
        times.append(time.perf_counter())
    return [RequestTiming(len(p), start, list(times), len(times)) for p in prompts]


def ovgenai_continuous(spec: dict) -> Run:
    from benchmarks.decode.ovgenai import load_openvino_genai

    ctx = max(map(len, spec["prompts"])) + spec["output_len"]
    batched = sum(map(len, spec["prompts"]))  # every prompt prefilled in one step, as in ingot
    runner = load_openvino_genai(
        spec["model_dir"],
        spec["threads"],
        batch=len(spec["prompts"]),
        batched_tokens=batched,
        ctx_per_seq=ctx,
        kv_bytes_per_token=spec["kv_bytes_per_token"],
    )

    def run(prompts: list[list[int]], n: int) -> list[RequestTiming]:
        start, seqs = runner(prompts, n)
        return [
            RequestTiming(len(p), start, times, len(tokens))
            for p, (tokens, times) in zip(prompts, seqs, strict=True)
        ]

    return run


def op_profile(spec: dict) -> dict[str, Any]:
    """Where one decode step of `batch` sequences goes, op by op (ONNX Runtime's profiler)."""
    from ingot.runtime import LoadedModel
    from ingot.runtime.batch import build_inputs

    # The profile is read below and deleted: it must not litter the working directory.
    prefix = str(Path(tempfile.gettempdir()) / "ingot_serve_profile")
    model = LoadedModel.load(
        spec["artifact"], kv_cache_bytes=spec["kv_cache_bytes"], profile_file_prefix=prefix
    )
    seqs = []
    for prompt in spec["prompts"][: spec["batch"]]:
        table = model.pool.new_block_table()
        table.slots_for(len(prompt))  # as if prefilled: decode the token at the last position
        seqs.append((table, [prompt[-1]], len(prompt) - 1))
    batch = build_inputs(seqs, scratch_block=model.session.scratch_block)
    warmup, runs = 3, 10
    for _ in range(warmup):
        model.session.run(batch)
    started = time.perf_counter()
    for _ in range(runs):
        model.session.run(batch)
    step_s = (time.perf_counter() - started) / runs
    profile = Path(model.session.end_profiling())
    events = json.loads(profile.read_text())
    profile.unlink()
    by_op: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
    total = sum(by_op.values())
    ops = {
        op: {"share": us / total, "ms_per_step": us / (runs + warmup) / 1000}
        for op, us in by_op.most_common(8)
    }
    return {"ok": True, "batch": len(seqs), "step_s": step_s, "ops": ops}


ENGINES: dict[str, Callable[[dict], Run]] = {
    "ingot-batch1": ingot_batch1,
    "ingot-offline": ingot_offline,
    "transformers-static": transformers_static,
    "ortgenai-static": ortgenai_static,
    "ortgenai-batch1": ortgenai_batch1,
    "ovgenai-continuous": ovgenai_continuous,
}


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["engine"] == "op-profile":
        try:
            return op_profile(spec)
        except Exception as e:  # noqa: BLE001 - an extra; its failure is only recorded
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    try:
        started = time.perf_counter()
        run = ENGINES[spec["engine"]](spec)
        load_s = time.perf_counter() - started
        prompts, n = spec["prompts"], spec["output_len"]
        run(prompts[:1], min(8, n))  # warm-up: page in weights, initialize kernels
        timings = run(prompts, n)
        result = {"ok": True, "load_s": load_s, **summarize(timings)}
        result["timings"] = [t.to_json() for t in timings]
    except Exception as e:  # recorded in the report, never dropped
        text = "".join(traceback.format_exception(e)).strip().splitlines()
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": text[-12:]}
    return result | memory_status()


if __name__ == "__main__":
    worker_main(run_spec)
