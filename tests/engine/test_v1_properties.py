"""Property tests of the v1 scheduler: random arrivals, steps, aborts (between steps and
between schedule() and update()) and multi-step decode windows, under random pools, block
sizes, budgets, thresholds, policies, caching, chunking, watermarks and max_model_len.

Every step checks the BlockManager's v1 invariants (reference counts, the prefix-cache map,
the free queue with its evictable blocks, each holder's chunk progress), and the cost-mode
FastV1Scheduler must give exactly the plain V1Scheduler's steps, events, block ids, cache
keys and final sequences. ``V1Machine`` runs the two side by side as a hypothesis state
machine (arrivals, steps with and without a mid-step abort, aborts), comparing every step
and checking invariants after every rule.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from v1_drive import drive, make_prompt, op, pool_state, v1_setups

from engine import (
    BlockManager,
    EventRecorder,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    Sequence,
    SequenceStatus,
)
from engine.fast.decode import FastDecodeScheduler


def assert_same_outcomes(fast: list[Any], plain: list[Any]) -> None:
    """Every sequence ended alike: status, generated tokens, preemptions and reason."""
    for a, b in zip(fast, plain, strict=True):
        assert (a.status, a.generated_token_ids, a.num_preemptions, a.finish_reason) == (
            b.status, b.generated_token_ids, b.num_preemptions, b.finish_reason,
        )  # fmt: skip


# Each property runs a quick sample of examples by default, and the full count in its
# ..._at_full_strength twin under -m slow.
QUICK = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FULL = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FULL_150 = settings(FULL, max_examples=150)


@QUICK
@given(ops=st.lists(op, min_size=1, max_size=40), setup=v1_setups())
def test_fast_v1_matches_the_plain_v1_scheduler(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    fast_v1_matches(ops, setup)


@pytest.mark.slow
@FULL
@given(ops=st.lists(op, min_size=1, max_size=40), setup=v1_setups())
def test_fast_v1_matches_the_plain_v1_scheduler_at_full_strength(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    fast_v1_matches(ops, setup)


def fast_v1_matches(ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]) -> None:
    plain = drive(False, ops, setup, check=True)
    fast = drive(True, ops, setup, check=True)
    assert fast.trace == plain.trace
    assert fast.events == plain.events
    assert fast.block_ids == plain.block_ids
    assert fast.block_hashes == plain.block_hashes
    assert_same_outcomes(fast.sequences, plain.sequences)
    bm = plain.scheduler.block_manager
    assert bm.get_num_free_blocks() == setup["num_blocks"]  # cached blocks are free
    assert bm.reset_prefix_cache()
    bm.check_invariants()


@st.composite
def pressure(draw: st.DrawFn) -> tuple[list[tuple[str, int, int, int, int]], dict[str, Any]]:
    """FCFS runs whose pool is short while several sequences run (FastV1Scheduler then
    preempts in its own running pass, engine/fast/fast_v1.py): a small pool, a burst of requests
    with long outputs, then steps and multi-step windows with a few more arrivals."""
    setup = draw(v1_setups())
    setup.update(
        policy="fcfs",
        num_blocks=draw(st.integers(6, 24)),
        block_size=draw(st.sampled_from([1, 2, 4])),
        max_num_seqs=draw(st.integers(3, 8)),
        max_num_batched_tokens=draw(st.sampled_from([16, 40, 256])),
        watermark=0.0,
    )
    add = st.tuples(
        st.just("add"), st.integers(0, 3), st.integers(1, 8), st.integers(10, 30), st.just(0)
    )  # short prompts (segments of 3 and 7 tokens), so that several run at once
    burst = draw(st.lists(add, min_size=4, max_size=10))
    later = draw(st.lists(st.one_of(op, add), min_size=5, max_size=30))
    return [*burst, ("run", 12, 0, 0, 0), *later], setup


# No chunked prefill: preempted seq 2 (17 tokens, a budget of 16) waits within the budget
# only through its prefix hits, which the decoders' takes evict: the plain pass then rejects
# it, so the fast scheduler must not hold it as blocked (engine/fast/blocked_head.py)
REJECTED_ONCE_EVICTED = (
    [("add", 0, 1, 19, 0), ("add", 0, 1, 19, 0), ("add", 0, 5, 13, 0), ("add", 0, 1, 10, 0),
     ("run", 12, 0, 0, 0), *[("step", 1, 0, 0, 0)] * 4, ("run", 3, 0, 0, 0)],
    {"num_blocks": 20, "block_size": 2, "max_num_seqs": 3, "max_num_batched_tokens": 16,
     "threshold": 0, "policy": "fcfs", "caching": True, "chunked": False, "watermark": 0.0,
     "max_model_len": None, "prefix_kind": "tokens", "inspect": False},
)  # fmt: skip


@QUICK
@given(case=pressure(), events=st.booleans())
@example(case=REJECTED_ONCE_EVICTED, events=False)
def test_fast_v1_preempts_as_the_plain_running_pass_does(
    case: tuple[list[tuple[str, int, int, int, int]], dict[str, Any]], events: bool
) -> None:
    fast_v1_preempts_alike(*case, events)


@pytest.mark.slow
@FULL_150
@given(case=pressure(), events=st.booleans())
def test_fast_v1_preempts_as_the_plain_running_pass_does_at_full_strength(
    case: tuple[list[tuple[str, int, int, int, int]], dict[str, Any]], events: bool
) -> None:
    fast_v1_preempts_alike(*case, events)


def fast_v1_preempts_alike(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any], events: bool
) -> None:
    plain = drive(False, ops, setup, check=True, events=events)
    fast = drive(True, ops, setup, check=True, events=events)
    assert fast.trace == plain.trace
    assert fast.events == plain.events
    assert fast.block_ids == plain.block_ids
    assert fast.block_hashes == plain.block_hashes
    assert_same_outcomes(fast.sequences, plain.sequences)


# One unique prompt at block size 4, decoding with no event sink: its fills are counted
# only when it is brought up to date (engine/fast/lazy_v1.py).
UNIQUE_BS4 = {
    "num_blocks": 40, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 256,
    "threshold": 0, "policy": "fcfs", "caching": True, "chunked": True, "watermark": 0.0,
    "max_model_len": None, "prefix_kind": "unique", "inspect": False,
}  # fmt: skip


@QUICK
@given(ops=st.lists(op, min_size=1, max_size=40), setup=v1_setups())
# aborted in the plain step whose token fills its second block
@example(
    ops=[("add", 0, 1, 30, 0), ("step", 1, 0, 0, 0), ("run_abort", 3, 0, 0, 0)], setup=UNIQUE_BS4
)
def test_fast_v1_without_an_event_sink_matches_the_plain_v1_scheduler(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    fast_v1_without_a_sink_matches(ops, setup)


@pytest.mark.slow
@FULL
@given(ops=st.lists(op, min_size=1, max_size=40), setup=v1_setups())
def test_fast_v1_without_an_event_sink_matches_the_plain_v1_scheduler_at_full_strength(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    fast_v1_without_a_sink_matches(ops, setup)


def fast_v1_without_a_sink_matches(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    # With no sink the engine takes cheaper routes (a unique prompt's caching deferred to
    # its free, block takes and caches unmerged, no keys made for evictions); the pool at
    # every step must still be the plain one's, and that of a run with events.
    plain = drive(False, ops, setup, check=True, events=False)
    fast = drive(True, ops, setup, check=True, events=False)
    assert fast.trace == plain.trace
    assert_same_outcomes(fast.sequences, plain.sequences)
    assert pool_state(fast.scheduler.block_manager) == pool_state(plain.scheduler.block_manager)
    recorded = drive(False, ops, setup, check=True, pools=True)
    assert plain.trace == recorded.trace
    assert pool_state(plain.scheduler.block_manager) == pool_state(recorded.scheduler.block_manager)


@QUICK
@given(ops=st.lists(op, min_size=2, max_size=40), setup=v1_setups(), at=st.integers(1, 39))
# attached after plain steps that filled a block, before a step that fills the next
@example(
    ops=[("add", 0, 1, 30, 0), ("step", 1, 0, 0, 0), ("run", 3, 0, 0, 0), ("step", 1, 0, 0, 0)],
    setup=UNIQUE_BS4,
    at=3,
)
def test_an_event_sink_attached_mid_run_sees_the_pool_of_a_recorded_run(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any], at: int
) -> None:
    late_sink_sees_the_recorded_pool(ops, setup, at)


@pytest.mark.slow
@FULL_150
@given(ops=st.lists(op, min_size=2, max_size=40), setup=v1_setups(), at=st.integers(1, 39))
def test_an_event_sink_attached_mid_run_sees_the_pool_of_a_recorded_run_at_full_strength(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any], at: int
) -> None:
    late_sink_sees_the_recorded_pool(ops, setup, at)


def late_sink_sees_the_recorded_pool(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any], at: int
) -> None:
    # Blocks cached with no sink get their keys and counts before a sink sees them; the
    # events from then on are the recorded run's. (No invariant checks between ops: they
    # bring every sequence up to date, which would hide a stale count.)
    for fast in (False, True):
        late = drive(fast, ops, setup, check=False, pools=True, attach_after=at % len(ops))
        recorded = drive(fast, ops, setup, check=False, pools=True)
        assert late.trace == recorded.trace
        assert pool_state(late.scheduler.block_manager) == pool_state(
            recorded.scheduler.block_manager
        )
        num_events = len(late.events["kind"])
        for name, column in late.events.items():
            assert recorded.events[name][len(recorded.events[name]) - num_events :] == column
        assert recorded.block_ids[len(recorded.block_ids) - len(late.block_ids) :] == (
            late.block_ids
        )
        num_keys = len(late.block_hashes)
        assert recorded.block_hashes[len(recorded.block_hashes) - num_keys :] == late.block_hashes


@QUICK
@given(ops=st.lists(op, min_size=1, max_size=40), setup=v1_setups())
def test_every_request_ends_and_outputs_are_consistent(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    every_request_ends_consistently(ops, setup)


@pytest.mark.slow
@FULL_150
@given(ops=st.lists(op, min_size=1, max_size=40), setup=v1_setups())
def test_every_request_ends_and_outputs_are_consistent_at_full_strength(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    every_request_ends_consistently(ops, setup)


def every_request_ends_consistently(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    result = drive(False, ops, setup, check=True)
    budget = setup["max_num_batched_tokens"]
    for step in result.trace:
        if step[0] == "abort":
            continue
        _, batch, tokens, preempted, _, admitted, _, _, _, _, _ = step
        assert sum(tokens) <= budget
        assert len(batch) == len(set(batch)) <= setup["max_num_seqs"]
        assert not set(preempted) & set(batch)
        if preempted:
            assert not admitted  # nothing is admitted in a step that preempts
        if setup["threshold"] and len(batch) > 1:
            assert all(t <= setup["threshold"] for t in tokens)
    for seq in result.sequences:
        assert seq.status.is_finished
        if seq.status is SequenceStatus.FINISHED_LENGTH:
            max_len = setup["max_model_len"]
            assert seq.num_generated_tokens == seq.sampling_params.max_tokens or (
                max_len is not None and seq.num_tokens == max_len
            )
        assert seq.block_table == []


class V1Machine(RuleBasedStateMachine):
    """The plain V1Scheduler and the FastV1Scheduler side by side, rule by rule: same
    outputs after every step, invariants after every rule."""

    def __init__(self) -> None:
        super().__init__()
        self.pair: list[Any] = []
        self.next_id = 0

    @initialize(setup=v1_setups())
    def build(self, setup: dict[str, Any]) -> None:
        self.setup = setup
        for fast in (False, True):
            recorder = EventRecorder()
            bm = BlockManager(
                setup["num_blocks"],
                setup["block_size"],
                setup["watermark"],
                event_sink=recorder,
                enable_prefix_caching=setup["caching"],
            )
            config = SchedulerConfig(
                max_num_seqs=setup["max_num_seqs"],
                max_num_batched_tokens=setup["max_num_batched_tokens"],
                max_model_len=setup["max_model_len"],
                scheduler="v1",
                enable_chunked_prefill=setup["chunked"],
                long_prefill_token_threshold=setup["threshold"],
                policy=setup["policy"],
            )
            self.pair.append((FastDecodeScheduler if fast else Scheduler)(config, bm))

    @rule(
        mask=st.integers(0, 31),
        own=st.integers(0, 12),
        out=st.integers(1, 30),
        prio=st.integers(0, 3),
    )
    def add(self, mask: int, own: int, out: int, prio: int) -> None:
        prompt = make_prompt(mask, own, self.next_id)
        for sched in self.pair:
            params = SamplingParams(max_tokens=out, ignore_eos=True)
            arrival = float(self.next_id // 3)
            sched.add_request(Sequence(self.next_id, list(prompt), params, arrival, prio))
        self.next_id += 1

    @rule(abort=st.one_of(st.none(), st.integers(0, 30)))
    def step(self, abort: int | None) -> None:
        results = []
        for sched in self.pair:
            out = sched.schedule()
            aborted = sched.abort(abort) if abort is not None else None
            finished = sched.update(out, [0] * out.num_seqs)
            results.append(
                (
                    [(s.seq_id, n) for s, n in zip(out.seqs, out.num_new_tokens)],
                    [s.seq_id for s in out.preempted],
                    [s.seq_id for s in out.rejected],
                    [(s.seq_id, s.prefix_hit_tokens) for s in out.admitted],
                    [s.seq_id for s in finished],
                    aborted,
                    sched.num_cached_tokens,
                    sched.block_manager.get_num_free_blocks(),
                )
            )
        assert results[0] == results[1]

    @rule(seq_id=st.integers(0, 30))
    def abort_between_steps(self, seq_id: int) -> None:
        assert self.pair[0].abort(seq_id) == self.pair[1].abort(seq_id)

    @invariant()
    def pools_are_sound(self) -> None:
        for sched in self.pair:
            getattr(sched, "sync", lambda: None)()
            sched.block_manager.check_invariants()
        if self.pair:
            plain, fast = (s.block_manager for s in self.pair)
            assert plain.event_sink.columns()[0]["kind"].tolist() == (
                fast.event_sink.columns()[0]["kind"].tolist()
            )


V1Machine.TestCase.settings = settings(
    max_examples=20, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestV1Machine = V1Machine.TestCase


class FullV1Machine(V1Machine):
    """V1Machine at full strength (-m slow)."""


FullV1Machine.TestCase.settings = settings(V1Machine.TestCase.settings, max_examples=60)
TestV1MachineAtFullStrength = pytest.mark.slow(FullV1Machine.TestCase)
