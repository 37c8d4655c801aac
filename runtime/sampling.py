"""Per-request sampling parameters, the token sampler (greedy, temperature, top-k, top-p) and
the log-probabilities reported with each token."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MAX_LOGPROBS", "SamplingParams", "make_rng", "sample", "token_logprobs"]

MAX_LOGPROBS = 20  # the OpenAI API's limit on top_logprobs


@dataclass(slots=True)
class SamplingParams:
    """How one request picks its tokens and when it stops (vLLM's names and defaults)."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None  # None = fresh entropy per request
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; n = the sampled token's and the top n logprobs

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # the OpenAI API accepts one string or a list
            self.stop = [self.stop]
        _require_int("max_tokens", self.max_tokens, minimum=1)
        _require_int("top_k", self.top_k, minimum=0)
        if self.seed is not None:
            _require_int("seed", self.seed, minimum=0)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        for token in self.stop_token_ids:
            _require_int("stop_token_ids", token, minimum=0)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.logprobs is not None:
            _require_int("logprobs", self.logprobs, minimum=0)
            if self.logprobs > MAX_LOGPROBS:
                raise ValueError(f"logprobs must be at most {MAX_LOGPROBS}, got {self.logprobs}")


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def make_rng(seed: int | None) -> np.random.Generator:
    """The request's own generator: a seeded request draws the same tokens in any batch."""
    return np.random.Generator(np.random.PCG64(seed))


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token id from logits [V]."""
    if params.temperature == 0:
        return int(np.argmax(logits))
    # float64: a low temperature scales logits enough to lose float32 precision in exp.
    scaled = logits.astype(np.float64) / params.temperature  # [V]
    vocab = scaled.shape[0]

    candidates = np.arange(vocab)  # [C] token ids still in the running
    if 0 < params.top_k < vocab:
        candidates = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
    if params.top_p < 1.0 or params.top_k:
        # Most probable first; stable so equal logits keep a fixed (token id) order.
        candidates = np.sort(candidates)
        candidates = candidates[np.argsort(-scaled[candidates], kind="stable")]

    probs = np.exp(scaled[candidates] - scaled[candidates].max())  # [C]
    probs /= probs.sum()
    if params.top_p < 1.0:
        # Smallest prefix whose mass reaches top_p; the first token always stays.
        cumulative = np.cumsum(probs)
        keep = min(int(np.searchsorted(cumulative, params.top_p)) + 1, len(probs))
        candidates, probs = candidates[:keep], probs[:keep]

    # Inverse CDF with one uniform draw: one rng call per token whatever the filtering.
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(candidates[min(index, len(candidates) - 1)])


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
