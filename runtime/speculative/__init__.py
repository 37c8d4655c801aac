"""Speculative decoding: a drafter proposes tokens, the target verifies them in one call.

`Speculation` is what a Generator is given: the config, the policy (when to draft) and the
drafter, a `Drafter` (drafter.py: the interface the Generator drives, and where a drafter keeps
its per-sequence state; ngram.py: prompt lookup; draft_model.py: a small model in the
artifact; medusa.py: heads on the target's hidden state; eagle.py: an EAGLE-3 draft layer on
the target's features). The verification itself (acceptance, K/V of accepted tokens only) is in
runtime/generate.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ingot.runtime.speculative.config import METHODS, SpeculativeConfig
from ingot.runtime.speculative.drafter import Drafter
from ingot.runtime.speculative.policy import DraftPolicy, DraftState
from ingot.runtime.speculative.step_rate import StepRates

__all__ = [
    "METHODS",
    "DraftState",
    "Drafter",
    "SpecDecodeStats",
    "Speculation",
    "SpeculativeConfig",
]


@dataclass(slots=True)
class SpecDecodeStats:
    """Cumulative counters, vLLM's spec_decode metrics."""

    num_drafts: int = 0  # verifications of at least one drafted token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [k]: accepted at draft i

    def record(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        if len(self.accepted_per_position) < drafted:
            self.accepted_per_position += [0] * (drafted - len(self.accepted_per_position))
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verification: the accepted drafts plus the target's own token."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


@dataclass(slots=True)
class Speculation:
    config: SpeculativeConfig
    drafter: Drafter
    policy: DraftPolicy = field(init=False)
    stats: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    rates: StepRates = field(default_factory=StepRates)

    def step_drafts(self, batch_size: int) -> bool:
        """Whether a decode step of `batch_size` requests drafts: within the batch-size limit
        and, when adaptive, where drafting has measured faster (step_rate.py)."""
        if not self.policy.step_drafts(batch_size):
            return False
        return not self.config.adaptive or self.rates.speculate(batch_size)

    def __post_init__(self) -> None:
        self.policy = DraftPolicy(self.config)
