"""What values SamplingParams accepts: vLLM's ranges, strict types (a bool is not a number, a
string is not a number). The one copy of these rules: the Python API's SamplingParams runs
them when made, and the server builds a SamplingParams from each request and reports an
`InvalidSamplingParams` as a 400 naming the field the request sent.
"""

from __future__ import annotations

import math
from typing import Any

from ingot.common import IngotError
from ingot.runtime.structured import StructuredOutput

__all__ = [
    "GREEDY_BELOW",
    "InvalidSamplingParams",
    "MAX_INT",
    "MAX_LOGIT_BIAS",
    "MAX_LOGPROBS",
    "MAX_SEED",
    "logit_bias",
    "validate",
]

MAX_LOGPROBS = 20  # the OpenAI API's limit on top_logprobs
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values: [-100, 100]
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: lower temperatures are greedy
# Token counts and ids fit int32, seeds int64: every value stays representable in numpy.
MAX_INT = 2**31 - 1
MAX_SEED = 2**63 - 1


class InvalidSamplingParams(IngotError, ValueError):
    """A SamplingParams value of the wrong type or out of range: `field` names it, `reason`
    says what it must be ("<field> <reason>" is the message)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


def validate(p: Any) -> None:
    """Raise InvalidSamplingParams for the first value of `p` (a runtime.sampling.
    SamplingParams, not imported here: that module imports this one) that vLLM would not
    accept."""
    _int("max_tokens", p.max_tokens, 1, MAX_INT)
    _number("temperature", p.temperature, 0, math.inf)
    if isinstance(p.top_k, bool) or not isinstance(p.top_k, int) or p.top_k not in (-1, 0):
        _int("top_k", p.top_k, 1, MAX_INT, "must be -1 or 0 (no limit), or an integer in")
    if not _is_number(p.top_p) or not 0 < p.top_p <= 1:
        raise InvalidSamplingParams("top_p", f"must be in (0, 1], got {p.top_p!r}")
    if p.seed is not None:
        _int("seed", p.seed, 0, MAX_SEED)
    _stop(p.stop)
    if not isinstance(p.stop_token_ids, list | tuple):
        raise InvalidSamplingParams(
            "stop_token_ids", f"must be a list of token ids, got {p.stop_token_ids!r}"
        )
    for token in p.stop_token_ids:
        _int("stop_token_ids", token, 0, MAX_INT, "must hold integers in")
    if p.logprobs is not None:
        _int("logprobs", p.logprobs, 0, MAX_LOGPROBS)
    _int("n", p.n, 1, MAX_INT)
    if p.best_of is not None:
        _int("best_of", p.best_of, 1, MAX_INT)
        if p.best_of < p.n:
            raise InvalidSamplingParams("best_of", f"must be >= n ({p.n}), got {p.best_of}")
    _number("presence_penalty", p.presence_penalty, -2, 2)
    _number("frequency_penalty", p.frequency_penalty, -2, 2)
    if not _is_number(p.repetition_penalty) or not p.repetition_penalty > 0:
        raise InvalidSamplingParams(
            "repetition_penalty", f"must be a finite number > 0, got {p.repetition_penalty!r}"
        )
    _int("min_tokens", p.min_tokens, 0, p.max_tokens, "must be at most max_tokens, an integer in")
    for name in ("ignore_eos", "include_stop_str_in_output", "ranked"):
        if not isinstance(getattr(p, name), bool):
            raise InvalidSamplingParams(name, f"must be a bool, got {getattr(p, name)!r}")
    if p.structured is not None and not isinstance(p.structured, StructuredOutput):
        raise InvalidSamplingParams(
            "structured", f"must be a StructuredOutput, got {p.structured!r}"
        )


def logit_bias(bias: object) -> dict[int, float]:
    """{token id: bias} with int ids (JSON's string keys of integers accepted) and each bias
    clipped to [-100, 100], as OpenAI does."""
    if not isinstance(bias, dict):
        raise InvalidSamplingParams(
            "logit_bias", f"must be a dict of token id -> bias, got {bias!r}"
        )
    out = {}
    for key, value in bias.items():
        token = key
        if isinstance(key, str) and key.strip().isdecimal():
            token = int(key)
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= MAX_INT:
            raise InvalidSamplingParams(
                "logit_bias", f"keys must be token ids (integers in [0, {MAX_INT}]), got {key!r}"
            )
        if not _is_number(value):
            raise InvalidSamplingParams(
                "logit_bias", f"values must be finite numbers, got {value!r}"
            )
        out[token] = float(min(max(value, -MAX_LOGIT_BIAS), MAX_LOGIT_BIAS))
    return out


_AN_INT = "must be an integer in"


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _number(name: str, value: object, low: float, high: float) -> None:
    if not _is_number(value) or not low <= value <= high:
        where = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
        raise InvalidSamplingParams(name, f"must be a finite number {where}, got {value!r}")


def _int(
    name: str, value: object, low: int, high: int, what: str = "must be an integer in"
) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidSamplingParams(name, f"{what} [{low}, {high}], got {value!r}")


def _stop(stop: object) -> None:
    """Non-empty strings that are valid Unicode: text with a lone surrogate has no UTF-8 form,
    so no output could ever match it."""
    if not isinstance(stop, list | tuple) or any(not isinstance(s, str) or not s for s in stop):
        raise InvalidSamplingParams("stop", f"must be a list of non-empty strings, got {stop!r}")
    for i, text in enumerate(stop):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidSamplingParams(
                "stop",
                f"must be valid Unicode text: stop[{i}] has a lone surrogate at index {e.start}",
            ) from None
