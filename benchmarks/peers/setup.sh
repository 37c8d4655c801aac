#!/usr/bin/env bash
# Creates each peer's virtualenv, benchmarks/.venvs/<peer>, from benchmarks/peers/<peer>.txt.
#
#   benchmarks/peers/setup.sh                  # every peer
#   benchmarks/peers/setup.sh llmcompressor    # one (onnxruntime-genai, ...)
#
# PYTHON picks the base interpreter (default python3). A file that pins torch gets it installed
# first, alone, so the rest resolves against it; set TORCH_INDEX_URL (for example
# https://download.pytorch.org/whl/cpu) to take it from the CPU-only index. A line
# `#setup.sh: uninstall PKG...` in the file removes those packages after the install (a peer's
# dependencies whose wheels do not match the pinned torch: vllm). A line
# `#setup.sh: install-repository` installs this repository (ingot's runtime, editable) too.
# The benchmarks find these virtualenvs by default (benchmarks/harness/paths.py: peer_python)
# and run their workers there with the repository on PYTHONPATH (benchmarks/harness/launch.py);
# --<peer>-python options point elsewhere.
set -euo pipefail

peers_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venvs_dir="$(dirname "$peers_dir")/.venvs"
python="${PYTHON:-python3}"

if [ "$#" -eq 0 ]; then
    for file in "$peers_dir"/*.txt; do
        set -- "$@" "$(basename "$file" .txt)"
    done
fi

for peer in "$@"; do
    requirements="$peers_dir/$peer.txt"
    if [ ! -f "$requirements" ]; then
        echo "unknown peer '$peer': no $requirements" >&2
        exit 2
    fi
    venv="$venvs_dir/$peer"
    echo "== $peer -> $venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --upgrade pip
    torch_pin="$(grep -E '^torch==' "$requirements" || true)"
    if [ -n "$torch_pin" ]; then
        "$venv/bin/python" -m pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$torch_pin"
    fi
    "$venv/bin/python" -m pip install -r "$requirements"
    if grep -q '^#setup\.sh: install-repository$' "$requirements"; then
        "$venv/bin/python" -m pip install -e "$(dirname "$(dirname "$peers_dir")")"
    fi
    uninstall="$(sed -n 's/^#setup\.sh: uninstall //p' "$requirements")"
    if [ -n "$uninstall" ]; then
        # shellcheck disable=SC2086 # one package per word
        "$venv/bin/python" -m pip uninstall -y $uninstall
    fi
done
