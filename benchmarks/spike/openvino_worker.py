"""One job of the OpenVINO spike in a fresh process (harness.launch):

    python -m benchmarks.spike.openvino_worker SPEC.json RESULT.json

Kinds: `decode` (benchmarks/decode/engines.py's timed greedy decoding, with this module's
`openvino` engine registered there) and `check` (ov_check.py's comparisons; OpenVINO's virtualenv).

Engines, both ingot's Generator (its scheduler, block allocator and batches; prefix caching
off, every prompt of the batch prefilled in one step) over one artifact:

- `ingot`: the artifact's ONNX Runtime engine (engines.load_ingot), in ingot's virtualenv;
- `openvino`: ov_runner.OpenVinoRunner, the same weights on OpenVINO's CPU plugin, with the
  load spec's `precision` / `kv` / `dyn_quant` (ov_runner.compile_config), in OpenVINO's.

Each pool holds `batch` sequences of `ctx_per_seq` tokens, and at least one of max_seq_len
(what LoadedModel.load insists on), in the engine's own block size (engines.pool_blocks).
"""

from __future__ import annotations

from typing import Any

from benchmarks.decode import engines
from benchmarks.harness.launch import worker_main

__all__ = ["run_spec"]


def open_ov_generator(
    artifact: str,
    batch: int,
    batched_tokens: int,
    ctx_per_seq: int,
    threads: int,
    precision: str,
    kv: str,
    dyn_quant: int,
) -> tuple[Any, dict[str, Any]]:
    """ingot's Generator over the OpenVINO runner, and what open_openvino reports."""
    from benchmarks.spike.ov_runner import compile_config, open_openvino
    from ingot.artifacts import verify_artifact
    from ingot.runtime.engines.openvino.layout import CPU_BLOCK_SIZE
    from ingot.runtime.generate import Generator, GeneratorConfig
    from ingot.runtime.tokenizer import TextTokenizer

    manifest = verify_artifact(artifact)
    model = manifest.model
    blocks = engines.pool_blocks(batch, ctx_per_seq, model.max_seq_len, CPU_BLOCK_SIZE)
    config = compile_config(threads, precision, kv, dyn_quant)
    runner, pool, info = open_openvino(artifact, blocks, config)
    generator = Generator(
        runner,
        pool,
        TextTokenizer.from_artifact(artifact, manifest.tokenizer, None),
        GeneratorConfig(
            max_seq_len=model.max_seq_len,
            eos_token_ids=tuple(model.eos_token_ids),
            max_num_seqs=batch,
            max_num_batched_tokens=max(2048, batched_tokens),
            enable_prefix_caching=False,
            vocab_size=model.vocab_size,
        ),
    )
    return generator, info | {"kv_blocks": blocks}


def load_openvino(**load: Any) -> engines.Runner:
    import openvino

    load = {k: v for k, v in load.items() if k != "artifact_engine"}
    generator, info = open_ov_generator(**load)
    run = engines.generator_runner(generator)
    run.info = info | {"openvino": openvino.__version__}  # type: ignore[attr-defined]
    return run


engines.ENGINES["openvino"] = load_openvino


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["kind"] == "check":
        from benchmarks.harness.machine import memory_status
        from benchmarks.spike.ov_check_job import run_check

        try:
            return run_check(spec) | {"ok": True} | memory_status()
        except Exception as e:  # recorded in the report, never dropped
            return {"ok": False, "error": f"{type(e).__name__}: {e}"} | memory_status()
    return engines.run_spec(spec)


if __name__ == "__main__":
    worker_main(run_spec)
