"""OpenVINO GenAI as a decode-benchmark engine (`openvino-genai`), run in its own virtualenv
(`benchmarks/peers/setup.sh openvino-genai`) on its own export of the checkpoint
(peers.export_openvino_genai).

One sequence runs through `LLMPipeline`, several through `ContinuousBatchingPipeline`, as a
user of either would; both with the plugin's defaults on this CPU (bf16 inference, u8 KV, int8
dynamic quantization of activations in groups of 32), `INFERENCE_NUM_THREADS` threads and
prefix caching off (repeated runs of one prompt must prefill it again). Token ids go in, and
each token's time is when the pipeline handed it out: LLMPipeline's streamer (`write` gets
token ids), or the continuous-batching step after which a request's handle had it.

Imports only the standard library at the top: this file is imported by engines.py under every
engine's interpreter; openvino_genai exists only in its own virtualenv.
"""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = ["load_openvino_genai"]

_GIB = 1 << 30
# Per-token KV bytes of the cache the plugin keeps (u8 K and V; scale and zero point rows per
# block add a little): the cache is sized from them, in whole GB (SchedulerConfig.cache_size).
_KV_HEADROOM = 1.25


def load_openvino_genai(
    model_dir: str,
    threads: int,
    batch: int,
    batched_tokens: int,
    ctx_per_seq: int,
    kv_bytes_per_token: int,
    **_: Any,
):
    """A Runner (engines.Runner) over OpenVINO GenAI's pipeline for `batch` sequences of up to
    `ctx_per_seq` tokens, `batched_tokens` of prompts at once."""
    import openvino_genai as og

    scheduler = og.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    needed = batch * ctx_per_seq * kv_bytes_per_token * _KV_HEADROOM
    scheduler.cache_size = max(1, math.ceil(needed / _GIB))
    # Every prompt of the batch prefilled in one step, as the other engines do (LLMPipeline's
    # own default puts no limit on a step's tokens).
    scheduler.max_num_batched_tokens = max(scheduler.max_num_batched_tokens, batched_tokens)
    properties = {"INFERENCE_NUM_THREADS": threads}
    if batch == 1:
        pipe = og.LLMPipeline(model_dir, "CPU", scheduler_config=scheduler, **properties)
        run = _pipeline_runner(og, pipe)
    else:
        scheduler.max_num_seqs = batch
        pipe = og.ContinuousBatchingPipeline(model_dir, scheduler, "CPU", properties)
        run = _continuous_runner(og, pipe)
    run.info = {  # type: ignore[attr-defined]
        "openvino_genai": og.__version__,
        "pipeline": type(pipe).__name__,
        "cache_size_gb": scheduler.cache_size,
        "properties": properties,
    }
    return run


def _config(og: Any, n: int) -> Any:
    """Greedy, exactly `n` new tokens (EOS ignored)."""
    return og.GenerationConfig(max_new_tokens=n, min_new_tokens=n, ignore_eos=True, do_sample=False)


def _pipeline_runner(og: Any, pipe: Any):
    import numpy as np
    import openvino as ov

    class Stamps(og.StreamerBase):
        """Each token id the pipeline streams, with the time it came."""

        def __init__(self) -> None:
            super().__init__()
            self.tokens: list[int] = []
            self.times: list[float] = []

        def write(self, token: int | list[int]) -> Any:
            ids = token if isinstance(token, list) else [token]
            now = time.perf_counter()
            self.tokens += ids
            self.times += [now] * len(ids)
            return og.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    def run(prompts: list[list[int]], n: int):
        if len(prompts) != 1:
            raise ValueError("LLMPipeline runs one sequence here")
        ids = ov.Tensor(np.array(prompts, dtype=np.int64))
        stamps = Stamps()
        start = time.perf_counter()
        pipe.generate(ids, _config(og, n), stamps)
        return start, [(stamps.tokens, stamps.times)]

    return run


def _continuous_runner(og: Any, pipe: Any):
    import numpy as np
    import openvino as ov

    def run(prompts: list[list[int]], n: int):
        config = _config(og, n)
        start = time.perf_counter()
        handles = [
            pipe.add_request(i, ov.Tensor(np.array([p], dtype=np.int64)), config)
            for i, p in enumerate(prompts)
        ]
        tokens: list[list[int]] = [[] for _ in prompts]
        times: list[list[float]] = [[] for _ in prompts]
        while pipe.has_non_finished_requests():
            pipe.step()
            now = time.perf_counter()
            for i, handle in enumerate(handles):
                if handle.can_read():
                    for output in handle.read().values():
                        tokens[i] += output.generated_ids
                        times[i] += [now] * len(output.generated_ids)
        return start, list(zip(tokens, times, strict=True))

    return run
