"""One case of prefill_split.py in a fresh process: a burst of new prompts through the runtime's
Generator, its prefill either split by length (`split`, the runtime's default) or run as one
padded call a step (`one_call`: scheduler.MAX_PREFILL_CALLS = 1).

Usage: `python -m benchmarks.decode.prefill_split_worker SPEC.json RESULT.json`, as
harness.launch.run_worker runs it; the spec names the case, the artifact, the prompts and the
output length.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.harness.launch import worker_main


class _TimedSession:
    """The generator's engine session, recording each call: (tokens computed, padding
    included; real tokens; seconds; whether it was a prefill call)."""

    def __init__(self, session: Any) -> None:
        self.session, self.calls = session, []

    def run(self, batch: Any) -> Any:
        started = time.perf_counter()
        out = self.session.run(batch)
        real = len(batch.slots)
        prefill = batch.input_ids.shape[1] > 1
        self.calls.append((batch.input_ids.size, real, time.perf_counter() - started, prefill))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    import ingot.runtime.scheduler as scheduler
    from ingot.runtime import LoadedModel, SamplingParams

    if spec["case"] == "one_call":
        scheduler.MAX_PREFILL_CALLS = 1
    model = LoadedModel.load(
        spec["artifact"],
        kv_cache_bytes=spec["kv_cache_bytes"],
        max_num_seqs=len(spec["prompts"]),
        max_num_batched_tokens=spec["budget"],
    )
    generator = model.generator()
    params = SamplingParams(max_tokens=spec["output_len"], temperature=0.0, ignore_eos=True)
    generator.generate([p[:16] for p in spec["prompts"][:4]], params)  # warm-up, other prompts
    timed = _TimedSession(generator.session)
    generator.session = timed
    started = time.perf_counter()
    completions = generator.generate(spec["prompts"], params)
    wall = time.perf_counter() - started
    prefill = [c for c in timed.calls if c[3]]
    return {
        "ok": True,
        "output_tok_s": sum(len(c.token_ids) for c in completions) / wall,
        "wall_s": wall,
        "prefill_s": sum(c[2] for c in prefill),
        "prefill_calls": len(prefill),
        "prefill_computed": sum(c[0] for c in prefill),
        "prefill_real": sum(c[1] for c in prefill),
        "decode_s": sum(c[2] for c in timed.calls if not c[3]),
        "tokens": [c.token_ids for c in completions],
    }


if __name__ == "__main__":
    worker_main(run_case)
