from types import SimpleNamespace

import pytest

from ingot.artifacts import EngineInfo
from ingot.runtime.engine_select import HostInfo, NoCompatibleEngine, select_engine
from ingot.runtime.engines.base import version_satisfies

HOST = HostInfo(frozenset({"sse4_2", "avx2", "fma"}), {"onnxruntime": "1.31.1"})
# A kind the manifest format knows but no runtime plug-in runs (runtime/engines/).
NO_RUNTIME = "this runtime cannot run tensorrt engines (it runs: onnxruntime, openvino)"


def _engine(name, engine="onnxruntime", device="cpu", **requires):
    return EngineInfo(
        name=name,
        engine=engine,
        device=device,
        path=f"engines/{name}/model.onnx",
        requires=requires,
    )


def _manifest(*engines):
    return SimpleNamespace(engines=list(engines))


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("1.31.1", ">=1.31,<2", True),
        ("1.30.9", ">=1.31,<2", False),
        ("2.0.0", ">=1.31,<2", False),
        ("2", "<2.0", False),
        ("1.32.0.dev20250101", ">=1.31,<2", True),
        ("1.31.1", "==1.31.1", True),
        ("1.31.1", "1.31.1", True),
        ("1.31.1", "!=1.31.1", False),
        ("1.31.1", ">1.31", True),
        ("1.31.0", "<=1.31", True),
    ],
)
def test_version_satisfies(version, spec, ok):
    assert version_satisfies(version, spec) is ok


def test_unparseable_requirement():
    with pytest.raises(ValueError, match="~1"):
        version_satisfies("1.0", "~1")


def test_first_compatible_engine_wins_and_skips_are_explained():
    manifest = _manifest(
        _engine("trt-h100", engine="tensorrt", device="cuda"),
        _engine("ort-avx512", onnxruntime=">=1.31,<2", cpu_isa=["avx2", "avx512f"]),
        _engine("ort-avx2", onnxruntime=">=1.31,<2", cpu_isa=["avx2", "fma"]),
        _engine("ort-any"),
    )
    engine, skipped = select_engine(manifest, HOST)
    assert engine.name == "ort-avx2"
    assert skipped == [f"trt-h100: {NO_RUNTIME}", "ort-avx512: CPU lacks avx512f"]


def test_no_compatible_engine_lists_every_engine_and_why():
    manifest = _manifest(
        _engine("old", onnxruntime=">=1.20,<1.25"),
        _engine("gpu", device="cuda"),
        _engine("future", onnxruntime=">=1.31,<2", needs_magic=True),
        _engine("trt", engine="tensorrt", device="cuda"),
    )
    with pytest.raises(NoCompatibleEngine) as info:
        select_engine(manifest, HostInfo(frozenset(), {"onnxruntime": "1.31.1"}))
    reasons = info.value.reasons
    assert reasons["old"] == ["needs onnxruntime >=1.20,<1.25, found 1.31.1"]
    assert "cpu only" in reasons["gpu"][0]
    assert reasons["future"] == ["unknown requirements ['needs_magic']"]
    assert reasons["trt"] == [NO_RUNTIME]
    message = str(info.value)
    assert all(f"- {name}:" in message for name in ("old", "gpu", "future", "trt"))


def test_detect_reads_this_host():
    host = HostInfo.detect(("onnxruntime",))
    import onnxruntime

    assert host.libraries == {"onnxruntime": onnxruntime.__version__}
    engine, _ = select_engine(_manifest(_engine("ort", onnxruntime=">=1.0")), host)
    assert engine.name == "ort"
    without = HostInfo(host.cpu_flags, {"onnxruntime": None})
    with pytest.raises(NoCompatibleEngine) as info:
        select_engine(_manifest(_engine("ort")), without)
    assert info.value.reasons["ort"] == ["onnxruntime is not installed"]


def test_a_kind_without_a_runtime_plugin_is_skipped_on_this_host():
    manifest = _manifest(_engine("trt", engine="tensorrt", device="cuda"), _engine("ort"))
    engine, skipped = select_engine(manifest)  # this host: the libraries the kinds read
    assert engine.name == "ort"
    assert skipped == [f"trt: {NO_RUNTIME}"]
