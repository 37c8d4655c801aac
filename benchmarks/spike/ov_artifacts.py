"""The ingot artifacts the spike's routes run: the decode benchmark's recipe (RTN int4 g32
symmetric on every linear, lm_head included; fp32 KV; ONNX Runtime CPU at MatMulNBits accuracy
level 4), with a context long enough for the ~4k-token case on the 1B shape.

Every engine reads the same artifact: ingot's ONNX Runtime engine runs its engine graph, the
OpenVINO model is built from the portable graph's initializers (the engine's weights.py), llama.cpp
reads the GGUF the `gguf` interop format wrote beside them (the same codes as Q4_0 blocks): the same
codes and scales. Built by the decode benchmark's worker into the benchmark cache (outside the
repository), reused across runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.decode.artifact import VARIANT, decode_recipe, ingot_code_fingerprint
from benchmarks.decode.artifact import WORKER as BUILD_WORKER
from benchmarks.decode.models import BenchModel
from benchmarks.harness.launch import run_worker
from benchmarks.harness.paths import bench_cache_dir

__all__ = ["LONG_CONTEXT", "build_artifact", "spike_max_seq_len"]

LONG_CONTEXT = 4096  # the long case's context: its prompt plus its new tokens
BUILD_TIMEOUT_S = 3600


def spike_max_seq_len(model: BenchModel) -> int:
    """The export's max_seq_len: the model's own when it is shorter than the long case
    (pydoc-16m: 1024), else the long case's context rounded up to a block of 256."""
    config = json.loads((model.path / "config.json").read_text())
    return min(config["max_position_embeddings"], LONG_CONTEXT + 256)


def build_artifact(
    model: BenchModel, tmp: Path, threads: int, interop: Sequence[str] = ()
) -> dict[str, Any]:
    """The build worker's record; `artifact` is the path when `ok`. `interop`: formats written
    beside the engine (["gguf"] for the llama.cpp route), each set its own artifact."""
    recipe = decode_recipe(model, threads, list(interop))
    recipe["export"]["max_seq_len"] = spike_max_seq_len(model)
    name = f"spike-{model.name}-{VARIANT}-ctx{recipe['export']['max_seq_len']}"
    name += "".join(f"-{fmt}" for fmt in interop)
    recipe["artifact"]["name"] = name
    recipe_file = tmp / f"{name}.yaml"
    recipe_file.write_text(json.dumps(recipe, indent=2))
    spec = {
        "kind": "build",
        "recipe": str(recipe_file),
        "out": str(bench_cache_dir() / "artifacts" / name),
        "cache": str(bench_cache_dir() / "stage-cache" / ingot_code_fingerprint()),
    }
    return run_worker(BUILD_WORKER, spec, tmp, BUILD_TIMEOUT_S)
