"""What the generation tests' fake sessions share: V token ids, the keys and values they
write (K = position + 1, V = the token id: what a fake reads back from the pool says where it
was written and what), and a Generator over a two-layer pool."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ingot.runtime.batch import Batch
from ingot.runtime.generate import Generator, GeneratorConfig, ModelRunner
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.tokenizer import TextTokenizer

V = 320


def step_arrays(batch: Batch) -> tuple[np.ndarray, ...]:
    """input_ids, positions, block_tables, context_lens, attention_mask of a call."""
    return (
        batch.input_ids,
        batch.positions,
        batch.block_tables,
        batch.context_lens,
        batch.attention_mask,
    )


def picked_rows(batch: Batch, logits: np.ndarray) -> np.ndarray:
    """A fake's logits [S, Q, V] for every position -> the [N, V] rows the call asked for
    (`logits_indices`), as the graph returns them."""
    return logits.reshape(-1, logits.shape[-1])[batch.logits_indices]


def new_kv(positions: np.ndarray, input_ids: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Both layers' (new K, new V) [S, Q, 1, 2] for a step's tokens."""
    S, Q = input_ids.shape
    k = np.broadcast_to((positions + 1).astype(np.float32)[..., None, None], (S, Q, 1, 2))
    v = np.broadcast_to(input_ids.astype(np.float32)[..., None, None], (S, Q, 1, 2))
    return [(k, v), (k, v)]


def fake_generator(
    session: Callable[[KVPool], ModelRunner],
    tokenizer: TextTokenizer,
    num_blocks: int = 64,
    block_size: int = 4,
    **config,
) -> Generator:
    """A Generator over `session(pool)`; GeneratorConfig's max_seq_len defaults to 64."""
    pool = KVPool(
        num_layers=2, num_blocks=num_blocks, block_size=block_size, num_kv_heads=1, head_dim=2
    )
    config = GeneratorConfig(**{"max_seq_len": 64, **config})
    return Generator(session(pool), pool, tokenizer, config)


class RandomSession:
    """A fake session whose logits are random but a pure function of (token, position): the
    same sequence gets the same logits in any batch, whatever the sampling does with them."""

    def __init__(self, pool: KVPool, scale: float = 3.0):
        self.pool = pool
        self.scale = scale

    def run(self, batch):
        input_ids, positions, block_tables, context_lens, attention_mask = step_arrays(batch)
        S, Q = input_ids.shape
        logits = np.empty((S, Q, V), np.float32)
        for s in range(S):
            for q in range(Q):
                seed = int(input_ids[s, q]) * 100_003 + int(positions[s, q])
                logits[s, q] = np.random.default_rng(seed).normal(0, self.scale, V)
        return picked_rows(batch, logits), new_kv(positions, input_ids)
