"""The spike's correctness job (openvino_worker kind `check`, OpenVINO's virtualenv, which
holds ingot's runtime and ONNX Runtime too): ov_check.py's comparisons on one artifact.

- route B exact: OpenVINO with f32 activations, f32 caches and no activation quantization
  against the portable graph in a plain ONNX Runtime session (`disable_all`);
- route B as timed: each timed OpenVINO configuration against ingot's ONNX Runtime engine (and
  the exact reference), logits over ov_check.CALLS, then greedy decoding of `greedy_prompt`
  through ingot's Generator on both engines: how many leading tokens agree;
- route A: the portable graph converted by OpenVINO's ONNX frontend, against the exact
  reference, with the op counts of the converted and of the compiled graph.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.spike.ov_check import compare, drive, lengths, scatter_free_list

__all__ = ["run_check"]

EXACT = {"precision": "f32", "kv": "f32", "dyn_quant": 0}
_BLOCKS = 16  # each check pool: enough for ov_check.CALLS' two sequences


def run_check(spec: dict[str, Any]) -> dict[str, Any]:
    from ingot.artifacts import verify_artifact

    artifact, threads = Path(spec["artifact"]), spec["threads"]
    manifest = verify_artifact(artifact)
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, manifest.model.vocab_size, n).tolist() for n in lengths()]
    engine = manifest.engines[0]
    plain = {"graph_optimization_level": "disable_all"}
    exact_ref = _ort(artifact, manifest, "model.onnx", plain, tokens)
    engine_ref = _ort(artifact, manifest, engine.path, dict(engine.session_options), tokens)
    prompt, n = spec["greedy_prompt"], spec["greedy_tokens"]
    ingot_greedy = _ingot_greedy(artifact, manifest, prompt, n)
    out: dict[str, Any] = {
        "tokens_compared": sum(lengths()),
        "ingot_engine_vs_exact": compare(exact_ref, engine_ref),
        "ingot_greedy": ingot_greedy,
    }
    configs = {"exact": EXACT, **spec["configs"]}
    out["openvino"] = {}
    for name, cfg in configs.items():
        logits, info = _openvino(artifact, cfg, threads, tokens)
        row = {"config": cfg, "vs_exact": compare(exact_ref, logits), "build": info}
        if name != "exact":
            row["vs_ingot_engine"] = compare(engine_ref, logits)
            greedy = _openvino_greedy(artifact, cfg, threads, prompt, n)
            row["greedy"] = greedy
            row["greedy_agree"] = _leading_agreement(ingot_greedy, greedy)
        out["openvino"][name] = row
        gc.collect()
    if spec.get("route_a", True):
        out["route_a"] = _route_a(artifact, manifest, threads, tokens, exact_ref)
    return out


def _pool(manifest: Any, block_size: int | None = None) -> Any:
    from ingot.runtime.kv_pool import KVPool

    g = manifest.graph
    size = block_size or g.kv_block_size
    pool = KVPool(g.num_layers, _BLOCKS, size, g.num_kv_heads, g.head_dim, np.float32)
    scatter_free_list(pool)
    return pool


def _ort(
    artifact: Path, manifest: Any, path: str, options: dict, tokens: list[list[int]]
) -> np.ndarray:
    from ingot.runtime.engines.onnxruntime.session import EngineSession

    pool = _pool(manifest)
    session = EngineSession(artifact / path, pool, options)
    return drive(session, pool, tokens)


def _openvino(artifact: Path, cfg: dict, threads: int, tokens: list[list[int]]) -> tuple:
    from benchmarks.spike.ov_runner import compile_config, open_openvino

    config = compile_config(threads, cfg["precision"], cfg["kv"], cfg["dyn_quant"])
    runner, pool, info = open_openvino(artifact, _BLOCKS, config)
    scatter_free_list(pool)
    return drive(runner, pool, tokens), info


def _ingot_greedy(artifact: Path, manifest: Any, prompt: list[int], n: int) -> list[int]:
    from ingot.runtime import LoadedModel, SamplingParams

    blocks = -(-manifest.model.max_seq_len // manifest.graph.kv_block_size) + 1  # one sequence
    model = LoadedModel.load(
        artifact, kv_cache_blocks=blocks, enable_prefix_caching=False, max_num_seqs=1
    )
    generator = model.generator()
    request = generator.add(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    while generator.has_unfinished():
        generator.step()
    return list(generator.pop_completion(request).token_ids)


def _openvino_greedy(
    artifact: Path, cfg: dict, threads: int, prompt: list[int], n: int
) -> list[int]:
    from benchmarks.spike.openvino_worker import open_ov_generator
    from ingot.runtime import SamplingParams

    generator, _ = open_ov_generator(str(artifact), 1, len(prompt), len(prompt) + n, threads, **cfg)
    request = generator.add(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    while generator.has_unfinished():
        generator.step()
    return list(generator.pop_completion(request).token_ids)


def _leading_agreement(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def _route_a(
    artifact: Path, manifest: Any, threads: int, tokens: list[list[int]], exact_ref: np.ndarray
) -> dict[str, Any]:
    from benchmarks.spike.ov_route_a import RouteARunner, layer_counts, op_counts
    from benchmarks.spike.ov_runner import compile_config

    out: dict[str, Any] = {}
    for name, cfg in {"exact": EXACT, "default": None}.items():
        config = compile_config(threads, **cfg) if cfg else {"INFERENCE_NUM_THREADS": threads}
        pool = _pool(manifest)
        try:
            runner = RouteARunner(artifact / "model.onnx", pool, config)
            out[name] = {"vs_exact": compare(exact_ref, drive(runner, pool, tokens))}
            out["converted_ops"] = op_counts(runner.model)
            out[name]["runtime_layers"] = layer_counts(runner.compiled)
        except Exception as e:  # the route's exact error is the result
            out[name] = {"error": f"{type(e).__name__}: {e}"}
        gc.collect()
    return out
