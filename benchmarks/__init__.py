"""ingot's benchmarks against its peers, grouped by what they measure: decode, serve, quantize,
scale, speculative, interop (vLLM / llama.cpp as consumers of ingot's exports).

Each benchmark is a module run from the repository root as `python -m benchmarks.<group>.<name>`
(`--help` lists its options) and writes benchmarks/results/<name>.json and .md. They share one
harness (benchmarks.harness): interleaved rounds, the quiet-host rule, workers in fresh
processes and in the peers' own virtualenvs, and the report writer. Nothing here is imported
by ingot; this package imports ingot's public modules, and its workers import nothing heavy at
module level, so a peer's interpreter can run them.
"""
