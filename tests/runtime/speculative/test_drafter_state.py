"""A drafter's own per-sequence state through the generic Generator (speculative/drafter.py):
a toy drafter, written as a new one would be (one class, its state type beside it), keeps a
`ToySequence` in each SequenceState.drafter_state; the Generator tells it of every preemption
and drops the state when the request retires; greedy output stays plain decoding's."""

from __future__ import annotations

from dataclasses import dataclass

from ingot.runtime.sampling import SamplingParams
from ingot.runtime.scheduler import SequenceState
from ingot.runtime.speculative import Drafter, Speculation, SpeculativeConfig

from generator_support import RandomSession, V, fake_generator

GREEDY = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
PROMPTS = [[(7 * i + j) % V for j in range(10)] for i in range(4)]


@dataclass(slots=True)
class ToySequence:
    """What the toy drafter keeps of one sequence: its last token when it last drafted."""

    drafted_after: int


class ToyDrafter(Drafter):
    """Proposes the token after the last one (mostly rejected: the session's logits are
    random), remembering per sequence where it drafted."""

    def __init__(self) -> None:
        self.seen: list[SequenceState] = []
        self.preemptions = 0

    def propose(self, seqs, ks):
        drafts = []
        for seq, k in zip(seqs, ks, strict=True):
            state = seq.drafter_state
            if state is None:  # new, or preempted since it last drafted
                self.seen.append(seq)
                state = seq.drafter_state = ToySequence(0)
            assert isinstance(state, ToySequence)
            state.drafted_after = last = seq.token_ids[-1]
            drafts.append([(last + 1 + i) % V for i in range(k)])
        return drafts

    def accepted(self, seq):
        assert seq.drafter_state.drafted_after in seq.token_ids

    def preempted(self, seq):
        assert seq.num_computed == 0  # told after the blocks went back
        super().preempted(seq)
        assert seq.drafter_state is None  # the default drops it
        self.preemptions += 1


def test_a_drafters_state_is_its_own_and_goes_with_preemption_and_retirement(tokenizer):
    options = dict(num_blocks=16, max_num_batched_tokens=8)  # preempts; chunked prefill
    plain = fake_generator(RandomSession, tokenizer, **options).generate(PROMPTS, GREEDY)
    generator = fake_generator(RandomSession, tokenizer, **options)
    config = SpeculativeConfig("ngram", num_speculative_tokens=2, adaptive=False)
    drafter = ToyDrafter()
    generator.speculation = Speculation(config, drafter)
    completions = generator.generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in completions] == [c.token_ids for c in plain]
    assert generator.speculation.stats.num_drafts > 0
    assert drafter.preemptions == generator.stats().num_preemptions > 0
    assert len(drafter.seen) >= len(PROMPTS)
    assert all(seq.drafter_state is None for seq in drafter.seen)  # dropped at retirement
