"""`ingot plan ARTIFACT --serve`: the serving plan's arithmetic, its errors, its JSON, and that
`ingot serve` given the plan's options holds exactly the cache the plan sized. (Whether the
plan is within +-15% of the measured resident memory is the benchmark's question:
benchmarks/serve/serving_plan.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ingot.artifacts import read_manifest
from ingot.cli import main
from ingot.cli_serve import ByteSize
from ingot.runtime import LoadedModel
from ingot.runtime.engines import ENGINE_RUNTIMES
from ingot.runtime.engines.onnxruntime import RESIDENT
from ingot.runtime.serving_plan import (
    MARGIN,
    PlanDoesNotFit,
    ServingRequest,
    engine_file_bytes,
    exact_size,
    plan_serving,
)

GIB, MIB = 1 << 30, 1 << 20


def _plan(artifact, memory=GIB, **kwargs):
    return plan_serving(read_manifest(artifact), ServingRequest(memory, **kwargs))


def test_the_plan_adds_weights_overhead_and_whole_sequences_of_kv(demo_artifact):
    manifest = read_manifest(demo_artifact)
    plan = _plan(demo_artifact)
    m, engine = manifest.model, manifest.engines[0]
    assert plan.engine == engine.name == "onnxruntime-cpu"
    # KV bytes per token of the fp32 pool: layers x (K, V) x kv heads x head_dim x 4
    assert plan.kv_bytes_per_token == m.num_layers * 2 * m.num_kv_heads * m.head_dim * 4
    per_block = plan.kv_bytes_per_token * plan.kv_block_size
    per_seq = -(-m.max_seq_len // plan.kv_block_size) * per_block
    assert plan.max_seq_len == m.max_seq_len
    assert plan.kv_cache_memory == plan.sequences * per_seq
    assert plan.kv_resident == plan.kv_cache_memory + per_block  # + the scratch block
    # weights and overhead: the engine plug-in's model over the files the engine reads
    files = engine_file_bytes(manifest, engine)
    assert (
        plan.weight_files
        == files
        == sum(f.size for f in manifest.files if f.path.startswith("engines/onnxruntime-cpu/"))
    )
    assert plan.weights == int(RESIDENT.weights_factor * files)
    scores = 2048 * m.max_seq_len * m.num_heads * 4
    assert plan.overhead == RESIDENT.base_bytes + int(RESIDENT.attention_buffers * scores)
    assert plan.resident == plan.weights + plan.overhead + plan.kv_resident
    # as many sequences as fit under the limit with the margin, and not one more
    assert plan.resident * (1 + MARGIN) <= GIB < (plan.resident + per_seq) * (1 + MARGIN)
    assert plan.memory_request == -(-plan.resident // MIB) * MIB and plan.memory == GIB


def test_max_num_seqs_and_max_seq_len_bound_the_cache(demo_artifact):
    full = _plan(demo_artifact)
    capped = _plan(demo_artifact, max_num_seqs=3)
    assert capped.sequences == 3 < full.sequences
    assert capped.resident == full.resident - (full.sequences - 3) * (
        full.kv_cache_memory // full.sequences
    )
    short = _plan(demo_artifact, max_seq_len=100)  # 7 blocks of 16 per sequence
    assert short.kv_cache_memory == short.sequences * 7 * 16 * short.kv_bytes_per_token
    assert short.sequences > full.sequences * 9
    # the attention scores of a step's chunk against contexts of 100 tokens, not 1024
    scores = RESIDENT.attention_buffers * 2048 * (1024 - 100) * 4 * 4
    assert full.overhead - short.overhead == pytest.approx(scores, abs=1)


def test_ingot_serve_with_the_plans_options_holds_the_planned_cache(demo_artifact):
    plan = _plan(demo_artifact, memory=400 * MIB)
    budget = ByteSize().convert(exact_size(plan.kv_cache_memory), None, None)
    assert budget == plan.kv_cache_memory
    loaded = LoadedModel.load(demo_artifact, kv_cache_bytes=budget, max_num_seqs=plan.sequences)
    pool = loaded.pool
    assert pool.num_blocks * pool.block_size == plan.sequences * plan.max_seq_len
    assert sum(a.nbytes for a in pool.k + pool.v) == plan.kv_resident


def test_too_little_memory_is_one_line_naming_memory_and_what_it_needs(demo_artifact):
    with pytest.raises(PlanDoesNotFit) as caught:
        _plan(demo_artifact, memory=200 * MIB)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("--memory 200MiB is too small")
    needs = int(message.rsplit("at least ", 1)[1].removesuffix("MiB"))
    assert _plan(demo_artifact, memory=needs * MIB).sequences == 1
    with pytest.raises(PlanDoesNotFit, match="max_seq_len is 1024"):
        _plan(demo_artifact, max_seq_len=2048)
    with pytest.raises(PlanDoesNotFit, match="no such engine .*onnxruntime-cpu"):
        _plan(demo_artifact, engine="openvino")


def test_every_engine_kind_models_its_resident_memory():
    for kind in ENGINE_RUNTIMES.names():
        assert callable(ENGINE_RUNTIMES.get(kind).resident_memory), kind


def test_plan_serve_json_and_text(demo_artifact):
    args = ["plan", str(demo_artifact), "--serve", "--memory", "1GiB", "--max-num-seqs", "4"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["sequences"] == 4 and plan["memory_limit"] == GIB
    assert plan["resident"] == plan["weights"] + plan["overhead"] + plan["kv_resident"]
    assert plan["serve_args"][plan["serve_args"].index("--kv-cache-memory") + 1] == "16MiB"
    text = CliRunner().invoke(main, args).output
    assert "4 sequences of 1024 tokens" in text and "4096 bytes/token (fp32" in text
    assert f"request {plan['memory_request'] >> 20}Mi, limit 1024Mi" in text


@pytest.mark.parametrize(
    ("args", "code", "error"),
    [
        (["ARTIFACT"], 2, "give --serve --memory SIZE"),
        (["ARTIFACT", "--serve"], 2, "give --serve --memory SIZE"),
        (["ARTIFACT", "--recipe", "recipes/demo.yaml"], 2, "or ARTIFACT --serve (plan serving"),
        (["--recipe", "recipes/demo.yaml", "--serve"], 2, "--serve plans an artifact"),
        (["ARTIFACT", "--serve", "--memory", "100MiB"], 1, "--memory 100MiB is too small"),
    ],
)
def test_plan_serve_errors(demo_artifact, args, code, error):
    args = [str(demo_artifact) if a == "ARTIFACT" else a for a in args]
    result = CliRunner().invoke(main, ["plan", *args])
    assert result.exit_code == code and error in result.output, result.output


def test_plan_serve_imports_nothing_of_the_build(demo_artifact):
    # a fresh interpreter: this one has torch and the pipeline loaded by other tests
    check = (
        "import sys\nfrom ingot.cli import main\n"
        f"try:\n    main(['plan', {str(demo_artifact)!r}, '--serve', '--memory', '1GiB'])\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'onnx', 'transformers')"
        " or m.startswith(('ingot.pipeline', 'ingot.calibration'))]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "serving plan" in result.stdout
