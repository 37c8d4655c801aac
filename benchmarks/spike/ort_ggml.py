"""ingot's ONNX Runtime engine with the `onnxruntime-ggml` execution provider (ggml's kernels
behind ONNX Runtime's plug-in EP API) put first on every session: issue 27's "also worth a
look". Runs in its own virtualenv, which the benchmark's `--ort-ggml-python` names:

    python3 -m venv V && V/bin/pip install onnxruntime-ggml && V/bin/pip install -e .

onnxruntime-ggml 0.2.0 pins `onnxruntime>=1.29,<1.31` (it installs 1.30.0), while the
artifact's engine records `onnxruntime>=1.32`: its compatibility check is lifted here, for the
experiment only. The provider claims a graph only when it has every op (its `partial=1` claims
the rest and leaves ONNX Runtime to copy at each boundary); `ORT_GGML_LOG=debug` says which ops
it lacks.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ingot_on_ggml", "use_ggml_provider"]

THREADS = 2


def use_ggml_provider(threads: int = THREADS) -> dict[str, Any]:
    """Make every InferenceSession this process opens put the ggml provider first (ingot's
    engine asks for the CPU provider alone), and let an engine recorded for a newer
    onnxruntime load; what was installed, for the report."""
    import onnxruntime as ort
    import onnxruntime_ggml as ggml

    import ingot.runtime.engines.onnxruntime as ort_engine

    original = ort.InferenceSession

    def session(path: Any, sess_options: Any = None, providers: Any = None, **kw: Any) -> Any:
        options = ggml.session_options({"device": "cpu", "threads": threads}, base=sess_options)
        return original(path, options, **kw)

    ort.InferenceSession = session
    ort_engine.problems = lambda engine, host: []
    return {"onnxruntime": ort.__version__, "onnxruntime_ggml": ggml.__version__}


def load_ingot_on_ggml(**load: Any) -> Any:
    """The decode worker's `ingot` engine (a sized pool over the artifact) on the ggml
    provider; its info names the providers the session holds."""
    from benchmarks.spike.openvino_worker import load_ingot

    versions = use_ggml_provider(load.get("threads", THREADS))
    run = load_ingot(**load)
    run.info = run.info | versions  # type: ignore[attr-defined]
    return run
