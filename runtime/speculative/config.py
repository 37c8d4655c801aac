"""How a generator speculates: the method, how many tokens it drafts, and when it stops.

The keys are vLLM's `speculative_config` keys, so `LLM(..., speculative_config={...})` and
`ingot serve --speculative-config '{...}'` take what a vLLM user already writes (vLLM's method
name "eagle3" for an EAGLE-3 drafter is ingot's "eagle"). An artifact built with a
`speculative:` recipe section carries its own default (manifest.speculative).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Self

__all__ = ["METHODS", "SpeculativeConfig"]

METHODS = ("ngram", "draft_model", "medusa", "eagle")
# vLLM's names of ingot's methods: an EAGLE-3 drafter is vLLM's "eagle3" (ingot's only EAGLE
# is EAGLE-3, so its "eagle" is that too).
ALIASES = {"eagle3": "eagle"}


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1  # ngram: the shortest suffix n-gram looked up
    prompt_lookup_max: int = 4  # ngram: the longest
    # No drafting in a step with more decoding requests than this: a large batch is
    # compute-bound, and verifying k + 1 tokens per request then costs about k + 1 times as
    # much for fewer than k + 1 tokens (benchmarks/results/speculative.md measures it).
    disable_by_batch_size: int = 8
    # A request whose drafts are accepted less often than this (a moving average over its
    # recent steps) stops drafting for `backoff_steps` steps, then tries again.
    min_acceptance_rate: float = 0.1
    backoff_steps: int = 16
    # Time decode steps with and without drafts, and stop drafting at batch sizes where it
    # emits fewer tokens per second (step_rate.py). Off: always draft within the limits above.
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.method in ALIASES:  # frozen: set through object's own __setattr__
            object.__setattr__(self, "method", ALIASES[self.method])
        if self.method not in METHODS:
            raise ValueError(
                f"speculative method {self.method!r} is not supported "
                f"(supported: {', '.join(METHODS)}; {_aliases()})"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.num_speculative_tokens > 16:
            raise ValueError(
                f"num_speculative_tokens must be <= 16, got {self.num_speculative_tokens}"
            )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max "
                f"({self.prompt_lookup_max})"
            )
        if not isinstance(self.disable_by_batch_size, int) or self.disable_by_batch_size < 1:
            raise ValueError(
                f"disable_by_batch_size must be an integer >= 1, got {self.disable_by_batch_size!r}"
            )
        if not 0 <= self.min_acceptance_rate < 1:
            raise ValueError(
                f"min_acceptance_rate must be in [0, 1), got {self.min_acceptance_rate!r}"
            )
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be true or false, got {self.adaptive!r}")
        if not isinstance(self.backoff_steps, int) or self.backoff_steps < 0:
            raise ValueError(f"backoff_steps must be an integer >= 0, got {self.backoff_steps!r}")

    @classmethod
    def from_dict(cls, given: dict[str, Any], default: SpeculativeConfig | None = None) -> Self:
        """A config from vLLM-style keys; keys not given come from `default` (the artifact's),
        else the defaults above. `method` may be omitted when a default names one."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known - {"model"})
        if unknown:
            raise ValueError(
                f"speculative_config: unknown keys {unknown} (known: {', '.join(sorted(known))})"
            )
        if "model" in given:
            # vLLM names the draft checkpoint here; ingot's draft is built into the artifact.
            raise ValueError(
                "speculative_config.model: the draft model is built into the artifact "
                "(recipe speculative.draft); use method draft_model without `model`"
            )
        base = {f.name: getattr(default, f.name) for f in fields(cls)} if default else {}
        merged = {**base, **given}
        if "method" not in merged:
            raise ValueError(
                f"speculative_config.method is required ({', '.join(METHODS)}; {_aliases()})"
            )
        return cls(**merged)


def _aliases() -> str:
    return ", ".join(f"{alias} is {method}" for alias, method in ALIASES.items())
