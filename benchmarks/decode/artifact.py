"""The ingot artifact the decode benchmark runs, as a worker spec, and where its GGUF lies.

One recipe for every model: RTN int4 g32 symmetric on every linear, lm_head included; the
ONNX Runtime CPU engine at level `extended` with MatMulNBits accuracy level 4 (int8
activations, what onnxruntime-genai and llama.cpp use on CPU); and, where this ingot has the
format, `interop: [gguf]`: the same quantized weights as llama.cpp's Q4_0, for the llama.cpp
rows. The recipe is written on the fly; the stage cache and outputs live under the benchmark
cache (outside the repository), so a second run rebuilds nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from benchmarks.decode.models import BenchModel
from benchmarks.harness.launch import run_worker
from benchmarks.harness.paths import bench_cache_dir

__all__ = [
    "DecodeArtifact",
    "KV_BLOCK_SIZE",
    "MATMUL_ACCURACY_LEVEL",
    "OPTIMIZATION_LEVEL",
    "VARIANT",
    "WORKER",
    "build_decode_artifact",
    "build_spec",
    "decode_recipe",
    "export_max_seq_len",
    "find_gguf",
    "gguf_available",
    "ingot_code_fingerprint",
    "openvino_available",
    "prune_stale_caches",
]

MAX_SEQ_LEN = 1024  # at most: the prompts and outputs of every case fit; pydoc-16m's maximum
KV_BLOCK_SIZE = 16
OPENVINO = "openvino"  # the second engine's recipe target (issue 27)
OPTIMIZATION_LEVEL = "extended"  # what recipes/demo.yaml ships (level "all" pins the CPU ISA)
MATMUL_ACCURACY_LEVEL = 4
VARIANT = "int4-g32-acc4"  # the artifact's name suffix
WORKER = "benchmarks.decode.engines"  # builds the artifact (spec kind "build"), runs engines


@dataclass(frozen=True, slots=True)
class DecodeArtifact:
    """What varies between the benchmarks' artifacts of one recipe: the pool's block size, the
    longest sequence (capped at the model's own context) and the OpenVINO target beside ONNX
    Runtime's. The defaults are the artifact every other benchmark builds."""

    block_size: int = KV_BLOCK_SIZE
    max_seq_len: int = MAX_SEQ_LEN
    openvino: bool = False

    def suffix(self) -> str:
        """The artifact directory's name beyond the variant: empty for the defaults."""
        parts = [f"kv{self.block_size}"] if self.block_size != KV_BLOCK_SIZE else []
        parts += [f"ctx{self.max_seq_len}"] if self.max_seq_len != MAX_SEQ_LEN else []
        parts += ["ov"] if self.openvino else []
        return "".join(f"-{p}" for p in parts)


def export_max_seq_len(model: BenchModel, max_seq_len: int = MAX_SEQ_LEN) -> int:
    config = json.loads((model.path / "config.json").read_text())
    return min(max_seq_len, config["max_position_embeddings"])


def gguf_available() -> bool:
    """Whether this ingot writes GGUF (`interop: [gguf]`)."""
    from ingot.pipeline.interop import FORMATS

    return "gguf" in FORMATS and importlib.util.find_spec("ingot.pipeline.interop.gguf") is not None


def openvino_available() -> bool:
    """Whether this ingot builds OpenVINO engines (the `openvino` recipe target)."""
    from ingot.pipeline.engines import ENGINE_BUILDERS

    return OPENVINO in ENGINE_BUILDERS


def build_spec(
    model: BenchModel,
    tmp: Path,
    threads: int,
    interop: list[str],
    shape: DecodeArtifact = DecodeArtifact(),
) -> dict[str, Any]:
    """Worker spec that builds the artifact (the recipe is written into tmp), its engines
    running on `threads` threads, with the `interop` formats, of `shape`."""
    name = f"{model.name}-{VARIANT}{shape.suffix()}"
    recipe = tmp / f"{name}.yaml"
    recipe.write_text(json.dumps(decode_recipe(model, threads, interop, shape), indent=2))
    return {
        "kind": "build",
        "recipe": str(recipe),
        "out": str(bench_cache_dir() / "artifacts" / name),
        "cache": str(bench_cache_dir() / "stage-cache" / ingot_code_fingerprint()),
    }


def build_decode_artifact(model: BenchModel, tmp: Path, threads: int, timeout_s: float) -> str:
    """The path of `model`'s decode artifact (no interop formats), built by the engines worker
    (engines.py) into the benchmark cache unless it is there; exits saying why if the build
    fails."""
    spec = build_spec(model, tmp, threads, [])
    built = run_worker(WORKER, spec, tmp, timeout_s)
    if not built.get("ok"):
        raise SystemExit(f"{model.name}: ingot build failed: {built.get('error')}")
    return built["artifact"]


def find_gguf(artifact: str | Path) -> Path | None:
    """The GGUF file the `gguf` interop format wrote into the artifact, if any."""
    files = sorted((Path(artifact) / "interop" / "gguf").glob("*.gguf"))
    return files[0] if files else None


@cache
def ingot_code_fingerprint() -> str:
    """Digest of the build code's sources.

    Stage keys name ingot by its version only, so an edited checkout would reuse stages built
    by older code; a cache per source digest keeps the benchmark from timing stale artifacts.
    """
    import ingot.pipeline

    root = Path(ingot.pipeline.__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in ("pipeline", "artifacts"):
        for file in sorted((root / package).rglob("*.py")):
            digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def prune_stale_caches() -> list[str]:
    """Remove stage caches built by other versions of the code (GBs each), and the what-if
    engines of earlier versions of this benchmark."""
    current = ingot_code_fingerprint()
    stale = [p for p in (bench_cache_dir() / "stage-cache").glob("*") if p.name != current]
    stale += [p for p in [bench_cache_dir() / "what-if-engines"] if p.exists()]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return [str(p) for p in stale]


def decode_recipe(
    model: BenchModel, threads: int, interop: list[str], shape: DecodeArtifact = DecodeArtifact()
) -> dict:
    """The decode benchmarks' recipe (RTN int4 g32 symmetric, lm_head included, KV fp32, ORT
    CPU at MatMulNBits accuracy level 4, then OpenVINO's CPU plugin if `shape` says so) of
    `model` on `threads` threads, with `interop`."""
    recipe = {  # JSON is YAML: the recipe loader reads it as is
        # Absolute: the recipe is read from a temporary directory, and a relative source path
        # would be taken relative to it.
        "source": {"path": str(model.path.resolve())},
        "quantize": [
            {
                "method": "rtn",
                "bits": 4,
                "group_size": 32,
                "symmetric": True,
                "targets": ["re:.*"],
                "ignore": [],  # rtn ignores lm_head unless told otherwise
            }
        ],
        "kv_cache": {"dtype": "fp32", "block_size": shape.block_size},
        "export": {"max_seq_len": export_max_seq_len(model, shape.max_seq_len)},
        "targets": [
            {
                "engine": "onnxruntime",
                "device": "cpu",
                "optimization_level": OPTIMIZATION_LEVEL,
                "intra_op_num_threads": threads,
                "matmul_accuracy_level": MATMUL_ACCURACY_LEVEL,
            }
        ],
        "artifact": {"name": f"bench-{model.name}-{VARIANT}", "version": "0.0.0"},
    }
    if shape.openvino:
        # Listed second: the runtime picks the first compatible engine unless told otherwise,
        # so a plain load stays on ONNX Runtime; the benchmark names the engine it times. f32
        # activations (the KV is fp32) quantized to int8 in groups of 32 in the int4 matmuls,
        # as MatMulNBits' accuracy level 4 does.
        openvino = {"engine": OPENVINO, "device": "cpu", "inference_precision": "f32"}
        openvino |= {"dynamic_quantization": True, "num_threads": threads}
        recipe["targets"].append(openvino)
    if interop:
        recipe["interop"] = list(interop)
    return recipe
