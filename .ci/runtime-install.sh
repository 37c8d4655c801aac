#!/usr/bin/env bash
# CI: the runtime install a production pod gets. Build the wheel, install it WITHOUT extras into
# a fresh virtual environment, check that torch / transformers / onnx are absent, then verify and
# run an artifact that the development environment (.venv, made by the README's test command)
# built earlier in this run. Then (steps 7-9) the same wheel with the `openvino` extra, in another
# fresh environment, runs an artifact built for both engines on OpenVINO, which the base install
# runs on ONNX Runtime. Usage: .ci/runtime-install.sh (from anywhere; needs .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python=${PYTHON:-python3}

if [ ! -x .venv/bin/ingot ]; then
  echo ".venv/bin/ingot is missing: run the README's test command (.ci/run) first" >&2
  exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ingot-runtime-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

step() { echo "+ $*"; }

# 1. The artifact, built by the development environment (torch, transformers, onnx).
step ".venv/bin/ingot build --recipe recipes/demo.yaml --out $tmp/demo --cache-dir $tmp/cache --json"
.venv/bin/ingot build --recipe recipes/demo.yaml --out "$tmp/demo" --cache-dir "$tmp/cache" --json \
  >"$tmp/build.json"
cat "$tmp/build.json"

# 2. The wheel, built from a copy of the tree so that setuptools' build/ and *.egg-info stay out
#    of the checkout.
step "copy the source tree to $tmp/src"
mkdir "$tmp/src"
tar -C "$repo" --exclude=./.git --exclude=./.venv --exclude=./out --exclude=./build \
  --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache --exclude=.ruff_cache \
  --exclude=.hypothesis -cf - . | tar -C "$tmp/src" -xf -
step ".venv/bin/pip wheel -q --no-deps -w $tmp/wheel $tmp/src"
.venv/bin/pip wheel -q --no-deps -w "$tmp/wheel" "$tmp/src"
wheels=("$tmp"/wheel/ingot-*.whl)
if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  echo "expected exactly one ingot wheel in $tmp/wheel, found: ${wheels[*]}" >&2
  exit 1
fi
wheel=${wheels[0]}
echo "  $(basename "$wheel")"

# 3. Its metadata: torch, transformers and onnx are requirements of the `build` extra only.
step "check Requires-Dist of $(basename "$wheel"): build-only packages only under extra == \"build\""
"$python" - "$wheel" <<'EOF'
import re
import sys
import zipfile

BUILD_ONLY = {"torch", "transformers", "onnx", "onnx-ir", "safetensors", "datasets",
              "compressed-tensors"}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    metadata = wheel.read(name).decode()
requires = [line[len("Requires-Dist:"):].strip() for line in metadata.splitlines()
            if line.startswith("Requires-Dist:")]
base, bad = [], []
for req in requires:
    project = re.split(r"[\s;\[<>=!~(]", req, maxsplit=1)[0].lower().replace("_", "-")
    marker = req.partition(";")[2]
    extras = set(re.findall(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker))
    if not extras:
        base.append(project)
    if project in BUILD_ONLY and extras != {"build"}:
        bad.append(req)
assert base, "the wheel declares no base requirements"
assert not bad, f"build-only packages outside the build extra: {bad}"
print("  base requirements:", ", ".join(base))
EOF

# 4. A fresh environment with the base install only.
step "$python -m venv $tmp/runtime"
"$python" -m venv "$tmp/runtime"
step "$tmp/runtime/bin/pip install -q $(basename "$wheel")  # no extras"
"$tmp/runtime/bin/pip" install -q "$wheel"

cd "$tmp"  # nothing of the checkout on sys.path from here on
unset PYTHONPATH
for module in torch transformers onnx; do
  step "$tmp/runtime/bin/python -c 'import $module'  # must fail"
  if "$tmp/runtime/bin/python" -c "import $module" 2>/dev/null; then
    echo "the runtime install can import $module: it must not be installed" >&2
    "$tmp/runtime/bin/pip" list >&2
    exit 1
  fi
done
step "$tmp/runtime/bin/python -c 'import ingot, ingot.runtime'  # the installed wheel, not the checkout"
"$tmp/runtime/bin/python" - <<'EOF'
import sys

import ingot
import ingot.runtime

assert ingot.__file__.startswith(sys.prefix), (ingot.__file__, sys.prefix)
heavy = [m for m in ("torch", "transformers", "onnx") if m in sys.modules]
assert not heavy, heavy
print(f"  {ingot.__file__}")
EOF

# 5. The runtime CLI on the artifact from step 1.
step "$tmp/runtime/bin/ingot verify $tmp/demo"
"$tmp/runtime/bin/ingot" verify "$tmp/demo"
step "$tmp/runtime/bin/ingot inspect $tmp/demo"
"$tmp/runtime/bin/ingot" inspect "$tmp/demo"
step "$tmp/runtime/bin/ingot generate $tmp/demo --prompt 'The os module' --max-tokens 8"
"$tmp/runtime/bin/ingot" generate "$tmp/demo" --prompt "The os module" --max-tokens 8

# 6. The same tokens as the development environment produces from the same artifact.
step "ingot generate --json: runtime install == development install"
"$tmp/runtime/bin/ingot" generate "$tmp/demo" --prompt "The os module" --max-tokens 8 --json \
  >"$tmp/runtime.json"
"$repo/.venv/bin/ingot" generate "$tmp/demo" --prompt "The os module" --max-tokens 8 --json \
  >"$tmp/dev.json"
if ! cmp -s "$tmp/runtime.json" "$tmp/dev.json"; then
  echo "generate differs between the runtime install and .venv:" >&2
  diff "$tmp/runtime.json" "$tmp/dev.json" >&2 || true
  exit 1
fi
cat "$tmp/runtime.json"
echo "runtime install: ok"

# 7. An artifact with both engines, OpenVINO first (recipes/demo-openvino.yaml), built by .venv.
cd "$repo"
step ".venv/bin/ingot build --recipe recipes/demo-openvino.yaml --out $tmp/demo-openvino"
.venv/bin/ingot build --recipe recipes/demo-openvino.yaml --out "$tmp/demo-openvino" \
  --cache-dir "$tmp/cache" >/dev/null
cd "$tmp"

# 8. The wheel with the openvino extra, in a fresh environment: still no torch / onnx.
step "$python -m venv $tmp/runtime-openvino"
"$python" -m venv "$tmp/runtime-openvino"
step "$tmp/runtime-openvino/bin/pip install -q '$(basename "$wheel")[openvino]'"
"$tmp/runtime-openvino/bin/pip" install -q "$wheel[openvino]"
for module in torch transformers onnx; do
  step "$tmp/runtime-openvino/bin/python -c 'import $module'  # must fail"
  if "$tmp/runtime-openvino/bin/python" -c "import $module" 2>/dev/null; then
    echo "the openvino runtime install can import $module: it must not be installed" >&2
    exit 1
  fi
done

# 9. It selects and runs the OpenVINO engine, the base install (no openvino) the ONNX Runtime
#    one; the development install (openvino from the dev extra) makes the same tokens.
step "ingot verify / engine / generate $tmp/demo-openvino: openvino-cpu, onnxruntime-cpu without"
"$tmp/runtime-openvino/bin/ingot" verify "$tmp/demo-openvino"
for env in runtime-openvino runtime; do
  "$tmp/$env/bin/python" - "$tmp/demo-openvino" "$env" <<'EOF'
import sys

from ingot.runtime import LoadedModel

want = {"runtime-openvino": "openvino-cpu", "runtime": "onnxruntime-cpu"}[sys.argv[2]]
model = LoadedModel.load(sys.argv[1], kv_cache_blocks=64)
assert model.engine.name == want, (model.engine.name, want)
heavy = [m for m in ("torch", "transformers", "onnx") if m in sys.modules]
assert not heavy, heavy
print(f"  {sys.argv[2]}: engine {model.engine.name}")
EOF
done
"$tmp/runtime-openvino/bin/ingot" generate "$tmp/demo-openvino" --prompt "The os module" \
  --max-tokens 8 --json >"$tmp/runtime-openvino.json"
"$repo/.venv/bin/ingot" generate "$tmp/demo-openvino" --prompt "The os module" --max-tokens 8 \
  --json >"$tmp/dev-openvino.json"
if ! cmp -s "$tmp/runtime-openvino.json" "$tmp/dev-openvino.json"; then
  echo "generate on openvino differs between the runtime install and .venv:" >&2
  diff "$tmp/runtime-openvino.json" "$tmp/dev-openvino.json" >&2 || true
  exit 1
fi
cat "$tmp/runtime-openvino.json"
echo "runtime install with openvino: ok"
