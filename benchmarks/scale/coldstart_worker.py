"""One cold start of benchmarks/scale/coldstart.py, in a fresh process: `python -m
benchmarks.scale.coldstart_worker SPEC RESULT` with spec {"kind": "ingot" | "llama-cpp" |
"ortgenai" | "ort-optimize", ...}.

Each start is timed from the process's first line: `import_s` (the engine's Python package),
`load_s` (the model opened: weights mapped or read, the session made), `first_token_s` (the
prompt's prefill and the first greedy token), then `decode_tok_s` over the next tokens and the
memory the process held: its peak resident set (VmHWM) and, at the end, its resident anonymous
memory (heap: copies) and resident file pages (mapped weights, shared with the page cache).

ingot: `LoadedModel.load` with the manifest read but not re-hashed (`verify: false`: what a
load from the verified store does by its stat check), the ONNX Runtime session options of
`session_config` added to the engine's (`session.disable_prepacking` ...).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import worker_main

STARTED = time.perf_counter()


def _memory() -> dict[str, int]:
    """VmHWM, RssAnon and RssFile of this process, in bytes (/proc/self/status)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return {
        "peak_rss_bytes": fields["VmHWM"],
        "rss_anon_bytes": fields["RssAnon"],
        "rss_file_bytes": fields["RssFile"],
    }


def _since(mark: float) -> float:
    return time.perf_counter() - mark


def _timings(imported: float, loaded: float, first: float, times: list[float]) -> dict[str, Any]:
    """One run's record: import, load, first token (s), decode tok/s, process age, memory."""
    return {
        "import_s": imported,
        "load_s": loaded,
        "first_token_s": first,
        "decode_tok_s": len(times) / sum(times),
        "process_s": _since(STARTED),
        **_memory(),
    }


def ingot(spec: dict[str, Any]) -> dict[str, Any]:
    mark = time.perf_counter()
    import ingot.runtime.model as model_module
    from ingot.artifacts import read_manifest
    from ingot.runtime import LoadedModel, SamplingParams
    from ingot.runtime.engines.onnxruntime import session as ort_session

    imported = _since(mark)
    if not spec["verify"]:
        model_module.verify_artifact = read_manifest  # the store's trusted load (docstring)
    extra = spec.get("session_config", {})
    if extra:
        recorded = ort_session.engine_session_options

        def with_extra(options: dict[str, Any]):
            made = recorded(options)
            for key, value in extra.items():
                made.add_session_config_entry(key, value)
            return made

        ort_session.engine_session_options = with_extra
    mark = time.perf_counter()
    if spec.get("prefetch"):  # ask the kernel to read the engine files ahead, asynchronously
        for data in Path(spec["artifact"], "engines").rglob("*.data"):
            with open(data, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
    model = LoadedModel.load(
        spec["artifact"], kv_cache_bytes=spec["kv_cache_bytes"], max_num_seqs=1
    )
    loaded = _since(mark)
    generator = model.generator()
    params = SamplingParams(max_tokens=spec["tokens"], temperature=0.0, ignore_eos=True)
    request = generator.add(spec["prompt_ids"], params)
    mark = time.perf_counter()
    generator.step()  # the prefill and the first token
    first = _since(mark)
    times = []
    while generator.has_unfinished():
        mark = time.perf_counter()
        generator.step()
        times.append(_since(mark))
    generator.pop_completion(request)
    pool_bytes = sum(a.nbytes for a in (*model.pool.k, *model.pool.v))
    return {**_timings(imported, loaded, first, times), "kv_pool_bytes": pool_bytes}


def llama_cpp(spec: dict[str, Any]) -> dict[str, Any]:
    mark = time.perf_counter()
    from llama_cpp import Llama

    imported = _since(mark)
    mark = time.perf_counter()
    llm = Llama(
        model_path=spec["gguf"],
        n_ctx=spec["n_ctx"],
        n_threads=spec["threads"],
        n_batch=512,
        use_mmap=True,
        verbose=False,
    )
    loaded = _since(mark)
    tokens = llm.generate(spec["prompt_ids"], top_k=1, temp=0.0, reset=True)
    mark = time.perf_counter()
    next(tokens)  # the prefill and the first token
    first = _since(mark)
    times = []
    for _ in range(spec["tokens"] - 1):
        mark = time.perf_counter()
        next(tokens)
        times.append(_since(mark))
    return _timings(imported, loaded, first, times)


def ortgenai(spec: dict[str, Any]) -> dict[str, Any]:
    mark = time.perf_counter()
    import onnxruntime_genai as og

    imported = _since(mark)
    mark = time.perf_counter()
    model = og.Model(spec["model_dir"])
    loaded = _since(mark)
    params = og.GeneratorParams(model)
    total = len(spec["prompt_ids"]) + spec["tokens"]
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    generator = og.Generator(model, params)
    mark = time.perf_counter()
    generator.append_tokens(spec["prompt_ids"])  # the prefill and the first token
    first = _since(mark)
    times = []
    while not generator.is_done():
        mark = time.perf_counter()
        generator.generate_next_token()
        times.append(_since(mark))
    return _timings(imported, loaded, first, times)


def ort_optimize(spec: dict[str, Any]) -> dict[str, Any]:
    """The alternative to shipping the optimized graph: the portable graph optimized at a
    pod's first start (what the engine build does), written to a local cache directory."""
    from ingot.pipeline.engines.onnxruntime import build_onnxruntime_engine

    mark = time.perf_counter()
    build_onnxruntime_engine(
        Path(spec["graph"]),
        Path(spec["out"]),
        optimization_level=spec["level"],
        intra_op_num_threads=spec["threads"],
        matmul_accuracy_level=spec["matmul_accuracy_level"],
    )
    return {"optimize_s": _since(mark), **_memory()}


KINDS = {"ingot": ingot, "llama-cpp": llama_cpp, "ortgenai": ortgenai, "ort-optimize": ort_optimize}


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    return KINDS[spec["kind"]](spec)


if __name__ == "__main__":
    worker_main(run_spec)
