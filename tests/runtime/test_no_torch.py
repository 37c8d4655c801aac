import subprocess
import sys

# A fresh interpreter: this test process has torch loaded by other tests.
_CHECK = """
import importlib, pkgutil, sys
import ingot.runtime
# Every module, the engine plug-ins' (onnxruntime, openvino) and the server's included.
modules = list(pkgutil.walk_packages(ingot.runtime.__path__, "ingot.runtime."))
for module in modules:
    importlib.import_module(module.name)
heavy = [m for m in ("torch", "transformers", "onnx") if m in sys.modules]
build = [m for m in sys.modules if m.startswith(("ingot.pipeline", "ingot.calibration"))]
assert not heavy and not build, (heavy, build)
print(len(modules))
"""


def test_runtime_imports_no_torch_transformers_onnx_or_build_packages():
    result = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 50  # every runtime module was imported
