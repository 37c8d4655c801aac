"""Temperature > 0 with drafts: the emitted tokens are distributed as the target's samples.

Checked on a 4-token vocabulary with fixed seeds: `sample_verified` alone against the exact
distribution, and whole generations (a fake model whose logits depend on the last token and
the position, a drafter that always proposes the same tokens, so both acceptance and
rejection happen) against the exact distribution of the first two tokens, by chi-square.
"""

from __future__ import annotations

from collections import Counter
from itertools import product

import numpy as np
import pytest

from ingot.runtime.generate import Generator, GeneratorConfig
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.sampling import SamplingParams, make_rng, sample_verified, sampling_distribution
from ingot.runtime.speculative import Drafter, Speculation, SpeculativeConfig

V = 4


def _fits(observed: np.ndarray, expected: np.ndarray) -> bool:
    """Pearson's chi-square test at p = 0.001: the statistic is below the critical value of
    its degrees of freedom (Wilson-Hilferty's approximation; z = 3.09 is the 0.999 quantile)."""
    statistic = float(((observed - expected) ** 2 / expected).sum())
    df = len(observed) - 1
    critical = df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3
    return statistic < critical


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("draft", [0, 2, 3])
@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3)],
)
def test_sample_verified_has_the_target_distribution(draft, params):
    logits = np.array([1.0, 0.2, -0.5, 0.9], np.float32)
    candidates, weights = sampling_distribution(logits, params)
    expected = np.zeros(V)
    expected[candidates] = weights / weights.sum()
    rng = make_rng(7)
    counts = Counter(sample_verified(logits, params, rng, draft) for _ in range(20_000))
    observed = np.array([counts[t] for t in range(V)])
    support = expected > 0
    assert observed[~support].sum() == 0  # never a token top-k removed, not even the draft
    assert _fits(observed[support], expected[support] * 20_000)


def _logits(token: int, position: int) -> np.ndarray:
    """A fixed, non-trivial distribution per (last token, position)."""
    return np.random.default_rng(token * 101 + position).normal(0, 1.2, V).astype(np.float32)


class TableSession:
    """Logits of each row = _logits(its token, its position); K/V are not read back."""

    def run(self, batch):
        rows = batch.logits_indices
        ids, pos = batch.input_ids.reshape(-1)[rows], batch.positions.reshape(-1)[rows]
        logits = np.stack([_logits(int(t), int(p)) for t, p in zip(ids, pos, strict=True)])
        s, q = batch.input_ids.shape
        kv = np.zeros((s, q, 2), np.float32)
        return logits, [(kv, kv)]


class FixedDrafter(Drafter):
    """Always proposes tokens 1, 1, 3 (whatever the context)."""

    def propose(self, seqs, ks):
        return [[1, 1, 3][:k] for k in ks]


def _first_two(speculate: bool, n: int, tokenizer) -> Counter:
    pool = KVPool(num_layers=1, num_blocks=256, block_size=4, num_kv_heads=1, head_dim=2)
    config = GeneratorConfig(max_seq_len=32, max_num_seqs=64)
    spec = None
    if speculate:
        spec = Speculation(
            SpeculativeConfig(
                "ngram", num_speculative_tokens=3, disable_by_batch_size=64, adaptive=False
            ),
            FixedDrafter(),
        )
    generator = Generator(TableSession(), pool, tokenizer, config, spec)
    params = [
        SamplingParams(max_tokens=3, temperature=1.0, seed=i, ignore_eos=True) for i in range(n)
    ]
    completions = generator.generate([[2, 0]] * n, params)
    if speculate:
        assert spec.stats.num_accepted_tokens > 0
        assert spec.stats.num_accepted_tokens < spec.stats.num_draft_tokens
    return Counter(tuple(c.token_ids[:2]) for c in completions)


def test_speculative_generation_has_the_target_distribution(tokenizer):
    n = 6000
    # Exact: token 1 at position 2 from _logits(0, 1), token 2 at position 3 from its own.
    first = _softmax(_logits(0, 1).astype(np.float64))
    expected = {
        (a, b): first[a] * _softmax(_logits(a, 2).astype(np.float64))[b]
        for a, b in product(range(V), range(V))
    }
    cells = sorted(expected)
    counts = _first_two(True, n, tokenizer)
    observed = np.array([counts[c] for c in cells])
    assert _fits(observed, np.array([expected[c] for c in cells]) * n)


def test_ranked_samples_track_cumulative_logprob_through_verification(tokenizer):
    """Drafted rows go through the same bookkeeping as plain ones: a ranked sample's sum
    equals what a request with logprobs reports, token for token the same draws."""
    pool = KVPool(num_layers=1, num_blocks=64, block_size=4, num_kv_heads=1, head_dim=2)
    config = SpeculativeConfig("ngram", num_speculative_tokens=3, adaptive=False)
    spec = Speculation(config, FixedDrafter())
    generator = Generator(TableSession(), pool, tokenizer, GeneratorConfig(max_seq_len=32), spec)
    base = {"max_tokens": 6, "temperature": 1.0, "seed": 4, "ignore_eos": True}
    scored, ranked = generator.generate(
        [[2, 0]] * 2, [SamplingParams(logprobs=0, **base), SamplingParams(ranked=True, **base)]
    )
    assert spec.stats.num_accepted_tokens > 0  # some tokens came from verified drafts
    assert scored.token_ids == ranked.token_ids
    assert ranked.cumulative_logprob == pytest.approx(sum(scored.logprobs), rel=1e-5)
