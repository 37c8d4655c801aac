#!/usr/bin/env bash
# Builds llama.cpp's HTTP server (`llama-server`) into benchmarks/.venvs/llama-server/bin/, from
# the llama.cpp sources vendored in the llama-cpp-python sdist that llama-cpp.txt pins (the
# same ggml the llama.cpp decode rows run): no wheel ships the server binary. Needs cmake, ninja
# and a C++ compiler; about 15 minutes on 2 cores.
#
#   benchmarks/peers/llama-server.sh
#
# benchmarks/serve/http_engines.py finds the binary there (--llama-server points elsewhere).
set -euo pipefail

peers_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$(dirname "$peers_dir")/.venvs/llama-server"
python="${PYTHON:-python3}"
pin="$(grep -E '^llama-cpp-python==' "$peers_dir/llama-cpp.txt")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --no-binary :all: --no-deps "$pin" -d "$work"
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
source_dir="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF
cmake --build "$work/build" --target llama-server -j "$(nproc)"
mkdir -p "$out/bin"
cp "$work/build/bin/llama-server" "$out/bin/llama-server"
echo "$pin" > "$out/version.txt"
"$out/bin/llama-server" --version
