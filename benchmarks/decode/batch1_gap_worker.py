"""One case of batch1_gap.py in a fresh process: microseconds per decode token at batch 1.

Runs under ingot's interpreter (cases `ingot_step`, `ingot_graph`) or onnxruntime-genai's
(`ortgenai_step`, `ortgenai_graph`), so it imports nothing of ingot at module level and nothing
but numpy, onnxruntime and the harness's launch besides. Usage: `python -m
benchmarks.decode.batch1_gap_worker SPEC.json RESULT.json`, as harness.launch.run_worker runs
it; the spec names the case, the artifact, the onnxruntime-genai model
directory, the prompt, the thread count and the timed repeats (the median is the result).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.harness.launch import worker_main

CALLS = 127  # session calls per repeat: one decode's worth


def ingot_step(spec: dict[str, Any]) -> Callable[[], float]:
    """The runtime's Generator.step over a whole greedy decode: what decode.py times."""
    from ingot.runtime import SamplingParams

    model = _ingot_model(spec)
    generator = model.generator()
    params = SamplingParams(max_tokens=CALLS + 1, temperature=0.0, ignore_eos=True)

    def decode() -> float:
        generator.add(spec["prompt"], params)
        generator.step()  # the prefill
        started, steps = time.perf_counter(), 0
        while generator.has_unfinished():
            generator.step()
            steps += 1
        return (time.perf_counter() - started) / steps * 1e6

    return decode


def ingot_graph(spec: dict[str, Any]) -> Callable[[], float]:
    """The engine session alone: the binding a decode step at the run's mean context left
    (inputs, the pool, the output buffers), run again and again with no Python between.
    With `spec["variant"]` (VARIANTS) the session is a changed copy of the engine graph over
    the same pool and inputs: what the changed part costs. It reaches into the runtime's
    private session (`_PagedSession`): the public API has no way to run the graph without
    the step around it, which is what this case leaves out."""
    from ingot.runtime import SamplingParams
    from ingot.runtime.engines.onnxruntime.session import EngineSession, _PagedSession

    model = _ingot_model(spec)
    generator = model.generator()
    context = len(spec["prompt"]) + CALLS // 2
    last: list[tuple[_PagedSession, Any]] = []
    call = _PagedSession._call

    def capture(self: _PagedSession, batch: Any, **extra: Any) -> Any:
        last[:] = [(self, batch)]
        return call(self, batch, **extra)

    _PagedSession._call = capture  # type: ignore[method-assign]
    prompt = (spec["prompt"] * context)[:context]
    generator.add(prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    while generator.has_unfinished():
        generator.step()  # the last call is a decode step at `context`
    _PagedSession._call = call  # type: ignore[method-assign]
    session, batch = last[0]
    if spec.get("variant"):
        s, max_blocks = batch.block_tables.shape
        _, block, kv_heads, head_dim = model.pool.k[0].shape  # [blocks, B, Hkv, D]
        past = [s, max_blocks * block, kv_heads * head_dim]  # what each pool gather yields
        engine = model.root / model.engine.path
        graph = VARIANTS[spec["variant"]](engine, Path(spec["tmp"]), past)
        session = EngineSession(graph, model.pool, model.engine.session_options)
        session._call(batch)  # binds the batch's inputs and the outputs once
    run, binding = session._session.run_with_iobinding, session._binding

    def timed() -> float:
        return _per_call(lambda: run(binding))

    # The binding points into memory these own (the pool; the batch's inputs; the session's
    # output buffers) without holding it: keep them alive as long as the case runs.
    timed.owners = (model, batch, session)  # type: ignore[attr-defined]
    return timed


def _without_attention(engine: Path, tmp: Path, past: list[int]) -> Path:
    """Each Attention replaced by Identity of its query: the attention kernels' cost. The
    pool gathers still run (ORT keeps nodes whose outputs go unused)."""
    return _rewrite(engine, tmp / "no_attention.onnx", _replace("Attention", lambda n: n.input[0]))


def _without_pool_gather(engine: Path, tmp: Path, past: list[int]) -> Path:
    """Each layer's past K and V taken from one constant of the gathered shape `past`
    [S, T, Hkv*D] instead of Gather + Reshape from the pool: what reading the pool costs."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(engine))
    model.graph.initializer.append(
        numpy_helper.from_array(np.zeros(past, np.float32), "ablation.past")
    )
    kept = []
    for node in model.graph.node:
        if node.op_type == "Gather" and node.name.endswith(("/k_gather", "/v_gather")):
            continue
        if node.op_type == "Reshape" and node.name.endswith(("/k_past", "/v_past")):
            node = helper.make_node("Identity", ["ablation.past"], [node.output[0]])
        kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return _save(model, tmp / "no_pool_gather.onnx")


def _fused_skip_norm(engine: Path, tmp: Path, past: list[int]) -> Path:
    """Each residual Add feeding an RMSNormalization fused with it into ORT's
    SkipSimplifiedLayerNormalization (as onnxruntime-genai's graph has them): fewer nodes,
    the same work."""
    import onnx
    from onnx import helper

    model = onnx.load(str(engine))
    producer = {out: n for n in model.graph.node for out in n.output}
    adds, fused = set(), {}
    for node in model.graph.node:
        add = producer.get(node.input[0]) if node.op_type == "RMSNormalization" else None
        if add is None or add.op_type != "Add":
            continue
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        adds.add(add.name)
        fused[node.name] = helper.make_node(
            "SkipSimplifiedLayerNormalization",
            [add.input[0], add.input[1], node.input[1]],
            [node.output[0], "", "", add.output[0]],  # output 3: the residual sum
            domain="com.microsoft",
            epsilon=eps,
        )
    kept = [fused.get(n.name, n) for n in model.graph.node if n.name not in adds]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return _save(model, tmp / "fused_skip_norm.onnx")


def _replace(op_type: str, source: Callable[[Any], str]) -> Callable[[Any], Any]:
    from onnx import helper

    def edit(node: Any) -> Any:
        if node.op_type != op_type:
            return node
        return helper.make_node("Identity", [source(node)], [node.output[0]], name=node.name)

    return edit


def _rewrite(engine: Path, out: Path, edit: Callable[[Any], Any]) -> Path:
    import onnx

    model = onnx.load(str(engine))
    kept = [edit(n) for n in model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return _save(model, out)


def _save(model: Any, out: Path) -> Path:
    import onnx

    onnx.save(model, str(out), save_as_external_data=True, location=out.name + ".data")
    return out


VARIANTS = {
    "no_attention": _without_attention,
    "no_pool_gather": _without_pool_gather,
    "fused_skip_norm": _fused_skip_norm,
}


def ortgenai_step(spec: dict[str, Any]) -> Callable[[], float]:
    """onnxruntime-genai's generate_next_token over a whole greedy decode (its C++ loop)."""
    import onnxruntime_genai as og

    model = og.Model(spec["ortgenai_dir"])
    total = len(spec["prompt"]) + CALLS + 1

    def decode() -> float:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([spec["prompt"]], dtype=np.int32))
        generator.generate_next_token()  # picks from the prefill's logits
        started, steps = time.perf_counter(), 0
        while not generator.is_done():
            generator.generate_next_token()
            steps += 1
        return (time.perf_counter() - started) / steps * 1e6

    return decode


def ortgenai_graph(spec: dict[str, Any]) -> Callable[[], float]:
    """onnxruntime-genai's model.onnx in a plain session at the same mean context, bound as
    its loop binds it (past and present share one buffer of max_length), no Python between."""
    model_dir = Path(spec["ortgenai_dir"])
    config = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = spec["threads"]
    session = ort.InferenceSession(
        str(model_dir / config["filename"]), options, providers=["CPUExecutionProvider"]
    )
    total = len(spec["prompt"]) + CALLS + 1
    context = len(spec["prompt"]) + CALLS // 2
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", np.array([[7]], np.int64))
    binding.bind_cpu_input("attention_mask", np.ones((1, context + 1), np.int64))
    shape = [1, config["num_key_value_heads"], total, config["head_size"]]
    keep = []
    for layer in range(config["num_hidden_layers"]):
        for kind in ("key", "value"):
            buffer = np.zeros(shape, np.float32)
            keep.append(buffer)
            binding.bind_cpu_input(f"past_key_values.{layer}.{kind}", buffer)
            binding.bind_output(
                f"present.{layer}.{kind}", "cpu", 0, np.float32, shape, buffer.ctypes.data
            )
    logits = np.empty((1, 1, _vocab(session)), np.float32)
    binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
    keep.append(logits)

    def timed() -> float:
        return _per_call(lambda: session.run_with_iobinding(binding))

    timed.buffers = keep  # type: ignore[attr-defined]  # bound by address: keep them alive
    return timed


CASES = {
    "ingot_step": ingot_step,
    "ingot_graph": ingot_graph,
    "ortgenai_step": ortgenai_step,
    "ortgenai_graph": ortgenai_graph,
}


def _ingot_model(spec: dict[str, Any]) -> Any:
    from ingot.runtime import LoadedModel

    return LoadedModel.load(
        spec["artifact"],
        kv_cache_bytes=None,
        max_num_seqs=1,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
    )


def _per_call(call: Callable[[], Any]) -> float:
    """Microseconds per call over CALLS calls."""
    started = time.perf_counter()
    for _ in range(CALLS):
        call()
    return (time.perf_counter() - started) / CALLS * 1e6


def _vocab(session: ort.InferenceSession) -> int:
    logits = next(o for o in session.get_outputs() if o.name == "logits")
    return int(logits.shape[-1])


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    timed = CASES[spec["case"]](spec)
    timed()  # warm-up: pages the weights in, warms the allocators and shapes
    repeats = [timed() for _ in range(spec["repeats"])]
    return {"ok": True, "us_per_token": statistics.median(repeats), "repeats_us": repeats}


if __name__ == "__main__":
    worker_main(run_case)
