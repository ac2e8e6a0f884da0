"""engine.factory: which class runs which policy on which path, and old callers' spelling."""

from __future__ import annotations

import pytest

from engine import (
    BlockManager,
    EventRecorder,
    FastV1Scheduler,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    Sequence,
    V1Scheduler,
    make_scheduler,
    scheduler_class,
)
from engine.fast.decode import FastDecodeScheduler


@pytest.mark.parametrize(
    ("policy", "fast", "expected"),
    [
        ("classic", False, Scheduler),
        ("classic", True, FastDecodeScheduler),
        ("v1", False, V1Scheduler),
        ("v1", True, FastV1Scheduler),
    ],
)
def test_make_scheduler_builds_the_class_of_the_table(
    policy: str, fast: bool, expected: type[Scheduler]
) -> None:
    config = SchedulerConfig(scheduler=policy)
    built = make_scheduler(config, BlockManager(64, 16), fast=fast)
    assert type(built) is expected
    assert scheduler_class(config, fast=fast) is expected
    assert built.is_v1 == (policy == "v1")


def test_old_callers_spelling_still_builds_the_v1_classes() -> None:
    v1 = SchedulerConfig(scheduler="v1")
    assert type(Scheduler(v1, BlockManager(64, 16))) is V1Scheduler
    fast = FastDecodeScheduler(v1, BlockManager(64, 16), token=7)
    assert type(fast) is FastV1Scheduler
    assert fast.token == 7  # built whole: FastV1Scheduler is no FastDecodeScheduler


def test_a_subclass_without_a_v1_counterpart_says_to_use_the_factory() -> None:
    class Mine(Scheduler):
        pass

    with pytest.raises(SchedulerError, match="make_scheduler"):
        Mine(SchedulerConfig(scheduler="v1"), BlockManager(64, 16))
    assert type(Mine(SchedulerConfig(), BlockManager(64, 16))) is Mine


def test_events_go_to_the_given_sink_else_the_block_managers() -> None:
    config = SchedulerConfig(scheduler="v1")
    for use_given in (True, False):
        given, own = EventRecorder(), EventRecorder()
        bm = BlockManager(64, 16, event_sink=own)
        sched = make_scheduler(config, bm, given if use_given else None, fast=True)
        sched.add_request(Sequence(0, range(20), SamplingParams(max_tokens=3, ignore_eos=True)))
        while sched.has_unfinished():
            out = sched.schedule()
            sched.update(out, [0] * out.num_seqs)
        sink, other = (given, own) if use_given else (own, given)
        assert "FINISH" in {k.name for k in sink.kinds_of(0)}
        # the scheduler's own events go to one sink (the pool's block events stay with the pool)
        assert "FINISH" not in {k.name for k in other.kinds_of(0)}
