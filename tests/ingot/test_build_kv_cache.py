"""An int8 / fp8 KV cache end to end on a tiny checkpoint: the build calibrates per-head scales
(the export stage, on the calibrate stage's windows; an RTN quantize stage keeps its key), the
manifest records them, the runtime's pool holds the codes (a quarter of fp32's bytes per
token, four times the sequences in one budget), and greedy output equals the IR's, rounding
its K/V with the manifest's scales, token for token, whatever the chunking or caching."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from ingot.artifacts import read_manifest
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.model.kv_quant import KVScales, attach_kv_scales
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.recipe import load_recipe
from ingot.pipeline.stages.export import ExportOutput
from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.kv_pool import kv_numpy_dtype as kv_numpy

from fixtures import make_checkpoint, write_recipe

REPO = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
EXACT = [{"engine": "onnxruntime", "matmul_accuracy_level": 0}]  # the IR's numbers
SHARED = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps"
PROMPTS = [SHARED + " over the", "def add(a, b):", SHARED + " again and", "import os"]
# The tiny checkpoint: 2 layers x 2 KV heads x head_dim 16, K and V
FP32_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4


def _calibration(samples: int = 4) -> dict:
    data = str(REPO / "recipes" / "demo" / "pydoc-heldin.txt")
    return {"dataset": data, "samples": samples, "seq_len": 64}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{kv dtype: (recipe, build result)} for fp32, fp16, int8 and fp8, in one stage cache."""
    tmp = tmp_path_factory.mktemp("kv")
    ckpt = make_checkpoint(tmp / "ckpt", "llama")
    cache = StageCache(tmp / "cache")
    results = {}
    for dtype in ("fp32", "fp16", "int8", "fp8"):
        recipe = write_recipe(
            tmp / f"{dtype}.yaml",
            ckpt,
            kv_cache={"dtype": dtype, "block_size": 8},
            calibration=_calibration(),
            targets=EXACT,
        )
        results[dtype] = (recipe, build(recipe, tmp / dtype, cache=cache))
    return results


def _ir_greedy(recipe: Path, artifact: Path, prompts: list[list[int]]) -> list[list[int]]:
    """The quantized IR's greedy tokens, its K/V rounded with the manifest's scales."""
    spec = load_recipe(recipe)
    model = load_model(spec.source.path)
    quantize_model(model, spec.quantize)
    graph = read_manifest(artifact).graph
    if graph.kv_scales is not None:
        scales = KVScales.from_json(graph.kv_dtype, graph.kv_scales.model_dump())
        attach_kv_scales(model, scales)
    return [model.generate_greedy(p, GREEDY.max_tokens, stop_at_eos=False) for p in prompts]


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_runtime_greedy_matches_the_ir(built, dtype):
    recipe, result = built[dtype]
    generator = LoadedModel.load(result.artifact).generator()
    completions = generator.generate(PROMPTS, GREEDY)  # batched
    expected = _ir_greedy(recipe, result.artifact, [c.prompt_token_ids for c in completions])
    assert [c.token_ids for c in completions] == expected
    # Rounding K/V is visible: the fp32 artifact's tokens differ somewhere.
    fp32 = LoadedModel.load(built["fp32"][1].artifact).generator().generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in fp32] != expected


# fp16, int8: the graph writes its K/V into the pool in place; fp8: the runtime writes them.
@pytest.mark.parametrize("dtype", ["fp16", "int8", "fp8"])
@pytest.mark.parametrize(("caching", "budget"), [(True, 2048), (False, 8), (True, 8), (True, 5)])
def test_greedy_output_independent_of_chunking_and_caching(built, dtype, caching, budget):
    artifact = built[dtype][1].artifact
    alone = LoadedModel.load(artifact, enable_prefix_caching=False).generator()
    want = [alone.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    model = LoadedModel.load(artifact, max_num_batched_tokens=budget, enable_prefix_caching=caching)
    generator = model.generator()
    for _ in range(2):  # the second round reads the first one's cached prefixes
        assert [c.token_ids for c in generator.generate(PROMPTS, GREEDY)] == want
    assert (generator.stats().prefix_cache_hits > 0) == caching


@pytest.mark.parametrize(("dtype", "numpy_dtype"), [("int8", np.int8), ("fp8", np.uint8)])
def test_pool_holds_codes_in_a_quarter_of_the_bytes(built, dtype, numpy_dtype, caplog):
    budget = 256 << 10
    with caplog.at_level(logging.INFO, logger="ingot.runtime"):
        model = LoadedModel.load(built[dtype][1].artifact, kv_cache_bytes=budget)
    fp32 = LoadedModel.load(built["fp32"][1].artifact, kv_cache_bytes=budget)
    pool = model.pool
    assert pool.dtype == numpy_dtype and all(a.dtype == numpy_dtype for a in pool.k + pool.v)
    per_token = pool.nbytes // (pool.num_blocks * pool.block_size)
    assert per_token == FP32_BYTES_PER_TOKEN // 4
    assert pool.num_blocks == 4 * fp32.pool.num_blocks  # the same budget, 4x the tokens
    line = next(r.getMessage() for r in caplog.records if "KV cache:" in r.getMessage())
    assert f"{per_token} bytes/token, {dtype})" in line
    assert f"room for {pool.num_blocks // 16} sequences of max_seq_len 128" in line


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_manifest_records_the_calibrated_scales(built, dtype):
    recipe, result = built[dtype]
    manifest = read_manifest(result.artifact)
    graph = manifest.graph
    assert graph.kv_dtype == dtype
    assert np.array(graph.kv_scales.k).shape == np.array(graph.kv_scales.v).shape == (2, 2)
    export = next(s for s in result.stages if s.stage == "export")
    cache = StageCache(Path(recipe).parent / "cache")
    graph_json = ExportOutput(cache.path("export", export.key), export.digest).graph_info()
    assert graph.kv_scales.model_dump() == graph_json["kv_scales"]
    pools = {t.name: t.dtype for t in graph.inputs if t.name.startswith("k_pool")}
    assert set(pools.values()) == {"int8" if dtype == "int8" else "uint8"}
    check = manifest.engines[0].build["check"]
    assert check["kv_dtype"] == dtype and check["greedy_match"]


def test_stage_keys(built):
    runs = {dtype: {s.stage: s for s in result.stages} for dtype, (_, result) in built.items()}
    # Every recipe here is RTN: the quantize stage never depends on the KV cache or the
    # calibration section, so all four builds share one entry.
    assert runs["int8"]["quantize"].cached and runs["fp8"]["quantize"].cached
    # fp32 and fp16 KV caches need no windows; int8 computes them, fp8 finds them cached.
    assert "calibrate" not in runs["fp32"] and "calibrate" not in runs["fp16"]
    assert not runs["int8"]["calibrate"].cached and runs["fp8"]["calibrate"].cached
    keys = {dtype: run["export"].key for dtype, run in runs.items()}
    assert len(set(keys.values())) == 4


def test_export_key_holds_the_calibration(built, tmp_path):
    recipe, result = built["int8"]
    fewer = write_recipe(
        tmp_path / "r.yaml",
        load_recipe(recipe).source.path,
        kv_cache={"dtype": "int8", "block_size": 8},
        calibration=_calibration(samples=2),
        targets=EXACT,
    )
    other = build(fewer, tmp_path / "art", cache=StageCache(Path(recipe).parent / "cache"))
    before = {s.stage: s for s in result.stages}
    after = {s.stage: s for s in other.stages}
    assert after["quantize"].cached and after["quantize"].key == before["quantize"].key
    assert not after["calibrate"].cached and not after["export"].cached
    assert (
        read_manifest(other.artifact).graph.kv_scales
        != read_manifest(result.artifact).graph.kv_scales
    )


def test_engine_perplexity_reads_the_quantized_pool(built):
    # evaluate/engine.py scores an engine through the runtime's pool: 8-bit pools included.
    from ingot.pipeline.evaluate.engine import engine_perplexity
    from ingot.runtime.loader import EngineFiles

    windows = np.random.default_rng(0).integers(0, 320, (2, 40))
    ppl = {}
    for dtype, (_, result) in built.items():
        manifest = read_manifest(result.artifact)
        path = result.artifact / manifest.engines[0].path
        graph = onnx.load(str(path), load_external_data=False).graph
        [pool] = [i for i in graph.input if i.name == "k_pool_0"]  # the engine's own input
        elem = onnx.helper.tensor_dtype_to_np_dtype(pool.type.tensor_type.elem_type)
        assert elem == np.dtype(kv_numpy(dtype))
        engine = EngineFiles(manifest.graph, manifest.engines[0], path)
        assert engine.kv_layout().dtype == elem  # the pool the runtime builds for it
        ppl[dtype] = engine_perplexity(engine, windows)
    for dtype in ("int8", "fp8"):
        assert ppl[dtype] != ppl["fp32"] and abs(ppl[dtype] / ppl["fp32"] - 1) < 0.05


def test_a_draft_model_gets_its_own_scales(built, tmp_path):
    # The draft shares the recipe's kv_cache: its own calibrate stage (its tokenizer, equal to
    # the target's) and scales; speculation keeps greedy output on the int8 pools.
    recipe, _ = built["int8"]
    draft = make_checkpoint(tmp_path / "draft", "llama", seed=1, num_hidden_layers=1)
    speculative = {
        "method": "draft_model",
        "num_speculative_tokens": 3,
        "draft": {"source": {"path": str(draft)}},
    }
    path = write_recipe(
        tmp_path / "r.yaml",
        load_recipe(recipe).source.path,
        kv_cache={"dtype": "int8", "block_size": 8},
        calibration=_calibration(),
        targets=EXACT,
        speculative=speculative,
    )
    result = build(path, tmp_path / "art", cache=StageCache(Path(recipe).parent / "cache"))
    stages = {s.stage: s for s in result.stages}
    assert stages["export"].cached and not stages["draft-export"].cached
    assert "draft-calibrate" in stages
    graph = read_manifest(result.artifact).speculative.draft.graph
    assert graph.kv_dtype == "int8" and np.array(graph.kv_scales.k).shape == (1, 2)
    plain = LoadedModel.load(result.artifact, speculative_config=False).generator()
    drafted = LoadedModel.load(result.artifact, speculative_config={"adaptive": False})
    assert drafted.draft.pool.dtype == np.int8
    want = [c.token_ids for c in plain.generate(PROMPTS, GREEDY)]
    generator = drafted.generator()
    assert [c.token_ids for c in generator.generate(PROMPTS, GREEDY)] == want
    assert generator.stats().spec_num_drafts > 0  # the draft's int8 pool was read
