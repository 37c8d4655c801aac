"""Priority scheduling (vLLM's `--scheduling-policy priority`): the waiting queue by (priority,
arrival), preemption of the running sequence of the highest (priority, arrival) even when it
was already scheduled this step, and under fcfs priorities ignored. Output never depends on
the policy: each request's greedy tokens are the reference's whoever is preempted."""

import pytest
from test_scheduler import ContextFake, reference

from ingot.runtime import SamplingParams
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.scheduler import Scheduler, SequenceState

from generator_support import fake_generator


def _scheduler(policy: str, num_blocks: int = 4, max_num_seqs: int = 4) -> Scheduler:
    pool = KVPool(num_layers=1, num_blocks=num_blocks, block_size=2, num_kv_heads=1, head_dim=2)
    return Scheduler(pool, max_num_seqs, 64, enable_prefix_caching=False, policy=policy)


def _seq(scheduler: Scheduler, i: int, priority: int, tokens: int = 2) -> SequenceState:
    seq = SequenceState(i, list(range(1, tokens + 1)), tokens, scheduler.pool.new_block_table())
    seq.priority = priority
    scheduler.add(seq)
    return seq


@pytest.mark.parametrize(
    ("policy", "admitted"), [("priority", [1, 3, 2, 0]), ("fcfs", [0, 1, 2, 3])]
)
def test_admission_is_by_priority_then_arrival(policy, admitted):
    scheduler = _scheduler(policy, num_blocks=8, max_num_seqs=1)
    seqs = [_seq(scheduler, i, p) for i, p in enumerate([5, 0, 3, 0])]
    order = []
    while scheduler.waiting:
        [chunk] = scheduler.schedule().prefill
        order.append(chunk.seq.id)
        scheduler.finish(chunk.seq)
    assert order == admitted and all(not s.table.block_ids for s in seqs)


def _running(scheduler: Scheduler, *specs: tuple[int, int]) -> list[SequenceState]:
    """Sequences of (priority, prompt tokens) admitted one per step in this order, then each
    given one more token to decode; blocks of 2 tokens, 4 in the pool."""
    seqs = []
    for i, (priority, tokens) in enumerate(specs):
        seqs.append(_seq(scheduler, i, priority, tokens))
        assert [c.seq for c in scheduler.schedule().prefill] == seqs[-1:]
    for seq in seqs:
        seq.token_ids.append(9)
    return seqs


def test_priority_preempts_the_highest_value_even_if_already_scheduled():
    scheduler = _scheduler("priority")
    # All 4 blocks in use: `low` has a free slot left, `high` needs a new block.
    low, high = _running(scheduler, (5, 3), (0, 4))
    plan = scheduler.schedule()  # `low` is scheduled first, then gives its blocks to `high`
    assert [c.seq for c in plan.decode] == [high] and plan.prefill == []
    assert scheduler.running == [high] and list(scheduler.waiting) == [low]
    assert scheduler.num_preemptions == 1 and not low.table.block_ids


def test_fcfs_preempts_the_newest_not_yet_scheduled_whatever_the_priorities():
    scheduler = _scheduler("fcfs")
    low, high = _running(scheduler, (5, 3), (0, 4))
    plan = scheduler.schedule()  # `high` needs a block and only itself is left to preempt
    assert [c.seq for c in plan.decode] == [low] and list(scheduler.waiting) == [high]


def test_a_preempted_sequence_waits_in_its_priority_place():
    scheduler = _scheduler("priority", max_num_seqs=2)
    low, _ = _running(scheduler, (5, 3), (0, 4))
    middle = _seq(scheduler, 2, priority=3)  # arrives while both run; no room to admit it
    scheduler.schedule()
    assert list(scheduler.waiting) == [middle, low]


def test_ties_are_preempted_latest_arrival_first():
    scheduler = _scheduler("priority")
    first, second = _running(scheduler, (1, 4), (1, 3))
    plan = scheduler.schedule()  # `first` needs a block: `second`, not yet scheduled, gives
    assert [c.seq for c in plan.decode] == [first] and list(scheduler.waiting) == [second]


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="'lifo' is not one of fcfs, priority"):
        _scheduler("lifo")


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_greedy_output_does_not_depend_on_priority_or_preemption(tokenizer, policy):
    prompts = [[10, 11, 12], [20, 21], [30, 31, 32, 33], [40], [50, 51, 52, 53, 54]]
    params = SamplingParams(max_tokens=10, temperature=0)
    gen = fake_generator(
        ContextFake, tokenizer, num_blocks=8, block_size=2, max_seq_len=16,
        scheduling_policy=policy,
    )  # fmt: skip
    out = gen.generate(prompts, params, priority=[3, -1, 0, 7, -1])
    assert [c.token_ids for c in out] == [reference(p, 10, 16) for p in prompts]
    assert gen.stats().num_preemptions > 0
    assert gen.pool.allocator.num_free == gen.pool.num_blocks


def test_the_lowest_value_finishes_first_when_one_runs_at_a_time(tokenizer):
    gen = fake_generator(
        ContextFake, tokenizer, max_seq_len=16, max_num_seqs=1, scheduling_policy="priority"
    )
    params = SamplingParams(max_tokens=3, temperature=0)
    ids = [gen.add([5 + i], params, priority=p) for i, p in enumerate([2, 1, 0])]
    finished = []
    while gen.has_unfinished():
        finished += [o.request_id for o in gen.step() if o.finished]
    assert finished == ids[::-1]
