"""The OpenVINO model against ingot's ONNX Runtime sessions on the same calls, before any timing.

Both sides are driven the same way: the runtime's own `build_inputs` over block tables of their
own pools (ORT: the graph's block size, OpenVINO: 32), block ids handed out in a scattered
order, sequences split into uneven chunks and batched together (a prefill chunk beside a
decode), every real token's logits compared (`all_logits`). References:

- exact: the artifact's portable model.onnx in a plain ORT session (`disable_all`: its
  DequantizeLinear -> MatMul in fp32, the IR's numbers) against OpenVINO compiled with f32
  activations and no activation quantization;
- engine: ingot's ORT engine (MatMulNBits, int8 activations) against OpenVINO as configured
  for the timing (bf16 activations, int8 dynamic quantization): a loose bound.

The difference is reported as max |a - b| / max |reference| (the export check's measure), and
the argmax agreement over every compared row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ingot.runtime.batch import build_inputs
from ingot.runtime.kv_pool import KVPool

__all__ = ["CALLS", "compare", "drive", "lengths", "scatter_free_list"]

# Two sequences of 41 and 22 tokens (`lengths`): (sequence, new tokens) per sequence per call.
CALLS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 13),),
    ((0, 20), (1, 7)),
    ((0, 1), (1, 14)),
    ((0, 6),),
    ((0, 1), (1, 1)),
)


def lengths(calls=CALLS) -> list[int]:
    """Tokens per sequence that `calls` run through."""
    total: dict[int, int] = {}
    for call in calls:
        for seq, n in call:
            total[seq] = total.get(seq, 0) + n
    return [total[s] for s in sorted(total)]


def scatter_free_list(pool: KVPool, seed: int = 0) -> None:
    """Hand the pool's blocks out in a random order: tables that are not 0, 1, 2, ..."""
    allocator = pool.allocator
    blocks = [allocator.allocate() for _ in range(allocator.num_blocks)]
    for block in np.random.default_rng(seed).permutation(blocks):
        allocator.free(int(block))


def drive(runner: object, pool: KVPool, tokens: Sequence[Sequence[int]], calls=CALLS) -> np.ndarray:
    """Every real token's logits [T_all, V] of `tokens` run through `calls` in order."""
    tables = [pool.new_block_table() for _ in tokens]
    done = [0] * len(tokens)
    out = []
    for call in calls:
        seqs = []
        for seq, n in call:
            ids = list(tokens[seq][done[seq] : done[seq] + n])
            tables[seq].reserve(n)
            seqs.append((tables[seq], ids, done[seq]))
            done[seq] += n
        batch = build_inputs(seqs, all_logits=True, scratch_block=pool.scratch_block)
        logits, _ = runner.run(batch)
        out.append(np.array(logits, dtype=np.float32, copy=True))
    for table in tables:
        table.release()
    return np.concatenate(out)


def compare(reference: np.ndarray, other: np.ndarray) -> dict:
    scale = float(np.abs(reference).max())
    diff = float(np.abs(reference - other).max())
    top2 = np.sort(reference, axis=-1)[:, -2:]
    near_tie = (top2[:, 1] - top2[:, 0]) <= diff  # rows whose argmax the difference could flip
    same = reference.argmax(-1) == other.argmax(-1)
    return {
        "rows": len(reference),
        "max_abs_diff": diff,
        "max_rel_diff": diff / scale,
        "logit_scale": scale,
        "argmax_equal": int(same.sum()),
        "argmax_differs_not_near_tie": int((~same & ~near_tie).sum()),
        "finite": bool(np.isfinite(other).all()),
    }
