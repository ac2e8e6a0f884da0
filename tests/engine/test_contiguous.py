"""ContiguousAllocator: reservation sizes, regions, events, and invariants when the real
Scheduler (plain and FastDecode) drives it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine import EventKind, EventRecorder, SamplingParams, Scheduler, SchedulerConfig, Sequence
from engine.contiguous.allocator import ContiguousAllocator, ReservationError, reservation_tokens
from engine.fast.decode import FastDecodeScheduler
from tests.engine.conftest import run_to_completion


def seq(seq_id: int, prompt: int, max_tokens: int) -> Sequence:
    return Sequence(seq_id, range(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def test_reservation_sizes_follow_the_policies() -> None:
    assert reservation_tokens("max", 100, 25, 2048) == 2048  # prompt included
    assert reservation_tokens("pow2", 100, 25, 2048) == 100 + 32
    assert reservation_tokens("pow2", 100, 32, 2048) == 100 + 32
    assert reservation_tokens("pow2", 100, 1, 2048) == 101
    assert reservation_tokens("oracle", 100, 25, 2048) == 125
    # Never beyond max_model_len, where the sequence stops anyway.
    assert reservation_tokens("pow2", 1000, 1500, 2048) == 2048
    assert reservation_tokens("oracle", 100, 25, None) == 125
    with pytest.raises(ReservationError, match="max_model_len"):
        reservation_tokens("max", 100, 25, None)


def test_a_region_is_a_table_of_consecutive_slots_reaching_ahead() -> None:
    rec = EventRecorder()
    alloc = ContiguousAllocator(64, "pow2", max_model_len=64, event_sink=rec)
    a, b = seq(0, 10, 5), seq(1, 3, 3)
    assert alloc.can_allocate(10, a)
    alloc.allocate_for_prefill(a, 10)  # 10 + 8 = 18 -> a block of 32
    alloc.allocate_for_prefill(b, 3)  # 3 + 4 = 7 -> a block of 8
    assert a.block_table == list(range(0, 18))
    assert b.block_table == list(range(32, 39))
    assert alloc.get_num_free_blocks() == 64 - 32 - 8 == len(alloc._free)
    a.cached_token_count = 10
    assert alloc.append_slot_index(a) == 10
    alloc.check_invariants()
    alloc.free_sequence(a)
    alloc.free_sequence(a)  # a second free is a no-op
    assert a.block_table == []
    cols, block_ids = rec.columns()
    kinds = [EventKind(k) for k in cols["kind"]]
    assert kinds == [EventKind.ALLOCATE, EventKind.ALLOCATE, EventKind.FREE]
    assert block_ids.tolist() == [0, 32, 0]  # one id per event: the region's first slot
    assert cols["free_blocks"].tolist() == [32, 24, 56]


def test_a_policy_that_sizes_by_request_needs_the_sequence() -> None:
    alloc = ContiguousAllocator(64, "oracle")
    with pytest.raises(ReservationError, match="pass it"):
        alloc.can_allocate(4)
    assert ContiguousAllocator(64, "max", max_model_len=32).can_allocate(4)


def test_outgrowing_a_reservation_raises_and_corrupts_nothing() -> None:
    alloc = ContiguousAllocator(64, "oracle")
    s = seq(0, 4, 4)
    alloc.allocate_for_prefill(s, 4)
    s.cached_token_count = 8  # as if it had run past its true output length
    with pytest.raises(ReservationError, match="beyond its reservation"):
        alloc.append_slot_index(s)
    with pytest.raises(ReservationError):
        alloc.append_block(s)
    with pytest.raises(ReservationError):
        alloc._free.popleft()
    s.cached_token_count = 4
    alloc.check_invariants()
    # A sequence whose finish lies beyond what the policy reserves is refused at admission.
    t = seq(1, 4, 4)
    t._finish_cached_count = 20
    with pytest.raises(ReservationError, match="may write 20 tokens"):
        alloc.allocate_for_prefill(t, 4)
    assert t.block_table == [] and alloc.get_num_free_blocks() == 64 - 8


@pytest.mark.parametrize("scheduler_class", [Scheduler, FastDecodeScheduler])
@pytest.mark.parametrize("policy", ["max", "pow2", "oracle"])
def test_the_scheduler_runs_contiguous_allocators_without_growing_or_preempting(
    scheduler_class: type[Scheduler], policy: str
) -> None:
    rec = EventRecorder()
    alloc = ContiguousAllocator(256, policy, max_model_len=64, event_sink=rec)  # type: ignore[arg-type]
    sched = scheduler_class(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256), alloc)  # type: ignore[arg-type]
    lengths = [(5, 7), (30, 20), (1, 1), (12, 52), (40, 3), (9, 9), (64, 1), (17, 33)]
    seqs = [seq(i, p, o) for i, (p, o) in enumerate(lengths)]
    for s in seqs:
        sched.add_request(s)
    outputs = run_to_completion(sched)  # checks the allocator's invariants every step
    assert all(s.num_generated_tokens == min(o, max(64 - p, 1)) for s, (p, o) in zip(seqs, lengths))
    assert not any(out.preempted for out in outputs)
    assert alloc.get_num_free_blocks() == 256 and alloc.num_regions == 0
    kinds = set(rec.columns()[0]["kind"].tolist())
    assert EventKind.APPEND_BLOCK not in kinds and EventKind.PREEMPT not in kinds


def test_a_full_slot_space_does_not_make_the_plain_scheduler_preempt() -> None:
    alloc = ContiguousAllocator(32, "max", max_model_len=16)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), alloc)  # type: ignore[arg-type]
    for i in range(3):
        sched.add_request(seq(i, 4, 8))
    out = sched.schedule()
    assert len(out.seqs) == 2 and alloc.get_num_free_blocks() == 0
    sched.update(out, [1, 1])
    out = sched.schedule()  # decode with no free slot: the tokens are in the reservations
    assert out.preempted == [] and out.slot_mapping == [4, 20]
    sched.update(out, [1, 1])
    outputs = run_to_completion(sched)
    assert not any(o.preempted for o in outputs)


def test_a_reservation_larger_than_the_space_is_rejected_and_holes_block_admission() -> None:
    alloc = ContiguousAllocator(48, "oracle")  # roots: 32 at 0, 16 at 32
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256), alloc)  # type: ignore[arg-type]
    sched.add_request(seq(0, 20, 20))  # 40 -> 64 > the largest root
    sched.add_request(seq(1, 10, 10))  # 20 -> 32
    sched.add_request(seq(2, 10, 10))  # 20 -> 32: 16 slots are free, but no hole of 32
    out = sched.schedule()
    assert [s.seq_id for s in out.rejected] == [0]
    assert [s.seq_id for s in out.seqs] == [1]
    assert alloc.get_num_free_blocks() == 16
    assert not alloc.can_allocate(20, sched.waiting[0])


class ContiguousMachine(RuleBasedStateMachine):
    """Random traffic (EOS stops, aborts) through the Scheduler and a contiguous allocator."""

    @initialize(
        num_slots=st.integers(1, 300),
        policy=st.sampled_from(["max", "pow2", "oracle"]),
        max_num_seqs=st.integers(1, 6),
    )
    def setup(self, num_slots: int, policy: str, max_num_seqs: int) -> None:
        self.alloc = ContiguousAllocator(num_slots, policy, max_model_len=80)  # type: ignore[arg-type]
        config = SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=200, max_model_len=80
        )
        self.sched = Scheduler(config, self.alloc)  # type: ignore[arg-type]
        self.next_id = 0

    @rule(prompt=st.integers(1, 90), max_tokens=st.integers(1, 40), eos=st.booleans())
    def add_request(self, prompt: int, max_tokens: int, eos: bool) -> None:
        params = SamplingParams(max_tokens=max_tokens, eos_token_id=0, ignore_eos=not eos)
        self.sched.add_request(Sequence(self.next_id, range(1, prompt + 1), params))
        self.next_id += 1

    @rule(tokens=st.lists(st.integers(0, 3), max_size=6))
    def step(self, tokens: list[int]) -> None:
        out = self.sched.schedule()
        if not out.is_empty:
            assert len(set(out.slot_mapping)) == len(out.slot_mapping)
        assert out.preempted == []
        sampled = [tokens[i] if i < len(tokens) else 1 for i in range(out.num_seqs)]
        self.sched.update(out, sampled)

    @precondition(lambda self: self.next_id > 0)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        self.sched.abort(data.draw(st.integers(0, self.next_id - 1)))

    @invariant()
    def consistent(self) -> None:
        self.alloc.check_invariants()
        held = sum(1 << (self.alloc.reservation_of(s) - 1).bit_length() for s in self.sched.running)
        assert held == self.alloc.num_used_blocks

    def teardown(self) -> None:
        if hasattr(self, "sched"):
            run_to_completion(self.sched)
            assert self.alloc.get_num_free_blocks() == self.alloc.num_blocks


TestContiguousMachine = ContiguousMachine.TestCase
TestContiguousMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30)), min_size=1, max_size=12),
    num_slots=st.integers(64, 400),
    policy=st.sampled_from(["max", "pow2", "oracle"]),
)
def test_fast_decode_matches_the_plain_scheduler_with_a_contiguous_allocator(
    lengths: list[tuple[int, int]], num_slots: int, policy: str
) -> None:
    streams = []
    for scheduler_class in (Scheduler, FastDecodeScheduler):
        rec = EventRecorder()
        alloc = ContiguousAllocator(num_slots, policy, max_model_len=64, event_sink=rec)  # type: ignore[arg-type]
        config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=64)
        sched = scheduler_class(config, alloc)  # type: ignore[arg-type]
        for i, (p, o) in enumerate(lengths):
            sched.add_request(seq(i, p, o))
        while sched.has_unfinished():
            out = sched.schedule()
            sched.update(out, [0] * out.num_seqs)
        cols, blocks = rec.columns()
        streams.append(({k: v.tolist() for k, v in cols.items()}, blocks.tolist()))
    assert streams[0] == streams[1]
