"""Per-request sampling parameters, the token sampler (greedy, temperature, top-k, top-p) and
the log-probabilities reported with each token.

What happens to the logits before `sample` (penalties, logit_bias, min_tokens, structured
output) is runtime/logits.py; n and best_of are fanned out into one request per sample by
`fan_out` (and the best picked back by runtime/n_best.py's `pick_best`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ingot.runtime.sampling_checks import (
    GREEDY_BELOW,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    InvalidSamplingParams,
    logit_bias,
    validate,
)
from ingot.runtime.structured import StructuredOutput

__all__ = [
    "InvalidSamplingParams",
    "MAX_LOGIT_BIAS",
    "MAX_LOGPROBS",
    "SamplingParams",
    "fan_out",
    "logsumexp_rows",
    "make_rng",
    "sample",
    "sample_verified",
    "sampling_distribution",
    "token_logprobs",
]


@dataclass(slots=True)
class SamplingParams:
    """How one request picks its tokens and when it stops (vLLM's names, defaults and accepted
    values: runtime/sampling_checks.py, which the server's requests go through too)."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 (or below 1e-5, stored as 0) = greedy
    top_k: int = 0  # 0 = off (-1, vLLM's other "off", is stored as 0)
    top_p: float = 1.0  # 1 = off
    seed: int | None = None  # None = fresh entropy per request
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; n = the sampled token's and the top n logprobs
    # Samples: `best_of` (None = n) are generated, the `n` of highest cumulative logprob are
    # returned. The Generator runs one sample per request: `fan_out` makes the requests.
    n: int = 1
    best_of: int | None = None
    # Set by `fan_out` on the samples of a best_of > n request: their cumulative logprob is
    # tracked (without `logprobs`) because `pick_best` ranks them by it.
    ranked: bool = False
    # Penalties, vLLM's semantics (runtime/logits.py): presence and frequency on the output
    # tokens so far, repetition on prompt and output tokens (> 1 discourages repeats).
    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # > 0; 1 = off
    logit_bias: dict[int, float] | None = None  # {token id: added to its logit}, in [-100, 100]
    min_tokens: int = 0  # before this many output tokens: no EOS, stop token or stop string
    include_stop_str_in_output: bool = False  # a matched stop string stays in the text
    structured: StructuredOutput | None = None  # constrained decoding (runtime/structured.py)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # the OpenAI API accepts one string or a list
            self.stop = [self.stop]
        validate(self)  # runtime/sampling_checks.py: the server's rules too
        self.stop = list(self.stop)
        if self.top_k == -1:  # vLLM's other spelling of "no limit"
            self.top_k = 0
        if self.temperature < GREEDY_BELOW:  # greedy, as vLLM: no draws from a spike
            self.temperature = 0.0
        if self.logit_bias is not None:
            self.logit_bias = logit_bias(self.logit_bias)

    @property
    def num_samples(self) -> int:
        """How many sequences are generated: best_of, else n."""
        return self.n if self.best_of is None else self.best_of

    @property
    def has_logits_processing(self) -> bool:
        """Whether any option changes the logits before sampling (runtime/logits.py)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
            or self.structured is not None
        )


def fan_out(params: SamplingParams) -> list[SamplingParams]:
    """One single-sample request's params per sample of `params` (best_of, else n of them).

    With a seed s, sample i is seeded s + i, so a seeded request gives the same samples
    however it is run (LLM.generate or the server); without one every sample draws fresh
    entropy. Each copy has n = 1 and best_of = None, and is `ranked` if best_of > n;
    everything else is `params`' own.
    """
    ranked = params.num_samples > params.n
    seeds = [None if params.seed is None else params.seed + i for i in range(params.num_samples)]
    return [
        dataclasses.replace(params, n=1, best_of=None, seed=seed, ranked=ranked) for seed in seeds
    ]


def make_rng(seed: int | None) -> np.random.Generator:
    """The request's own generator: a seeded request draws the same tokens in any batch."""
    return np.random.Generator(np.random.PCG64(seed))


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token id from logits [V]."""
    if params.temperature == 0:
        return int(np.argmax(logits))
    candidates, weights = sampling_distribution(logits, params)
    return _draw(candidates, weights, rng)


def sample_verified(
    logits: np.ndarray, params: SamplingParams, rng: np.random.Generator, draft: int
) -> int:
    """The token to emit where a drafter proposed `draft`: distributed exactly as `sample`'s.

    Speculative sampling with a point-mass proposal (ngram and greedy drafters propose one
    token, not a distribution): `draft` is accepted with probability p(draft), else a token is
    drawn from p with `draft` removed. P(y) = p(d)[y = d] + (1 - p(d)) p(y) / (1 - p(d)) [y != d]
    = p(y). The caller counts the draft accepted iff the result equals it. Greedy: the argmax.
    """
    if params.temperature == 0:
        return int(np.argmax(logits))
    candidates, weights = sampling_distribution(logits, params)
    hit = np.flatnonzero(candidates == draft)
    if hit.size:
        if rng.random() * weights.sum() < weights[hit[0]]:
            return draft
        weights = weights.copy()
        weights[hit[0]] = 0.0  # the residual max(p - q, 0) of a point mass q at the draft
    return _draw(candidates, weights, rng)


def sampling_distribution(
    logits: np.ndarray, params: SamplingParams
) -> tuple[np.ndarray, np.ndarray]:
    """What a temperature > 0 `sample` draws from: token ids [C] and their unnormalized
    probabilities [C] (temperature, then top-k or top-p filtering)."""
    # float64: a low temperature scales logits enough to lose float32 precision in exp.
    scaled = logits.astype(np.float64) / params.temperature  # [V]
    vocab = scaled.shape[0]

    # Token ids still in the running [C], and their unnormalized probabilities' total.
    candidates, mass = np.arange(vocab), None
    if 0 < params.top_k < vocab:
        candidates = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
    elif params.top_p < 1.0:
        candidates, mass = _nucleus_superset(scaled, params.top_p)
    if params.top_p < 1.0 or params.top_k:
        # Most probable first; stable so equal logits keep a fixed (token id) order.
        candidates = np.sort(candidates)
        candidates = candidates[np.argsort(-scaled[candidates], kind="stable")]

    probs = np.exp(scaled[candidates] - scaled.max())  # [C]
    probs /= probs.sum() if mass is None else mass
    if params.top_p < 1.0:
        # Smallest prefix whose mass reaches top_p; the first token always stays.
        cumulative = np.cumsum(probs)
        keep = min(int(np.searchsorted(cumulative, params.top_p)) + 1, len(probs))
        candidates, probs = candidates[:keep], probs[:keep]
    return candidates, probs


def _draw(candidates: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse CDF with one uniform draw: one rng call per token whatever the filtering."""
    cumulative = np.cumsum(weights)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(candidates[min(index, len(candidates) - 1)])


_NUCLEUS_FIRST_GUESS = 64  # tokens: top-p rarely keeps more of a trained model's vocabulary


def _nucleus_superset(scaled: np.ndarray, top_p: float) -> tuple[np.ndarray, float]:
    """Token ids [C] that hold the top-p nucleus of `scaled` [V], and the whole vocabulary's
    unnormalized mass (exp(scaled - max) summed), found by partial sorts of growing size
    instead of sorting the vocabulary. Every token tied with the smallest one kept is kept
    too, so sorting the result gives the full sort's prefix exactly."""
    vocab = scaled.shape[0]
    weights = np.exp(scaled - scaled.max())  # [V]
    mass = float(weights.sum())
    k = _NUCLEUS_FIRST_GUESS
    while k < vocab:
        threshold = np.partition(scaled, vocab - k)[vocab - k]  # the k-th largest
        candidates = np.flatnonzero(scaled >= threshold)
        if weights[candidates].sum() >= top_p * mass:
            return candidates, mass
        k *= 4
    return np.arange(vocab), mass


def logsumexp_rows(logits: np.ndarray) -> np.ndarray:
    """log(sum(exp(row))) of each row of logits [S, V] -> [S] float64: the normalizers of the
    model's distributions, in one pass over the batch."""
    top = logits.max(axis=-1)  # [S]
    # float32 exp even of float16 logits: their sum would overflow float16.
    sums = np.exp(logits - top[:, None], dtype=np.float32).sum(axis=-1)
    return top.astype(np.float64) + np.log(sums)


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, dict[int, float]]:
    """The log-probability of `token` and the `top` most likely tokens' {id: logprob}.

    Of the raw logits [V], before temperature and filtering, as vLLM reports them by default:
    the model's distribution, whatever the request sampled from.
    """
    logits = logits.astype(np.float64)
    shifted = logits - logits.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())  # [V]
    top = min(top, len(logprobs))
    best = np.argpartition(-logprobs, top - 1)[:top] if top else np.zeros(0, np.int64)
    # Most likely first; ties in token id order so the dict is reproducible.
    best = best[np.lexsort((best, -logprobs[best]))]
    return float(logprobs[token]), {int(t): float(logprobs[t]) for t in best}
