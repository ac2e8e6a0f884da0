"""The compiled classic scheduler (engine/compiled: ClassicCore) against the Python Scheduler.

Exactness is the compiled core's contract: given the same requests, steps, aborts and clock,
with every sampled token a placeholder, the two must schedule the same sequences with the
same token counts, preempt, reject and finish the same ones (with the same reasons), price
and account each step identically (kvsim/sim/executor.py's ``_counts`` with
``CostModelExecutor.blocks_walked``, kvsim/sim/simulation.py's ``prefill_tokens``, the step
kind), keep the same running and waiting order, counters, block tables and free queue, and
record the same event rows (scheduler and pool events interleaved, time stamps, block ids,
the STEP rows' kinds and sizes). ``ClassicPair`` (compiled_classic_drive.py) drives both from
hypothesis-drawn and seeded operation streams over block sizes 1 to 512, pools of 1 block to
2,000, batch and sequence limits that bind, max_model_len limits, watermarks, events on and
off, prompts that never fit or fit only alone (preemption storms, rejections while running),
aborts (also between a step's schedule and update) and arrivals between them, against the
plain Scheduler and cost mode's FastDecodeScheduler. The classic scheduler has no priorities
and no prefix cache, so there are none to draw. test_scheduler.py's conformance scenarios
that sample only placeholders run here on both paths too.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.compiled
from engine import SamplingParams, SchedulerConfig, Sequence

if engine.compiled.load() is None:
    pytest.skip(str(engine.compiled.unavailable_reason()), allow_module_level=True)
from engine.compiled import _core as core  # only once the extension is known to load
from tests.engine.compiled_classic_drive import (
    ClassicPair,
    Op,
    drive,
    make_setup,
    op_strategy,
    random_ops,
    random_setup,
)


@st.composite
def setups(draw: st.DrawFn) -> dict[str, Any]:
    bs = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64, 512]))
    return make_setup(
        num_blocks=draw(st.sampled_from([1, 2, 3, 5, 8, 13, 40, 500])),
        block_size=bs,
        sink=draw(st.sampled_from(["events", "events", "none"])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
        max_num_seqs=draw(st.sampled_from([1, 2, 3, 8])),
        max_num_batched_tokens=draw(st.sampled_from([1, bs, 3 * bs + 1, 16 * bs])),
        max_model_len=draw(st.sampled_from([None, None, 2 * bs + 1, 5 * bs])),
        max_output=draw(st.sampled_from([1, 3, 2 * bs + 3])),
        fast=draw(st.booleans()),
    )


EXAMPLES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@EXAMPLES
@given(setup=setups(), ops=st.lists(op_strategy, min_size=1, max_size=40))
def test_classic_core_matches_the_python_scheduler(setup: dict[str, Any], ops: list[Op]) -> None:
    drive(setup, ops)


@pytest.mark.slow
@settings(EXAMPLES, max_examples=1000)
@given(setup=setups(), ops=st.lists(op_strategy, min_size=1, max_size=120))
def test_classic_core_matches_the_python_scheduler_at_length(
    setup: dict[str, Any], ops: list[Op]
) -> None:
    drive(setup, ops)


STREAMS: list[dict[str, Any]] = [
    # one-block and tiny pools: every decode preempts or rejects
    make_setup(1, 1, max_output=6),
    make_setup(4, 4, max_num_seqs=8, max_output=20, fast=True),
    # the watermark, max_model_len below many prompts and outputs, no events
    make_setup(13, 16, watermark=0.1, max_model_len=40, max_output=60),
    make_setup(40, 4, max_model_len=13, sink="none", max_output=30, fast=True),
    # large blocks; a bigger pool compared in depth every 64 steps
    make_setup(8, 512, max_num_batched_tokens=700, max_output=40),
    make_setup(200, 16, max_num_seqs=64, max_num_batched_tokens=256, deep=False, fast=True),
]


@pytest.mark.parametrize("index", range(len(STREAMS)))
def test_classic_core_matches_on_seeded_streams(index: int) -> None:
    drive(STREAMS[index], random_ops(random.Random(index), 400))


# five setups that drain quickly (tiny to 2,000-block pools, block sizes 1 to 512, both Python
# schedulers); the long streams below draw from every setup
@pytest.mark.parametrize("seed", [0, 1, 3, 5, 7])
def test_classic_core_matches_on_random_setups(seed: int) -> None:
    rng = random.Random(1000 + seed)
    drive(random_setup(rng), random_ops(rng, 250))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(60))
def test_classic_core_matches_on_long_random_streams(seed: int) -> None:
    rng = random.Random(seed)
    drive(random_setup(rng), random_ops(rng, 1200))


# --- hand-computed cases ---------------------------------------------------------------------


def test_a_preemption_storm_recomputes_from_the_front_of_the_queue() -> None:
    """Three 2-block prompts in 6 blocks of 2 tokens: each decode that starts a block
    preempts the most recently admitted, which waits at the front and is recomputed with its
    generated tokens."""
    pair = ClassicPair(make_setup(6, 2, max_num_batched_tokens=64, max_output=8))
    for _ in range(3):
        pair.add(0, 0, c=1, d=7)  # 4 tokens (2 blocks), 8 output tokens
    pair.step()  # prefill all three: every block taken
    assert pair.core.get_num_free_blocks() == 0
    pair.step()  # seq 0 needs a block: seq 2 goes; seq 1 takes the block freed
    assert pair.core.preempted() == [2]
    assert pair.core.waiting() == [2]
    pair.drain()
    pair.compare_events()
    assert pair.core.step > 10


def test_rejection_reasons_are_the_python_texts() -> None:
    pair = ClassicPair(
        make_setup(4, 4, max_num_batched_tokens=10, max_model_len=12, max_num_seqs=4)
    )
    for seq_id, length in enumerate((13, 11, 17)):  # past max_model_len, the budget, the pool
        pair.core.add_request(seq_id, length, 2)
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        pair.py.add_request(Sequence(seq_id, range(length), params))
    out = pair.py.schedule()
    texts = [s.finish_reason for s in out.rejected]
    pair.py.update(out, [])
    pair.core.schedule()
    assert [reason for _, _, reason in pair.core.update()] == texts
    assert texts[0] == "prompt of 13 tokens exceeds max_model_len 12"
    assert texts[1] == "11 tokens exceed max_num_batched_tokens 10 (no chunked prefill)"


def test_a_sequence_outgrowing_the_pool_alone_is_rejected_with_its_blocks_freed() -> None:
    pair = ClassicPair(make_setup(2, 2, max_output=50))
    pair.add(0, 0, c=0, d=9)  # 3 tokens... grows past 4 while running alone
    pair.drain()
    pair.compare_events()
    assert pair.core.get_num_free_blocks() == 2


def test_abort_between_schedule_and_update_reuses_no_handle_early() -> None:
    """An aborted request's handle must not go to a request added before the step's update
    (that update would see the new request in the old one's place)."""
    pair = ClassicPair(make_setup(20, 4, max_output=5))
    pair.add(0, 0, c=1, d=3)
    pair.add(0, 0, c=2, d=3)

    def abort_then_add() -> None:
        pair.abort(0)
        pair.add(0, 0, c=1, d=2)

    pair.step(abort_then_add)
    pair.drain()
    pair.compare_events()


def test_misuse_raises() -> None:
    c = core.ClassicCore(4, 4)
    c.add_request(0, 3, 2)
    with pytest.raises(ValueError, match="already queued"):
        c.add_request(0, 3, 2)
    with pytest.raises(ValueError, match="empty"):
        c.add_request(1, 0, 2)
    with pytest.raises(ValueError, match="max_tokens"):
        c.add_request(1, 3, 0)
    with pytest.raises(RuntimeError):
        c.update()
    c.schedule()
    with pytest.raises(RuntimeError):
        c.schedule()
    with pytest.raises(ValueError, match="classic"):
        core.ClassicCore.from_config(SchedulerConfig(scheduler="v1"), 4, 4)


# --- test_scheduler.py's scenarios on both paths -----------------------------------------------
# Its cases that sample only placeholder tokens, through ClassicPair (which holds the core to
# the Python scheduler at every step); each asserts on the core the decision it exists for.


def conformance_pair(num_blocks: int = 64, block_size: int = 4, **config: Any) -> ClassicPair:
    """test_scheduler.make's scheduler (SchedulerConfig's defaults) as a pair."""
    limits = {"max_num_seqs": 256, "max_num_batched_tokens": 8192, **config}
    return ClassicPair(make_setup(num_blocks, block_size, **limits))


def test_admission_is_fcfs_and_stops_at_the_first_request_that_does_not_fit() -> None:
    pair = conformance_pair(num_blocks=10, max_num_batched_tokens=64)
    for length in (16, 40, 4):  # 4 blocks; 10 (not beside the first); would fit, may not pass
        pair.submit(length, 4)
    pair.step()
    assert pair.core.scheduled()[0] == [0] and pair.core.waiting() == [1, 2]


@pytest.mark.parametrize(("config", "admitted"), [
    ({"max_num_batched_tokens": 10, "max_num_seqs": 8}, [0, 1]),
    ({"max_num_seqs": 3}, [0, 1, 2]),
])  # fmt: skip
def test_token_budget_and_max_num_seqs_limit_a_prefill_batch(
    config: dict[str, int], admitted: list[int]
) -> None:
    pair = conformance_pair(**config)
    for _ in range(4):
        pair.submit(4, 4)
    pair.step()
    assert pair.core.scheduled()[0] == admitted


def test_preemption_picks_the_most_recently_admitted() -> None:
    pair = conformance_pair(num_blocks=4)
    for _ in range(3):
        pair.submit(4, 6)
    pair.step()
    pair.step()
    assert pair.core.preempted() == [2] and pair.core.scheduled()[0] == [0, 1]
    pair.drain()
    pair.compare_events()


def test_resumed_sequence_recomputes_prompt_plus_generated_tokens() -> None:
    pair = conformance_pair(num_blocks=4)
    pair.submit(4, 8)
    pair.submit(7, 8)
    for _ in range(3):
        pair.step()
    assert pair.core.preempted() == [1]
    while pair.core.request(1)["status"] == "waiting":  # type: ignore[index]
        pair.step()
    seq_ids, tokens = pair.core.scheduled()
    assert tokens[seq_ids.index(1)] == 7 + 2


def test_impossible_prompts_are_rejected_while_later_requests_still_run() -> None:
    pair = conformance_pair(num_blocks=4, max_model_len=100)
    for length, max_tokens in ((17, 4), (101, 4), (4, 2)):
        pair.submit(length, max_tokens)
    pair.step()
    assert pair.core.rejected() == [0, 1] and pair.core.scheduled()[0] == [2]
    pair.drain()
    pair.compare_events()


def test_a_sequence_growing_past_the_whole_pool_is_rejected_not_looping() -> None:
    pair = conformance_pair(num_blocks=2)
    seq = pair.submit(4, 100)
    pair.drain(max_steps=50)
    assert pair.core.step == 6 and seq.num_tokens == 9
    assert "KV capacity" in (seq.finish_reason or "")


def test_max_model_len_finishes_a_sequence_as_length() -> None:
    pair = conformance_pair(max_model_len=8)
    seq = pair.submit(6, 100)
    pair.drain()
    assert seq.num_tokens == 8 and seq.finish_reason == "length"


def test_preempted_sequences_return_to_the_front_of_the_queue_in_admission_order() -> None:
    pair = conformance_pair(num_blocks=5)
    for _ in range(5):
        pair.submit(4, 6)
    pair.step()
    pair.submit(4, 4)
    pair.step()
    assert pair.core.preempted() == [4, 3, 2] and pair.core.scheduled()[0] == [0, 1]
    assert pair.core.waiting() == [2, 3, 4, 5]
    pair.drain()
    pair.compare_events()
