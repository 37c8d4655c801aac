"""One engine's whole generate calls, timed from outside, in a fresh process (harness.launch):

    python -m benchmarks.decode.whole_call_worker SPEC.json RESULT.json

The independent check of the decode benchmark (whole_call.py): no per-token timestamps, no
shared timing code with engines.py. Each call is what a user's program waits for: ingot's
`LLM.generate` (tokenized prompt ids in, RequestOutput back), onnxruntime-genai's own Python
loop (GeneratorParams, Generator, append_tokens, generate_next_token until done). The tokens a
call returned are counted, not assumed. Imports only the standard library at the top; each
engine imports its library when it loads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness.launch import worker_main
from benchmarks.harness.machine import memory_status

__all__ = ["run_spec"]

# (prompt ids, new tokens, ignore EOS) -> the new token ids
Call = Callable[[list[int], int, bool], list[int]]


def ingot_call(artifact: str) -> Call:
    from ingot import LLM, SamplingParams

    llm = LLM(artifact, max_num_seqs=1, enable_prefix_caching=False)

    def call(prompt: list[int], n: int, ignore_eos: bool) -> list[int]:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=ignore_eos)
        out = llm.generate([{"prompt_token_ids": prompt}], params)
        return list(out[0].outputs[0].token_ids)

    return call


def ortgenai_call(model_dir: str) -> Call:
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(model_dir)

    def call(prompt: list[int], n: int, ignore_eos: bool) -> list[int]:
        params = og.GeneratorParams(model)
        total = len(prompt) + n
        # min_length = max_length: its way to ignore EOS (the decode benchmark's setting).
        params.set_search_options(
            max_length=total, min_length=total if ignore_eos else 0, do_sample=False
        )
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([prompt], dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return generator.get_sequence(0)[len(prompt) :].tolist()

    return call


ENGINES: dict[str, Callable[[str], Call]] = {
    "ingot": ingot_call,
    "onnxruntime-genai": ortgenai_call,
}


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: engine, path, prompt, tokens, calls, ignore_eos. One untimed call first."""
    started = time.perf_counter()
    call = ENGINES[spec["engine"]](spec["path"])
    load_s = time.perf_counter() - started
    prompt, n, ignore_eos = spec["prompt"], spec["tokens"], spec["ignore_eos"]
    call(prompt, n, ignore_eos)  # warm-up
    seconds, counts = [], []
    for _ in range(spec["calls"]):
        started = time.perf_counter()
        tokens = call(prompt, n, ignore_eos)
        seconds.append(time.perf_counter() - started)
        counts.append(len(tokens))
    return {
        "ok": True,
        "load_s": load_s,
        "call_s": seconds,
        "tokens": counts,
        "first_tokens": tokens[:16],
    } | memory_status()


if __name__ == "__main__":
    worker_main(run_spec)
