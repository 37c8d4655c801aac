#!/bin/sh
# Builds build/libks.so, the spike's kernels behind a plain C ABI (loaded with ctypes).
# The ISA is named, not -march=native: this .so is the AVX-512 VNNI build a wheel would ship
# beside a baseline one, picked at import by the CPU's flags.
set -eu
cd "$(dirname "$0")"
mkdir -p build
CXX=${CXX:-g++}
ISA="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mfma -mf16c -mavx2"
# GCC 12's own intrinsic headers trip its (maybe-)uninitialized warnings (`__Y = __Y`), and
# __m512's alignment attribute trips ignored-attributes in a template argument: both noise.
QUIET="-Wno-uninitialized -Wno-maybe-uninitialized -Wno-ignored-attributes"
# shellcheck disable=SC2086
$CXX -std=c++17 -O3 $ISA -pthread -fPIC -shared -fvisibility=hidden -Wall -Wextra $QUIET \
    -o build/libks.so.tmp ./*.cpp "$@"
mv build/libks.so.tmp build/libks.so
