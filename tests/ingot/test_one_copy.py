"""One copy of each weight (issue 28): the artifact ships the onnxruntime engine's graph as the
only copy of the weights, the portable graph only where the recipe asks (`artifact.portable`)
or an engine built at load has nothing else to read; the openvino engine reads the onnxruntime
engine's copy where there is one (greedy equal to ONNX Runtime's, both exact), the portable
graph otherwise, and an artifact written before (both copies, the openvino record naming
model.onnx) still loads."""

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ingot.artifacts import verify_artifact
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.runtime import LoadedModel, SamplingParams

from fixtures import make_checkpoint, with_openvino, write_recipe

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["def add(a, b):", "The quick brown fox"]
KV32 = {"dtype": "fp32", "block_size": 32}  # OpenVINO's block size
ORT_EXACT = {"engine": "onnxruntime", "matmul_accuracy_level": 0}
OV_EXACT = {"engine": "openvino", "dynamic_quantization": False}  # f32: exact
ORT_FILE = "engines/onnxruntime-cpu/model.onnx"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama checkpoint, a stage cache its builds share, and a builder of artifacts."""
    tmp = tmp_path_factory.mktemp("onecopy")
    ckpt, cache = make_checkpoint(tmp / "ckpt", "llama"), StageCache(tmp / "cache")

    def artifact(name: str, targets: list[dict], portable: bool | None = None) -> Path:
        extra = {} if portable is None else {"portable": portable}
        recipe = write_recipe(
            tmp / f"{name}.yaml",
            ckpt,
            kv_cache=KV32,
            targets=targets,
            artifact={"name": "tiny", **extra},
        )
        return build(recipe, tmp / name, cache=cache).artifact

    return artifact


def _greedy(artifact: Path, engine: str | None = None) -> list[list[int]]:
    generator = LoadedModel.load(artifact, engine=engine).generator()
    return [c.token_ids for c in generator.generate(PROMPTS, GREEDY)]


def _initializer_digests(artifact: Path) -> dict[str, list[str]]:
    """{sha256 of an initializer's values: the ONNX files holding it} for every initializer
    of at least 1 KiB in the artifact's ONNX files."""
    held: dict[str, list[str]] = {}
    for path in sorted(artifact.rglob("*.onnx")):
        for tensor in onnx.load(str(path)).graph.initializer:
            values = numpy_helper.to_array(tensor)
            if values.nbytes >= 1024:
                digest = hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()
                held.setdefault(digest, []).append(path.relative_to(artifact).as_posix())
    return held


def test_the_artifact_holds_each_weight_once(tiny):
    artifact = tiny("one", [ORT_EXACT])
    manifest = verify_artifact(artifact)
    assert not (artifact / "model.onnx").exists() and not (artifact / "model.onnx.data").exists()
    assert manifest.graph.path == ORT_FILE  # the interface's file: the engine's
    assert manifest.engines[0].path == ORT_FILE
    assert manifest.engines[0].build["graph_initializers"] is True
    held = _initializer_digests(artifact)
    assert held and all(len(files) == 1 for files in held.values())
    assert _greedy(artifact)  # it runs


def test_a_recipe_asking_for_the_portable_graph_ships_it(tiny):
    one, both = tiny("one", [ORT_EXACT]), tiny("both", [ORT_EXACT], portable=True)
    manifest = verify_artifact(both)
    assert manifest.graph.path == "model.onnx" and (both / "model.onnx.data").is_file()
    assert manifest.engines[0].path == ORT_FILE
    # The same weights twice (the embedding, the norms: the float ones keep their bytes).
    assert any(len(files) == 2 for files in _initializer_digests(both).values())
    assert _greedy(both) == _greedy(one)


def test_openvino_reads_the_onnxruntime_engines_copy(tiny):
    artifact = tiny("ov-ort", [ORT_EXACT, OV_EXACT])
    manifest = json.loads((artifact / "manifest.json").read_text())
    ov = next(e for e in manifest["engines"] if e["engine"] == "openvino")
    assert ov["path"] == ORT_FILE
    if "reads" in ov:  # helper store's EngineInfo.reads
        assert ov["reads"] == ["engine:onnxruntime-cpu"]
    assert not (artifact / "model.onnx").exists()
    assert _greedy(artifact, "openvino-cpu") == _greedy(artifact, "onnxruntime-cpu")


def test_openvino_reads_a_tied_int8_table_from_the_onnxruntime_engine(tmp_path):
    # The engine's lookup reads lm_head's MatMulNBits weights (the table once:
    # engines/onnxruntime/shared_embedding.py); OpenVINO builds both from those constants.
    ckpt = make_checkpoint(tmp_path / "ckpt", "llama", tie_word_embeddings=True)
    layers = {"method": "rtn", "bits": 4, "group_size": 32, "targets": ["re:layers\\..*"]}
    heads = {"method": "rtn", "bits": 8, "group_size": -1, "ignore": []}
    heads["targets"] = ["embed_tokens", "lm_head"]
    recipe = write_recipe(
        tmp_path / "r.yaml",
        ckpt,
        quantize=[layers, heads],
        kv_cache=KV32,
        targets=[ORT_EXACT, OV_EXACT],
    )
    artifact = build(recipe, tmp_path / "out", cache=StageCache(tmp_path / "cache")).artifact
    graph = onnx.load(str(artifact / ORT_FILE), load_external_data=False).graph
    table = [t.name for t in graph.initializer if t.name.startswith("embed_tokens.codes")]
    assert table == ["embed_tokens.codes_t_T"]
    assert _greedy(artifact, "openvino-cpu") == _greedy(artifact, "onnxruntime-cpu")


def test_openvino_alone_reads_the_portable_graph(tiny):
    artifact = tiny("ov", [OV_EXACT])
    manifest = verify_artifact(artifact)
    assert manifest.graph.path == "model.onnx" and (artifact / "model.onnx.data").is_file()
    assert manifest.engines[0].path == "model.onnx"
    reference = _greedy(tiny("ov-ort", [ORT_EXACT, OV_EXACT]), "onnxruntime-cpu")
    assert _greedy(artifact) == reference


def test_an_artifact_with_both_copies_still_loads(tiny, tmp_path):
    # As written before one copy: model.onnx beside the engine, openvino reading model.onnx.
    both = tiny("both", [ORT_EXACT], portable=True)
    old = with_openvino(both, tmp_path / "old")
    ov = verify_artifact(old).engines[-1]
    assert ov.engine == "openvino" and ov.path == "model.onnx"
    assert _greedy(old, "openvino-cpu") == _greedy(old, "onnxruntime-cpu")


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads Linux's /proc maps")
def test_a_load_maps_the_engines_weights_file(tiny):
    # The session opens the engine file by path and ONNX Runtime maps its external data
    # (prepacking then copies MatMulNBits' weights into the kernel's layout, once, at load):
    # no weight passes through Python.
    artifact = tiny("one", [ORT_EXACT])
    data = str((artifact / f"{ORT_FILE}.data").resolve())
    assert data not in Path("/proc/self/maps").read_text()
    model = LoadedModel.load(artifact)
    assert data in Path("/proc/self/maps").read_text()
    del model


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads Linux's /proc fds")
def test_a_load_reads_the_engines_weights_ahead(tiny, monkeypatch):
    import os

    asked: list[tuple[str, int]] = []
    real = os.posix_fadvise

    def recording(fd, offset, length, advice):
        asked.append((os.readlink(f"/proc/self/fd/{fd}"), advice))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    artifact = tiny("one", [ORT_EXACT])
    LoadedModel.load(artifact)
    data = str((artifact / f"{ORT_FILE}.data").resolve())
    assert (data, os.POSIX_FADV_WILLNEED) in asked
