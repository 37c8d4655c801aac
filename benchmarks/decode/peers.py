"""The decode benchmark's peers: onnxruntime-genai's model (built by its own builder, in its own
virtualenv) and llama.cpp's (llama-cpp-python, in its own virtualenv, on the GGUF ingot wrote).

Each peer's virtualenv is made by `benchmarks/peers/setup.sh <peer>`; a missing one makes that
peer's rows failed rows that say which command makes it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.decode.models import BenchModel
from benchmarks.harness.paths import bench_cache_dir, missing_peer, peer_version

__all__ = [
    "LLAMA_CPP",
    "LLAMA_CPP_DISTRIBUTION",
    "ORTGENAI",
    "ORTGENAI_BUILDER_OPTIONS",
    "build_ortgenai",
    "set_ortgenai_threads",
]

ORTGENAI = "onnxruntime-genai"  # benchmarks/peers/onnxruntime-genai.txt
LLAMA_CPP = "llama-cpp"  # benchmarks/peers/llama-cpp.txt
LLAMA_CPP_DISTRIBUTION = "llama-cpp-python"
# int4 g32 symmetric (the builder's default symmetry), lm_head included (its default), MatMulNBits
# accuracy level 4: the settings of the ingot recipe.
ORTGENAI_BUILDER_OPTIONS = [
    "-p",
    "int4",
    "-e",
    "cpu",
    "--extra_options",
    "int4_block_size=32",
    "int4_accuracy_level=4",
]


def build_ortgenai(
    model: BenchModel, python: Path, timeout_s: float
) -> tuple[dict[str, Any], Path | None]:
    """onnxruntime-genai's model builder on the same local checkpoint, run by the peer's own
    interpreter; the output is kept in the benchmark cache, keyed by the builder's version, its
    options and the checkpoint's config."""
    version = peer_version(python, ORTGENAI)
    command = ["python", "-m", "onnxruntime_genai.models.builder", "-m", str(model.path)]
    record: dict[str, Any] = {"version": version}
    if version is None:
        return record | missing_peer(ORTGENAI, ORTGENAI, python), None
    key = hashlib.sha256(
        json.dumps(
            [version, ORTGENAI_BUILDER_OPTIONS, str(model.path), _checkpoint_stamp(model.path)]
        ).encode()
    ).hexdigest()[:12]
    out = bench_cache_dir() / "ortgenai" / f"{model.name}-{key}"
    command += ["-o", str(out), *ORTGENAI_BUILDER_OPTIONS]
    record["command"] = " ".join(command)
    if (out / "genai_config.json").exists():
        return record | {"ok": True, "cached": True, "seconds": 0.0}, out
    work = out.with_name(out.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    cache = out.with_name(out.name + ".cache")
    argv = [str(python), *command[1:]]
    argv[argv.index(str(out))] = str(work)
    argv += ["-c", str(cache)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        return record | {"ok": False, "error": f"{type(e).__name__}: {e}"}, None
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if proc.returncode != 0 or not (work / "genai_config.json").exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        shutil.rmtree(work, ignore_errors=True)
        return record | {"ok": False, "error": f"exit {proc.returncode}: {tail}"}, None
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    return record | {"ok": True, "cached": False}, out


def set_ortgenai_threads(model_dir: Path, threads: int) -> dict[str, Any]:
    """The decoder session's intra-op threads, as every engine gets; the search options the
    builder wrote (the benchmark overrides max/min length per run)."""
    path = model_dir / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = threads
    path.write_text(json.dumps(config, indent=4))
    return {"session_options": options, "search": config.get("search", {})}


def _checkpoint_stamp(path: Path) -> list[Any]:
    """What identifies the checkpoint's contents cheaply: file names, sizes, config.json."""
    files = sorted(p for p in path.iterdir() if p.is_file())
    return [(p.name, p.stat().st_size) for p in files] + [(path / "config.json").read_text()]
