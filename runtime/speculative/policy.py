"""When a request drafts, and how many tokens: speculation must never cost more than it saves.

Per request, a moving average of its acceptance rate (accepted / drafted); below
`min_acceptance_rate` the request stops drafting for `backoff_steps` steps and then tries
again (text that stops repeating itself can start again). Per step, a batch larger than
`disable_by_batch_size` does not draft at all (see SpeculativeConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

from ingot.runtime.speculative.config import SpeculativeConfig

__all__ = ["DraftPolicy", "DraftState"]

_EMA_WEIGHT = 0.3  # of the latest step: about the last 3 steps dominate


@dataclass(slots=True)
class DraftState:
    """One request's recent acceptance."""

    acceptance: float = 1.0  # optimistic start: every request gets to try
    paused: int = 0  # steps left without drafting


class DraftPolicy:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def step_drafts(self, batch_size: int) -> bool:
        """Whether a step with `batch_size` decoding requests drafts at all."""
        return batch_size <= self.config.disable_by_batch_size

    def num_drafts(self, state: DraftState) -> int:
        """How many tokens this request may draft this step (0 while paused)."""
        if state.paused:
            state.paused -= 1
            return 0
        return self.config.num_speculative_tokens

    def update(self, state: DraftState, drafted: int, accepted: int) -> None:
        """After verifying `drafted` tokens of which `accepted` were kept."""
        if not drafted:
            return
        rate = accepted / drafted
        state.acceptance += _EMA_WEIGHT * (rate - state.acceptance)
        if state.acceptance < self.config.min_acceptance_rate:
            state.paused = self.config.backoff_steps
            state.acceptance = self.config.min_acceptance_rate  # a fresh chance after the pause
