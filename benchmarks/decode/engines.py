"""One job of the decode benchmark in a fresh process (run as a worker, harness.launch).

    python -m benchmarks.decode.engines SPEC.json RESULT.json

Spec kinds: `build` (an ingot artifact from a recipe), `decode` (timed greedy decoding of a
batch of prompts on one engine), `context` (one engine at batch 1 after prompts of growing
length), `prefill` (ingot: batches of prompts against one packed sequence), `profile` (ingot:
one decode under ONNX Runtime's profiler, aggregated per op type).

A fresh process per job keeps the peak RSS of one engine from leaking into the next and lets
the parent survive an engine that crashes or runs out of memory. The peers' jobs run under the
peer's own interpreter (its virtualenv), so this file imports only the standard library and
the harness (numpy) at the top; each engine imports its library when it loads.

Engines (every one greedy, EOS ignored, a fixed number of new tokens per sequence):

- `ir-fp32`: ingot's PyTorch IR of the checkpoint in fp32, batch 1: the greedy reference.
- `ingot`: the artifact through ingot's public runtime API (`LoadedModel.load`, `Generator`):
  all the batch's prompts added to one Generator (in-flight batching), prefix caching off.
- `ingot-openvino`: the same, on the artifact's OpenVINO engine (the load's engine override).
- `onnxruntime-genai`: its Generator on its own model builder's output, one static batch.
- `openvino-genai`: its LLMPipeline (batch 1) or ContinuousBatchingPipeline on its own
  export (ovgenai.py).
- `llama.cpp`: llama-cpp-python's low-level API (`llama_decode` on a `llama_batch`) over the
  GGUF ingot exported: one sequence id per prompt, all decoded together.

Each engine returns, per sequence, its new token ids and a timestamp per token, so the prefill
(time to first token) and the decode steps are timed apart.
"""

from __future__ import annotations

import bisect
import json
import statistics
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.decode.ovgenai import load_openvino_genai
from benchmarks.harness.launch import worker_main
from benchmarks.harness.machine import memory_status

__all__ = [
    "ENGINES",
    "generator_runner",
    "llama_clear",
    "llama_open",
    "percentile",
    "pool_blocks",
    "run_metrics",
    "run_spec",
    "summarize_runs",
]

# One run: (start time, per sequence (new token ids, one timestamp per token)).
Trace = tuple[float, list[tuple[list[int], list[float]]]]
Runner = Callable[[list[list[int]], int], Trace]


def load_ir(path: str, threads: int, **_: Any) -> Runner:
    import torch

    from ingot.pipeline.model.load import load_model

    torch.set_num_threads(threads)
    model = load_model(path)

    @torch.inference_mode()
    def run(prompts: list[list[int]], n: int) -> Trace:
        if len(prompts) != 1:
            raise ValueError("the IR reference decodes one sequence at a time")
        # LlamaModel.generate_greedy (contiguous KV cache, EOS ignored), a timestamp per token.
        start = time.perf_counter()
        logits, _, cache = model(torch.tensor([prompts[0]]))
        tokens, times = [], []
        for step in range(n):
            tokens.append(int(logits[0, -1].argmax()))
            times.append(time.perf_counter())
            if step + 1 < n:
                logits, _, cache = model(torch.tensor([[tokens[-1]]]), cache=cache)
        return start, [(tokens, times)]

    return run


def open_ingot(
    artifact: str,
    batch: int,
    batched_tokens: int,
    profile_file_prefix: str | None = None,
    engine: str | None = None,
    ctx_per_seq: int | None = None,
):
    """A Generator over the artifact for `batch` sequences at once; `batched_tokens` is the
    step's token budget (big enough that every prompt of the batch is prefilled in one step).
    Prefix caching is off: repeated runs of one prompt must compute it again. `engine`: the
    artifact's engine by name or kind (None: the first this host runs, as `ingot serve`). The
    pool holds `batch`
    sequences of `ctx_per_seq` tokens (at least one of max_seq_len, as the runtime insists),
    or, without `ctx_per_seq`, is sized automatically."""
    from ingot.runtime import LoadedModel

    sizing: dict[str, Any] = {"kv_cache_bytes": None}  # auto: at most `batch` of max_seq_len
    if ctx_per_seq is not None:
        manifest = json.loads((Path(artifact) / "manifest.json").read_text())
        max_seq_len = manifest["model"]["max_seq_len"]
        blocks = pool_blocks(batch, ctx_per_seq, max_seq_len, manifest["graph"]["kv_block_size"])
        sizing = {"kv_cache_blocks": blocks}
    model = LoadedModel.load(
        artifact,
        max_num_seqs=batch,
        max_num_batched_tokens=max(2048, batched_tokens),
        enable_prefix_caching=False,
        profile_file_prefix=profile_file_prefix,
        engine=engine,
        **sizing,
    )
    return model, model.generator()


def pool_blocks(batch: int, ctx_per_seq: int, max_seq_len: int, block_size: int) -> int:
    """Blocks of a pool for `batch` sequences of `ctx_per_seq` tokens, at least one sequence of
    `max_seq_len` (LoadedModel.load insists on it), plus one spare."""
    per_seq = -(-ctx_per_seq // block_size)
    return max(batch * per_seq, -(-max_seq_len // block_size)) + 1


def load_ingot(
    artifact: str,
    batch: int,
    batched_tokens: int,
    engine: str | None = None,
    ctx_per_seq: int | None = None,
    **_: Any,
) -> Runner:
    model, generator = open_ingot(
        artifact, batch, batched_tokens, engine=engine, ctx_per_seq=ctx_per_seq
    )
    run = generator_runner(generator)
    run.info = {  # type: ignore[attr-defined]
        "engine": model.engine.name,
        "kv_blocks": model.pool.num_blocks,
        "kv_bytes": model.pool.nbytes,
    }
    return run


def generator_runner(generator: Any) -> Runner:
    """The Trace protocol over an ingot Generator (whatever engine runs under it): all prompts
    added at once, greedy, each token's time as the step that made it returned (the runtime's
    `timed_greedy`, which the sweep's speed runs use too)."""
    from ingot.runtime.timed import timed_greedy

    return lambda prompts, n: timed_greedy(generator, prompts, n)


def load_ortgenai(model_dir: str, **_: Any) -> Runner:
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(model_dir)

    def run(prompts: list[list[int]], n: int) -> Trace:
        lengths = {len(p) for p in prompts}
        if len(lengths) != 1:
            raise ValueError("a static batch here holds prompts of one length (no padding)")
        length = lengths.pop()
        params = og.GeneratorParams(model)
        total = length + n
        params.set_search_options(
            max_length=total, min_length=total, do_sample=False, batch_size=len(prompts)
        )
        generator = og.Generator(model, params)
        start = time.perf_counter()
        generator.append_tokens(np.array(prompts, dtype=np.int32))  # the prefill
        times = []
        while not generator.is_done():
            # The first call picks from the prefill's logits; each later one runs a step.
            generator.generate_next_token()
            times.append(time.perf_counter())
        outputs = [generator.get_sequence(s)[length:].tolist() for s in range(len(prompts))]
        return start, [(tokens, list(times)) for tokens in outputs]

    return run


def load_llama_cpp(
    gguf: str,
    threads: int,
    batch: int,
    batched_tokens: int,
    ctx_per_seq: int,
    kv_type: str | None = None,
    **_: Any,
) -> Runner:
    """llama.cpp through llama-cpp-python's ctypes API: one llama_batch for the prompts (the
    prefill), then one per step holding each sequence's last token. `kv_type`: the K and V
    cache's ggml type ("q8_0", ...; llama.cpp's default f16 when None)."""
    import llama_cpp as lib
    import numpy as np

    n_batch = max(batched_tokens, batch)
    model, ctx, params = llama_open(lib, gguf, threads, batch, n_batch, ctx_per_seq, kv_type)
    try:
        n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
    except AttributeError:
        n_vocab = lib.llama_n_vocab(model)
    clear = llama_clear(lib, ctx)
    lbatch = lib.llama_batch_init(n_batch, 0, 1)

    def decode(entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, position, sequence id, wants logits)."""
        lbatch.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            lbatch.token[i] = token
            lbatch.pos[i] = pos
            lbatch.n_seq_id[i] = 1
            lbatch.seq_id[i][0] = seq
            lbatch.logits[i] = logits
        code = lib.llama_decode(ctx, lbatch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def argmax(index: int) -> int:
        logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, index), shape=(n_vocab,))
        return int(logits.argmax())

    def run(prompts: list[list[int]], n: int) -> Trace:
        clear()
        start = time.perf_counter()
        entries, last = [], []
        for seq, prompt in enumerate(prompts):
            entries += [(t, pos, seq, pos == len(prompt) - 1) for pos, t in enumerate(prompt)]
            last.append(len(entries) - 1)
        decode(entries)
        tokens = [[argmax(i)] for i in last]
        now = time.perf_counter()
        times = [[now] for _ in prompts]
        for step in range(1, n):
            decode([(tokens[s][-1], len(p) + step - 1, s, True) for s, p in enumerate(prompts)])
            for s in range(len(prompts)):
                tokens[s].append(argmax(s))
            now = time.perf_counter()
            for s in range(len(prompts)):
                times[s].append(now)
        return start, list(zip(tokens, times, strict=True))

    run.info = _llama_info(lib, model) | {  # type: ignore[attr-defined]
        "n_ctx": lib.llama_n_ctx(ctx),
        "context_params": {
            name: int(getattr(params, name))
            for name in ("n_batch", "n_ubatch", "n_seq_max", "type_k", "type_v", "flash_attn_type")
            if hasattr(params, name)
        },
    }
    return run


def llama_open(
    lib: Any,
    gguf: str,
    threads: int,
    batch: int,
    n_batch: int,
    ctx_per_seq: int,
    kv_type: str | None = None,
    **context: Any,
) -> tuple[Any, Any, Any]:
    """The GGUF's model and a context for `batch` sequences of `ctx_per_seq` tokens each,
    `n_batch` tokens a call, on `threads` threads, K/V cached as `kv_type` (None: llama.cpp's
    default), with any other context parameter in `context` (kv_unified=True, ...): (model,
    context, its parameters)."""
    _try_call(lib, ("llama_backend_init",))
    model = _try_call(
        lib,
        ("llama_model_load_from_file", "llama_load_model_from_file"),
        gguf.encode(),
        lib.llama_model_default_params(),
    )
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf}")
    params = lib.llama_context_default_params()
    params.n_ctx = batch * ctx_per_seq  # llama.cpp splits it between the sequences
    params.n_batch = n_batch
    params.n_ubatch = min(512, n_batch)
    params.n_seq_max = batch
    params.n_threads = threads
    params.n_threads_batch = threads
    if kv_type is not None:  # a quantized V cache needs flash attention (auto enables it)
        params.type_k = params.type_v = getattr(lib, f"GGML_TYPE_{kv_type.upper()}")
    for name, value in context.items():
        setattr(params, name, value)
    ctx = _try_call(lib, ("llama_init_from_model", "llama_new_context_with_model"), model, params)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    return model, ctx, params


def _try_call(lib: Any, names: Sequence[str], *args: Any) -> Any:
    """The first of `names` this llama-cpp-python has, called (names change across releases)."""
    for name in names:
        function = getattr(lib, name, None)
        if function is not None:
            try:
                return function(*args)
            except AttributeError:  # declared in Python, missing from the shared library
                continue
    raise RuntimeError(f"llama-cpp-python has none of {', '.join(names)}")


def llama_clear(lib: Any, ctx: Any) -> Callable[[], None]:
    """Empties every sequence's KV cache (the call's name depends on the release)."""
    if hasattr(lib, "llama_memory_clear") and hasattr(lib, "llama_get_memory"):
        memory = lib.llama_get_memory(ctx)
        return lambda: lib.llama_memory_clear(memory, True)
    for name in ("llama_kv_self_clear", "llama_kv_cache_clear"):
        if hasattr(lib, name):
            return lambda: getattr(lib, name)(ctx)
    raise RuntimeError("llama-cpp-python has no call that clears the KV cache")


def _llama_info(lib: Any, model: Any) -> dict[str, Any]:
    import ctypes

    info: dict[str, Any] = {"llama_cpp_python": getattr(lib, "__version__", None)}
    try:
        buf = ctypes.create_string_buffer(256)
        lib.llama_model_desc(model, buf, len(buf))
        info["model_desc"] = buf.value.decode(errors="replace")
        info["model_bytes"] = int(lib.llama_model_size(model))
        info["system_info"] = lib.llama_print_system_info().decode(errors="replace").strip()
    except (AttributeError, OSError) as e:  # optional details
        info["info_error"] = f"{type(e).__name__}: {e}"
    return info


ENGINES: dict[str, Callable[..., Runner]] = {
    "ir-fp32": load_ir,
    "ingot": load_ingot,
    "ingot-openvino": load_ingot,  # the same artifact, its load spec naming the engine
    "onnxruntime-genai": load_ortgenai,
    "openvino-genai": load_openvino_genai,
    "llama.cpp": load_llama_cpp,
}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def run_metrics(trace: Trace, n: int) -> dict[str, Any]:
    """Throughput and latencies of one run of a batch.

    Decode tokens/s: the tokens every sequence received after the last one got its first token
    (when the whole batch is prefilled), over the time from then to the last token. TTFT:
    start to each sequence's first token. TPOT: the intervals between consecutive tokens of a
    sequence (all sequences pooled).
    """
    start, seqs = trace
    for tokens, times in seqs:
        if len(tokens) != n or len(times) != n:
            raise RuntimeError(f"asked for {n} tokens, got {len(tokens)} ({len(times)} stamps)")
    prefilled = max(times[0] for _, times in seqs)
    end = max(times[-1] for _, times in seqs)
    decode_tokens = sum(1 for _, times in seqs for t in times if t > prefilled)
    ttfts = [times[0] - start for _, times in seqs]
    return {
        "sequences": len(seqs),
        "ttft_s": statistics.median(ttfts),
        "ttft_max_s": max(ttfts),
        "decode_s": end - prefilled,
        "decode_tokens": decode_tokens,
        "tokens_per_s": decode_tokens / (end - prefilled) if end > prefilled else None,
        "intervals_s": [b - a for _, t in seqs for a, b in zip(t, t[1:], strict=False)],
    }


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the timed runs; TPOT percentiles over every interval of every run."""
    intervals = [i for r in runs for i in r.pop("intervals_s")]
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "ttft_s": statistics.median(r["ttft_s"] for r in runs),
        "decode_s": statistics.median(r["decode_s"] for r in runs),
        "tpot_p50_s": percentile(intervals, 50) if intervals else None,
        "tpot_p99_s": percentile(intervals, 99) if intervals else None,
        "tpot_intervals": len(intervals),
    }


def run_decode(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    runner = ENGINES[spec["engine"]](**spec["load"])
    load_s = time.perf_counter() - started
    prompts = spec["prompts"]
    result: dict[str, Any] = {"load_s": load_s, "info": getattr(runner, "info", None)}
    # Warm-up: pages in every weight (each step reads all of them), warms the allocators and
    # the batch's shapes.
    warmup_trace = runner(prompts, spec["warmup_tokens"])
    warmup = run_metrics(warmup_trace, spec["warmup_tokens"])
    warmup.pop("intervals_s")
    runs_n, tokens_n, reduced = _fit_budget(spec, warmup["tokens_per_s"])
    runs, tokens = [], []
    for _ in range(runs_n):
        trace = runner(prompts, tokens_n)
        runs.append(run_metrics(trace, tokens_n))
        tokens = [t for t, _ in trace[1]]
    result |= {"warmup": warmup, "new_tokens": tokens_n, "reduced": reduced, "tokens": tokens}
    return result | summarize_runs(runs) | {"runs": runs}


def _fit_budget(spec: dict[str, Any], rate: float | None) -> tuple[int, int, dict | None]:
    """Runs and tokens per run that fit the case's time budget at the warm-up's rate.

    An engine too slow for the full protocol gets one shorter run, flagged in the report,
    rather than a timeout that would leave no number at all.
    """
    runs, tokens, budget = spec["runs"], spec["tokens"], spec["budget_s"]
    batch = len(spec["prompts"])
    if not rate or runs * batch * (tokens - 1) / rate <= budget:
        return runs, tokens, None
    short = int(spec["reduced_budget_s"] * rate / batch) + 1
    short = max(spec["warmup_tokens"], min(tokens, short))
    reason = (
        f"warm-up decoded {rate:.2f} tok/s: {runs} runs x {batch} x {tokens} tokens would "
        f"take {runs * batch * (tokens - 1) / rate:.0f} s > budget {budget:.0f} s"
    )
    return 1, short, {"runs": 1, "tokens": short, "reason": reason}


def run_context(spec: dict[str, Any]) -> dict[str, Any]:
    """Batch-1 decode after prompts of growing length on one loaded engine: each point's TTFT
    and decode rate. The warm-up runs the longest prompt (for `warmup_tokens`), so that no
    point pays the first growth of an allocator or the first compilation of a shape the others
    reuse; the process's peak RSS (run_spec adds it) is then that of the engine loaded and the
    longest prompt prefilled in one step, the most any point needs."""
    started = time.perf_counter()
    runner = ENGINES[spec["engine"]](**spec["load"])
    load_s = time.perf_counter() - started
    contexts, n = spec["contexts"], spec["tokens"]
    warmup = run_metrics(runner([contexts[-1]], spec["warmup_tokens"]), spec["warmup_tokens"])
    warmup.pop("intervals_s")
    points = []
    for prompt in contexts:
        metrics = run_metrics(runner([prompt], n), n)
        summary = summarize_runs([metrics])  # takes the intervals out of `metrics`
        points.append({"prompt_tokens": len(prompt), "runs": [metrics]} | summary)
    return {"load_s": load_s, "info": getattr(runner, "info", None), "warmup": warmup} | {
        "points": points
    }


def run_prefill(spec: dict[str, Any]) -> dict[str, Any]:
    """Time to prefill each case's prompts at once (one new token each) through the runtime."""
    from ingot.runtime import SamplingParams

    cases = spec["cases"]
    batch = max(len(c["prompts"]) for c in cases)
    budget = max(sum(map(len, c["prompts"])) for c in cases)
    _, generator = open_ingot(spec["artifact"], batch, budget)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def once(prompts: list[list[int]]) -> tuple[float, int]:
        start = time.perf_counter()
        ids = [generator.add(p, params) for p in prompts]
        steps = 0
        while generator.has_unfinished():
            generator.step()
            steps += 1
        elapsed = time.perf_counter() - start
        for i in ids:
            generator.pop_completion(i)
        return elapsed, steps

    results = []
    for case in cases:
        prompts = case["prompts"]
        once(prompts)  # warm-up: this case's shapes
        timed = [once(prompts) for _ in range(spec["runs"])]
        seconds = statistics.median(s for s, _ in timed)
        tokens = sum(map(len, prompts))
        results.append(
            {
                "name": case["name"],
                "sequences": len(prompts),
                "tokens_per_sequence": sorted({len(p) for p in prompts}),
                "tokens": tokens,
                "runs_s": [s for s, _ in timed],
                "seconds": seconds,
                "tokens_per_s": tokens / seconds,
                "steps": sorted({k for _, k in timed}),
            }
        )
    return {"cases": results, "max_num_batched_tokens": max(2048, budget)}


def run_profile(spec: dict[str, Any]) -> dict[str, Any]:
    """One greedy decode of the batch under ONNX Runtime's profiler; kernel time per op type
    per model_run over the decode steps, and the step's wall time around the session calls."""
    from ingot.runtime import SamplingParams

    prompts, n = spec["prompts"], spec["tokens"]
    batched = sum(map(len, prompts))
    ctx = max(map(len, prompts)) + n + 1
    model, generator = open_ingot(
        spec["artifact"], len(prompts), batched, spec["prefix"], ctx_per_seq=ctx
    )
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    for p in prompts:
        generator.add(p, params)
    walls = []
    while generator.has_unfinished():
        started = time.perf_counter()
        generator.step()
        walls.append(time.perf_counter() - started)
    trace = Path(model.session.end_profiling())
    try:
        events = json.loads(trace.read_text())
    finally:
        trace.unlink(missing_ok=True)
    return aggregate_profile(events, walls, spec["skip_steps"])


def aggregate_profile(events: list[dict], walls: list[float], skip: int) -> dict[str, Any]:
    """Kernel time per op type per model_run, over the decode runs.

    The first model_run is the prefill; the `skip` runs after it are left out as warm-up, and
    so are the first 1 + skip step walls. Node events are assigned to the model_run whose span
    holds them.
    """
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )
    starts = [r["ts"] for r in runs]
    kernels: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i >= 0 and e["ts"] <= runs[i]["ts"] + runs[i]["dur"]:
            kernels[i][e["args"].get("op_name", "?")] += e["dur"]
    used = list(range(1 + skip, len(runs)))
    decode_walls = walls[1 + skip :]
    if not used or not decode_walls:
        raise RuntimeError(f"{len(runs)} model_runs, {len(walls)} steps: too few to profile")
    per_op: dict[str, float] = defaultdict(float)
    for i in used:
        for op, us in kernels[i].items():
            per_op[op] += us / len(used)
    run_us = statistics.mean(runs[i]["dur"] for i in used)
    kernel_us = sum(per_op.values())
    wall_us = statistics.mean(decode_walls) * 1e6
    wall_us = max(wall_us, run_us)  # a step holds its runs (one per step, normally)
    ops = dict(sorted(per_op.items(), key=lambda kv: -kv[1]))
    return {
        "steps": len(walls),
        "model_runs": len(runs),
        "decode_runs_used": len(used),
        "step_wall_ms": wall_us / 1000,
        "model_run_ms": run_us / 1000,
        "kernel_ms": kernel_us / 1000,
        "op_ms_per_run": {op: us / 1000 for op, us in ops.items()},
        "shares": {
            "runtime_outside_ort": (wall_us - run_us) / wall_us,
            "ort_between_kernels": (run_us - kernel_us) / wall_us,
            **{f"op:{op}": us / wall_us for op, us in ops.items()},
        },
    }


def run_build(spec: dict[str, Any]) -> dict[str, Any]:
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    started = time.perf_counter()
    result = build(spec["recipe"], spec["out"], cache=StageCache(Path(spec["cache"])))
    return {"seconds": time.perf_counter() - started, **result.to_json()}


_KINDS = {
    "decode": run_decode,
    "context": run_context,
    "prefill": run_prefill,
    "profile": run_profile,
    "build": run_build,
}


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
    worker_main(run_spec)
