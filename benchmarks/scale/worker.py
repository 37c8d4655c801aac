"""One measured job of benchmarks/scale/scale.py, in a fresh process: `python -m
benchmarks.scale.worker SPEC RESULT` with spec {"kind": "build" | "decode" | "ortgenai-decode",
...}.

build: `ingot.pipeline.build.build`, which reports each stage's peak resident memory itself
(`ingot.pipeline.stage_memory`: the kernel's high-water mark, reset at each stage's start after
the freed heap goes back to the OS).
decode: batch-1 greedy decode of an ingot artifact; ortgenai-decode: the same with
onnxruntime-genai (run by the peer's interpreter).
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import worker_main


def build(spec: dict[str, Any]) -> dict[str, Any]:
    from ingot.pipeline.build import build as ingot_build
    from ingot.pipeline.cache import StageCache

    started = time.perf_counter()
    result = ingot_build(spec["recipe"], spec["out"], cache=StageCache(Path(spec["cache"])))
    artifact = Path(result.artifact)
    size = sum(f.stat().st_size for f in artifact.rglob("*") if f.is_file())
    return {
        "seconds": time.perf_counter() - started,
        # each stage's peak RSS as the build measured it (ingot.pipeline.stage_memory)
        "stages": {
            run.stage: {"seconds": run.seconds, "peak_rss_bytes": run.peak_rss_bytes}
            for run in result.stages
        },
        # The build resets the process's high-water mark at each stage (stage_memory.py), so
        # ru_maxrss alone is the last stage's peak: the whole build's is the largest of them.
        "max_rss_bytes": max(
            [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]
            + [run.peak_rss_bytes or 0 for run in result.stages]
        ),
        "artifact_bytes": size,
    }


def decode(spec: dict[str, Any]) -> dict[str, Any]:
    from ingot.runtime import LoadedModel, SamplingParams

    started = time.perf_counter()
    model = LoadedModel.load(spec["artifact"], kv_cache_bytes=512 << 20, max_num_seqs=1)
    generator = model.generator()
    load_seconds = time.perf_counter() - started
    params = SamplingParams(max_tokens=spec["tokens"], temperature=0.0, ignore_eos=True)
    times = []
    request = generator.add(spec["prompt_ids"], params)
    while generator.has_unfinished():
        t = time.perf_counter()
        generator.step()
        times.append(time.perf_counter() - t)
    generator.pop_completion(request)
    decode_times = times[1:]  # the first step is the prefill
    return {
        "load_seconds": load_seconds,
        "prefill_seconds": times[0],
        "decode_tok_s": len(decode_times) / sum(decode_times),
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def ortgenai_decode(spec: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime_genai as og

    started = time.perf_counter()
    model = og.Model(spec["model_dir"])
    load_seconds = time.perf_counter() - started
    params = og.GeneratorParams(model)
    total = len(spec["prompt_ids"]) + spec["tokens"]
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    generator = og.Generator(model, params)
    t = time.perf_counter()
    generator.append_tokens(spec["prompt_ids"])  # the prefill
    prefill_seconds = time.perf_counter() - t
    times = []
    while not generator.is_done():
        t = time.perf_counter()
        generator.generate_next_token()
        times.append(time.perf_counter() - t)
    return {
        "load_seconds": load_seconds,
        "prefill_seconds": prefill_seconds,
        "decode_tok_s": len(times) / sum(times),
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


KINDS = {"build": build, "decode": decode, "ortgenai-decode": ortgenai_decode}


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    return KINDS[spec["kind"]](spec)


if __name__ == "__main__":
    worker_main(run_spec)
