#!/bin/sh
# The runtime-only install (no torch, transformers or onnx): the ingot wheel in WHEEL_DIR with
# the runtime's EXTRAS (default openvino; "" for ONNX Runtime alone), into whichever python and
# pip come first on PATH, then checked. deploy/Containerfile runs it in the image;
# tests/deploy/test_container.py runs it in a fresh virtual environment, where no container
# builder works (docs/notes/servplan.md). Usage: install-runtime.sh WHEEL_DIR [EXTRAS]
set -eu
wheel_dir=$1
extras=${2-openvino}
set -- "$wheel_dir"/ingot-*.whl
if [ "$#" -ne 1 ] || [ ! -f "$1" ]; then
  echo "expected exactly one ingot wheel in $wheel_dir, found: $*" >&2
  exit 1
fi
pip install --no-cache-dir "$1${extras:+[$extras]}"
python - <<'PY'
import importlib.util

heavy = [m for m in ("torch", "transformers", "onnx") if importlib.util.find_spec(m)]
assert not heavy, f"the runtime install has {heavy}: they belong to the build extra"
PY
ingot --version
