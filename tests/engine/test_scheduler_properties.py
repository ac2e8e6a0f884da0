"""Hypothesis state machine: random traffic through the real Scheduler and BlockManager.

After every rule the BlockManager's invariants hold; when nothing is unfinished, every block
is free; every sequence ends in a finished state with a token count its limits allow.
"""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine import (
    BlockManager,
    EventRecorder,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    Sequence,
    SequenceStatus,
)

EOS = 0


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.integers(1, 64),
        num_blocks=st.integers(1, 12),
        max_num_seqs=st.integers(1, 6),
        max_num_batched_tokens=st.integers(1, 300),
        watermark=st.sampled_from([0.0, 0.0, 0.1, 0.3]),
    )
    def setup(
        self,
        block_size: int,
        num_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        watermark: float,
    ) -> None:
        self.recorder = EventRecorder()
        self.bm = BlockManager(num_blocks, block_size, watermark, event_sink=self.recorder)
        config = SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
        )
        self.sched = Scheduler(config, self.bm)
        self.seqs: dict[int, Sequence] = {}
        self.next_id = 0

    @rule(
        prompt=st.integers(1, 200),
        max_tokens=st.integers(1, 40),
        ignore_eos=st.booleans(),
    )
    def add_request(self, prompt: int, max_tokens: int, ignore_eos: bool) -> None:
        params = SamplingParams(max_tokens=max_tokens, eos_token_id=EOS, ignore_eos=ignore_eos)
        seq = Sequence(self.next_id, list(range(1, prompt + 1)), params)
        self.seqs[seq.seq_id] = seq
        self.sched.add_request(seq)
        self.next_id += 1

    @rule(tokens=st.lists(st.integers(0, 5), min_size=0, max_size=8))
    def step(self, tokens: list[int]) -> None:
        out = self.sched.schedule()
        sampled = [(tokens[i] if i < len(tokens) else 1) for i in range(out.num_seqs)]
        if not out.is_empty:
            assert len(out.slot_mapping) == out.num_batched_tokens
            assert len(set(out.slot_mapping)) == len(out.slot_mapping)
        finished = self.sched.update(out, sampled)
        for seq in finished:
            assert seq.status.is_finished and seq.block_table == []

    @precondition(lambda self: self.next_id > 0)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.integers(0, self.next_id - 1))
        was_unfinished = not self.seqs[seq_id].is_finished
        assert self.sched.abort(seq_id) == was_unfinished
        assert self.seqs[seq_id].is_finished

    @invariant()
    def block_manager_is_consistent(self) -> None:
        self.bm.check_invariants()
        running_blocks = sum(len(s.block_table) for s in self.sched.running)
        assert running_blocks == self.bm.num_used_blocks
        assert all(not s.block_table for s in self.sched.waiting)
        assert self.sched.num_cached_tokens == sum(s.cached_token_count for s in self.sched.running)

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        for _ in range(20_000):
            if not self.sched.has_unfinished():
                break
            out = self.sched.schedule()
            self.sched.update(out, [1] * out.num_seqs)
            self.bm.check_invariants()
        assert not self.sched.has_unfinished()
        assert self.bm.get_num_free_blocks() == self.bm.num_blocks
        for seq in self.seqs.values():
            assert seq.is_finished
            n = len(seq.generated_token_ids)
            if seq.status is SequenceStatus.FINISHED_LENGTH:
                assert n == seq.sampling_params.max_tokens
            elif seq.status is SequenceStatus.FINISHED_STOPPED:
                assert seq.generated_token_ids[-1] == EOS and not seq.sampling_params.ignore_eos
                assert n <= seq.sampling_params.max_tokens


SchedulerMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None
)
TestSchedulerMachine = SchedulerMachine.TestCase


class FullSchedulerMachine(SchedulerMachine):
    """SchedulerMachine at full strength (-m slow)."""


FullSchedulerMachine.TestCase.settings = settings(
    SchedulerMachine.TestCase.settings, max_examples=150
)
TestSchedulerMachineAtFullStrength = pytest.mark.slow(FullSchedulerMachine.TestCase)
