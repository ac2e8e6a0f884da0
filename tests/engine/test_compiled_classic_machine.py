"""The classic scheduler's property machine (test_scheduler_properties.SchedulerMachine's
setups and traffic) run on both paths in lockstep: the Python Scheduler (or cost mode's
FastDecodeScheduler) and the compiled ClassicCore.

``CompiledClassicMachine`` draws the Python machine's pools and limits, adds requests of 1
to 200 prompt tokens (placeholder tokens only: every request ignores EOS), steps (with
arrivals and aborts between a step's schedule and update), aborts between steps, moves the
clock and sends bursts of long outputs into small pools (preemption storms);
compiled_classic_drive.ClassicPair compares every step. After every rule both agree in full
and the machine's own properties hold on both: the Python invariants, the running
sequences' blocks are every used block and their cached tokens the scheduler's count, no
waiting sequence holds a block. At the end every request finished with its max_tokens
generated (or as rejected or aborted) and every block is free.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import engine.compiled
from engine import Sequence, SequenceStatus

if engine.compiled.load() is None:
    pytest.skip(str(engine.compiled.unavailable_reason()), allow_module_level=True)
from tests.engine.compiled_classic_drive import ClassicPair, make_setup  # needs it


@st.composite
def machine_setups(draw: st.DrawFn) -> dict[str, Any]:
    """SchedulerMachine.setup's draws, as a ClassicPair setup (events on or off, and which
    Python scheduler)."""
    return make_setup(
        draw(st.integers(1, 12)),
        draw(st.integers(1, 64)),
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(1, 300)),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
        max_model_len=draw(st.sampled_from([None, None, None, 64, 150])),
        sink=draw(st.sampled_from(["events", "events", "none"])),
        fast=draw(st.booleans()),
    )


class CompiledClassicMachine(RuleBasedStateMachine):
    """The Python classic scheduler and ClassicCore side by side, rule by rule."""

    pair: ClassicPair
    deep_every_step = False  # full comparisons after every step, not only every rule
    drain_steps = 300  # steps run at the end of an example before aborting what is left

    @initialize(setup=machine_setups())
    def build(self, setup: dict[str, Any]) -> None:
        self.pair = ClassicPair({**setup, "deep": self.deep_every_step})
        self.seqs: list[Sequence] = []

    def _add(self, prompt: int, max_tokens: int) -> None:
        self.seqs.append(self.pair.submit(prompt, max_tokens))

    @rule(prompt=st.integers(1, 200), max_tokens=st.integers(1, 40))
    def add_request(self, prompt: int, max_tokens: int) -> None:
        self._add(prompt, max_tokens)

    @rule(abort=st.one_of(st.none(), st.integers(0, 30)))
    def step(self, abort: int | None) -> None:
        self.pair.step(None if abort is None else ("abort", abort, 0, 0, 0))

    @rule(prompt=st.integers(1, 200), max_tokens=st.integers(1, 40))
    def step_with_an_arrival(self, prompt: int, max_tokens: int) -> None:
        """A request arrives between a step's schedule and its update."""
        self.pair.step(lambda: self._add(prompt, max_tokens))

    @rule(steps=st.integers(2, 12))
    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.pair.step()

    @rule(seq_id=st.integers(0, 30))
    def abort_between_steps(self, seq_id: int) -> None:
        assert self.pair.core.abort(seq_id) == self.pair.py.abort(seq_id)

    @rule(
        count=st.integers(3, 8),
        prompt=st.integers(1, 64),
        max_tokens=st.integers(20, 60),
        steps=st.integers(1, 8),
    )
    def burst(self, count: int, prompt: int, max_tokens: int, steps: int) -> None:
        """Preemption pressure: several long-output requests, then steps while they grow."""
        for k in range(count):
            self._add(prompt + k, max_tokens)
        for _ in range(steps):
            self.pair.step()

    @rule(dt=st.sampled_from([0.0, 0.125, 1.0, 7.5]))
    def tick(self, dt: float) -> None:
        self.pair.tick(dt)

    @invariant()
    def both_paths_agree_and_hold_the_properties(self) -> None:
        if not hasattr(self, "pair"):
            return
        pair = self.pair
        pair.compare(deep=True)  # also tables, free queue, Python invariants
        running_blocks = sum(len(s.block_table) for s in pair.py.running)
        assert running_blocks == pair.bm.num_used_blocks == pair.core.num_used_blocks
        assert all(not s.block_table for s in pair.py.waiting)
        cached = sum(pair.exact(s)[0] for s in pair.py.running)
        assert pair.core.num_cached_tokens == cached

    def teardown(self) -> None:
        if not hasattr(self, "pair"):
            return
        pair = self.pair
        pair.finish_or_abort(self.drain_steps)
        assert pair.core.get_num_free_blocks() == pair.setup["num_blocks"]
        for seq in self.seqs:
            assert seq.is_finished and not seq.block_table
            if seq.status is SequenceStatus.FINISHED_LENGTH:
                limit = pair.setup["max_model_len"]
                n = len(seq.generated_token_ids)
                assert n == seq.sampling_params.max_tokens or (limit and seq.num_tokens >= limit)


CompiledClassicMachine.TestCase.settings = settings(
    max_examples=15, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestCompiledClassicMachine = CompiledClassicMachine.TestCase


class SlowCompiledClassicMachine(CompiledClassicMachine):
    """More and longer examples, compared in full after every step, run to the end."""

    deep_every_step = True
    drain_steps = 100_000


# 100 examples: 200 took 126 s of the slow set on a loaded machine (each compared in full
# after every step against two Python schedulers), which .ci/run's 15 minutes cannot spare
SlowCompiledClassicMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestSlowCompiledClassicMachine = pytest.mark.slow(SlowCompiledClassicMachine.TestCase)
