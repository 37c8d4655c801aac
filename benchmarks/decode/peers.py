"""The decode benchmark's peers: onnxruntime-genai's model (built by its own builder, in its own
virtualenv), OpenVINO GenAI's (optimum-intel's export, in its own virtualenv) and llama.cpp's
(llama-cpp-python, in its own virtualenv, on the GGUF ingot wrote).

Each peer's virtualenv is made by `benchmarks/peers/setup.sh <peer>`; a missing one makes that
peer's rows failed rows that say which command makes it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.decode.models import BenchModel
from benchmarks.harness.paths import bench_cache_dir, missing_peer, peer_version

__all__ = [
    "LLAMA_CPP",
    "LLAMA_CPP_DISTRIBUTION",
    "OPENVINO_GENAI",
    "OPENVINO_GENAI_EXPORT_OPTIONS",
    "ORTGENAI",
    "ORTGENAI_BUILDER_OPTIONS",
    "build_ortgenai",
    "export_openvino_genai",
    "set_ortgenai_threads",
]

ORTGENAI = "onnxruntime-genai"  # benchmarks/peers/onnxruntime-genai.txt
LLAMA_CPP = "llama-cpp"  # benchmarks/peers/llama-cpp.txt
LLAMA_CPP_DISTRIBUTION = "llama-cpp-python"
OPENVINO_GENAI = "openvino-genai"  # benchmarks/peers/openvino-genai.txt (also its distribution)
# int4 g32 symmetric on every linear, embeddings and lm_head included (`--all-layers`, `--ratio
# 1.0`: no layer left at int8): the nearest of optimum-intel's exports to ingot's weights.
OPENVINO_GENAI_EXPORT_OPTIONS = [
    "--task",
    "text-generation-with-past",
    "--weight-format",
    "int4",
    "--group-size",
    "32",
    "--sym",
    "--ratio",
    "1.0",
    "--all-layers",
]
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
    record: dict[str, Any] = {"version": version}
    if version is None:
        return record | missing_peer(ORTGENAI, ORTGENAI, python), None
    out = _cached_dir("ortgenai", model, [version, ORTGENAI_BUILDER_OPTIONS])
    command = ["python", "-m", "onnxruntime_genai.models.builder", "-m", str(model.path)]
    command += ["-o", str(out), *ORTGENAI_BUILDER_OPTIONS]
    record["command"] = " ".join(command)
    cache = out.with_name(out.name + ".cache")
    try:
        return _build_once(
            record,
            out,
            "genai_config.json",
            lambda work: [str(python), *command[1:6], str(work), *command[7:], "-c", str(cache)],
            timeout_s,
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def export_openvino_genai(
    model: BenchModel, python: Path, timeout_s: float
) -> tuple[dict[str, Any], Path | None]:
    """optimum-intel's OpenVINO export of the same local checkpoint (the model OpenVINO GenAI
    runs), by the peer's own interpreter; kept in the benchmark cache, keyed by the versions of
    the exporter, the compressor and OpenVINO, its options and the checkpoint."""
    names = (OPENVINO_GENAI, "optimum-intel", "nncf", "openvino")
    versions = [peer_version(python, name) for name in names]
    record: dict[str, Any] = {
        "version": versions[0],
        "versions": dict(zip(names, versions, strict=True)),
    }
    if None in versions:
        return record | missing_peer(OPENVINO_GENAI, OPENVINO_GENAI, python), None
    out = _cached_dir("openvino-genai", model, [versions, OPENVINO_GENAI_EXPORT_OPTIONS])
    command = ["optimum-cli", "export", "openvino", "--model", str(model.path)]
    command += [*OPENVINO_GENAI_EXPORT_OPTIONS, str(out)]
    record["command"] = " ".join(command)
    cli = Path(python).with_name("optimum-cli")  # the console script beside the interpreter
    argv = lambda work: [str(cli), *command[1:-1], str(work)]  # noqa: E731
    return _build_once(record, out, "openvino_model.xml", argv, timeout_s)


def _cached_dir(kind: str, model: BenchModel, settings: list[Any]) -> Path:
    """Where a peer's build of `model` with `settings` lives in the benchmark cache."""
    key = json.dumps([settings, str(model.path), _checkpoint_stamp(model.path)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return bench_cache_dir() / kind / f"{model.name}-{digest}"


def _build_once(
    record: dict[str, Any],
    out: Path,
    marker: str,
    argv: Callable[[Path], list[str]],
    timeout_s: float,
) -> tuple[dict[str, Any], Path | None]:
    """`out`, made unless it holds `marker` already: `argv(work)` writes into a work directory
    beside it, moved in place when it succeeds (an interrupted build never looks finished)."""
    if (out / marker).exists():
        return record | {"ok": True, "cached": True, "seconds": 0.0}, out
    work = out.with_name(out.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    started = time.perf_counter()
    try:
        proc = subprocess.run(argv(work), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        return record | {"ok": False, "error": f"{type(e).__name__}: {e}"}, None
    if proc.returncode != 0 or not (work / marker).exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        shutil.rmtree(work, ignore_errors=True)
        return record | {"ok": False, "error": f"exit {proc.returncode}: {tail}"}, None
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    return record | {"ok": True, "cached": False, "seconds": time.perf_counter() - started}, out


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
