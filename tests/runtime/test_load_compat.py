"""An artifact whose engines cannot run here is a clear NoCompatibleEngine through
LoadedModel.load, not a crash inside an engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ingot.artifacts import EngineInfo, read_manifest, write_manifest
from ingot.runtime import LoadedModel
from ingot.runtime.engine_select import NoCompatibleEngine

from fixtures import make_checkpoint, write_recipe


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    work = tmp_path_factory.mktemp("compat")
    recipe = write_recipe(work / "r.yaml", make_checkpoint(work / "ckpt"))
    return build(recipe, work / "tiny", cache=StageCache(work / "cache")).artifact


def with_engines(built: Path, tmp_path: Path, engines: list[dict], files: dict[str, bytes]):
    root = Path(shutil.copytree(built, tmp_path / "artifact"))
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    fields = read_manifest(root).model_dump(mode="json", exclude={"files"})
    write_manifest(root, {**fields, "engines": engines})
    return root


def test_only_a_tensorrt_engine_is_no_compatible_engine(built, tmp_path):
    requires = {"tensorrt": "==10.14.1", "cuda": ">=12.8", "compute_capability": "9.0"}
    documented = EngineInfo.model_fields["requires"].description  # the format's keys
    assert all(f'"{key}"' in documented for key in requires)
    trt = {
        "name": "tensorrt-cuda",
        "engine": "tensorrt",
        "device": "cuda",
        "path": "engines/tensorrt-cuda/model.plan",
        "requires": requires,
    }
    root = with_engines(built, tmp_path, [trt], {trt["path"]: b"not really a plan"})
    assert json.loads((root / "manifest.json").read_text())["engines"][0]["requires"] == requires
    runs = r"\(it runs: onnxruntime, openvino\)"
    reason = rf"tensorrt-cuda: this runtime cannot run tensorrt engines {runs}"
    with pytest.raises(NoCompatibleEngine, match=reason) as e:
        LoadedModel.load(root)
    assert list(e.value.reasons) == ["tensorrt-cuda"]


def test_an_onnxruntime_engine_for_another_version_is_no_compatible_engine(built, tmp_path):
    ort = read_manifest(built).engines[0].model_dump(mode="json")
    ort["requires"] = {**ort["requires"], "onnxruntime": ">=99"}
    root = with_engines(built, tmp_path, [ort], {})
    with pytest.raises(NoCompatibleEngine, match=r"needs onnxruntime >=99, found \d"):
        LoadedModel.load(root)
