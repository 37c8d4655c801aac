"""Serving: `ingot serve` against `vllm serve` and in-process baselines (serve), what HTTP
costs (serve_overhead), a huge request beside a stream (serve_stall)."""
