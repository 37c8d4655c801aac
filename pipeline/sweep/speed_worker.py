"""One speed measurement of one artifact, in a fresh interpreter (an engine timed alone):

    python -m ingot.pipeline.sweep.speed_worker SPEC.json RESULT.json

SPEC: {artifact, prompt_tokens, output_tokens, concurrency, seed}. The artifact is loaded with
the runtime as `ingot serve` would (its engine order, its speculative settings), prefix caching
off (every prompt is computed, not served from an earlier one), then, after one untimed
warm-up request: (a) one request decoding `output_tokens` tokens after a `prompt_tokens`
prompt, (b) `concurrency` such requests added at once. Imports only the runtime (no torch).
"""

from __future__ import annotations

import json
import statistics
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from ingot.runtime import LoadedModel
from ingot.runtime.timed import Trace, timed_greedy

__all__ = ["burst_metrics", "decode_tok_s", "measure", "prompt_ids"]

_WARMUP_TOKENS = 4


def prompt_ids(vocab_size: int, special: set[int], count: int, length: int, seed: int) -> list:
    """`count` prompts of `length` token ids drawn uniformly from the vocabulary less its
    special tokens, with a fixed seed: the same prompts for every variant of one model."""
    ordinary = np.setdiff1d(np.arange(vocab_size), np.array(sorted(special), dtype=np.int64))
    rng = np.random.default_rng(seed)
    return rng.choice(ordinary, size=(count, length)).tolist()


def decode_tok_s(trace: Trace) -> float:
    """Batch-1 decode tokens/s: the tokens after the first over the time from the first to
    the last (the prompt's prefill is not decode)."""
    _, [(_, times)] = trace
    return (len(times) - 1) / (times[-1] - times[0])


def burst_metrics(trace: Trace) -> tuple[float, float]:
    """(total output tokens/s from adding the requests to the last token, TTFT p50 in ms)."""
    start, sequences = trace
    tokens = sum(len(times) for _, times in sequences)
    end = max(times[-1] for _, times in sequences)
    ttft = statistics.median(times[0] - start for _, times in sequences)
    return tokens / (end - start), ttft * 1e3


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    n, concurrency = spec["output_tokens"], spec["concurrency"]
    model = LoadedModel.load(
        spec["artifact"],
        kv_cache_bytes=None,  # auto: room for `concurrency` full-length sequences if it fits
        max_num_seqs=concurrency,
        enable_prefix_caching=False,
    )
    info = model.manifest.model
    special = {info.bos_token_id, *info.eos_token_ids} - {None}
    vocab = min(info.vocab_size, model.tokenizer.vocab_size)  # ids the tokenizer knows
    prompts = prompt_ids(vocab, special, concurrency, spec["prompt_tokens"], spec["seed"])
    generator = model.generator()
    timed_greedy(generator, prompts[:1], _WARMUP_TOKENS)
    batch1 = decode_tok_s(timed_greedy(generator, prompts[:1], n))
    burst, ttft_ms = burst_metrics(timed_greedy(generator, prompts, n))
    return {
        "tok_s_batch1": batch1,
        "tok_s_burst": burst,
        "ttft_ms_p50": ttft_ms,
        "engine": model.engine.name,
    }


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    try:
        result = {"ok": True, **measure(spec)}
    except Exception as e:  # reported by the parent as this variant's one line
        line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        result = {"ok": False, "error": f"{type(e).__name__}: {line}"}
        traceback.print_exc()
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
