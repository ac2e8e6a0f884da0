"""The compiled v1 scheduler (engine/compiled: V1Core) against the Python V1Scheduler.

Exactness is the compiled core's contract: given the same requests, steps, aborts and clock,
with every sampled token the same placeholder id, the two must schedule the same sequences
with the same token counts, preempt, reject, admit (with the same prefix hits) and finish the
same ones, price and account each step identically (kvsim/sim/executor.py's ``_counts``,
BlockManager.num_used_blocks, kvsim/sim/simulation.py's ``prefill_tokens``, the step kind),
keep the same running and waiting order, counters, block tables and free queue, and record
the same event rows (scheduler and pool events interleaved, time stamps, block ids, CACHE /
EVICT keys, the STEP rows' kinds and sizes). ``Pair`` (compiled_v1_drive.py) drives both from
hypothesis-drawn and long seeded operation streams over block sizes 1 to 512, pools of 1 to
8 blocks and larger, FCFS and priority, chunked prefill on and off, long-prefill thresholds,
max_model_len limits, watermarks, caching on and off, three event sinks, aborts (also between
a step's schedule and update), arrivals between them, and prompts sharing prefixes through
token ids, trace hash ids and none.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.compiled
from engine import SchedulerConfig

if engine.compiled.load() is None:
    pytest.skip(str(engine.compiled.unavailable_reason()), allow_module_level=True)
from engine.compiled import _core as core  # only once the extension is known to load
from tests.engine.compiled_v1_drive import (
    SOURCE_KINDS,
    Op,
    Pair,
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
        num_blocks=draw(st.sampled_from([1, 2, 3, 5, 8, 13, 40])),
        block_size=bs,
        seed=draw(st.integers(0, 3)),
        caching=draw(st.booleans()),
        sink=draw(st.sampled_from(["events", "events", "no_cache_events", "none"])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
        max_num_seqs=draw(st.sampled_from([1, 2, 3, 8])),
        max_num_batched_tokens=draw(st.sampled_from([1, bs, 3 * bs + 1, 16 * bs])),
        max_model_len=draw(st.sampled_from([None, None, 2 * bs + 1, 5 * bs])),
        chunked=draw(st.booleans()),
        threshold=draw(st.sampled_from([0, 0, 1, bs, 2 * bs + 1])),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        hash_block_size=draw(st.sampled_from([1, 3, bs, 2 * bs])),
        kinds=draw(st.sampled_from([("tokens",), ("hash_ids",), ("unique",), SOURCE_KINDS])),
        max_output=draw(st.sampled_from([1, 3, 2 * bs + 3])),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), ops=st.lists(op_strategy, min_size=1, max_size=40))
def test_v1_core_matches_the_python_v1_scheduler(setup: dict[str, Any], ops: list[Op]) -> None:
    drive(setup, ops)


STREAMS: list[dict[str, Any]] = [
    # tiny pools, every source, caching on: preemption storms and re-hits
    make_setup(1, 1, 0, max_output=6),
    make_setup(4, 4, 1, max_num_seqs=8, max_output=20),
    make_setup(8, 3, 2, policy="priority", max_output=12, threshold=2),
    # no caching, no chunked prefill, the watermark
    make_setup(13, 16, 3, caching=False, chunked=False, watermark=0.1, policy="priority"),
    # max_model_len below many prompts and outputs; no events recorded
    make_setup(40, 4, 4, max_model_len=13, sink="none", max_output=30),
    # prefix-cache events off; hash ids at another granularity
    make_setup(40, 8, 5, sink="no_cache_events", hash_block_size=3, threshold=5),
    # large blocks; a bigger pool compared in depth every 64 steps
    make_setup(8, 512, 6, max_num_batched_tokens=700, max_output=40),
    make_setup(200, 16, 7, max_num_seqs=64, max_num_batched_tokens=256, deep=False),
    # priority victims scheduled earlier in their step give their tokens back to later ones
    make_setup(
        8,
        1,
        8,
        policy="priority",
        max_num_batched_tokens=5,
        max_num_seqs=3,
        max_output=12,
        caching=False,
        threshold=2,
    ),
]


@pytest.mark.parametrize("index", range(len(STREAMS)))
def test_v1_core_matches_on_seeded_streams(index: int) -> None:
    drive(STREAMS[index], random_ops(random.Random(index), 400))


@pytest.mark.parametrize("seed", range(4))
def test_v1_core_matches_on_random_setups(seed: int) -> None:
    rng = random.Random(1000 + seed)
    drive(random_setup(rng, seed), random_ops(rng, 250))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(60))
def test_v1_core_matches_on_long_random_streams(seed: int) -> None:
    rng = random.Random(seed)
    drive(random_setup(rng, seed), random_ops(rng, 1200))


@pytest.mark.slow
def test_v1_core_matches_on_a_large_pool() -> None:
    setup = make_setup(
        2000, 16, 9, max_num_seqs=256, max_num_batched_tokens=2048, max_output=300,
        policy="priority", threshold=512, deep=False,
    )  # fmt: skip
    ops = [op for op in random_ops(random.Random(9), 6000) if op[0] != "tick" or op[1] < 50]
    drive(setup, ops)


# --- hand-computed cases ---------------------------------------------------------------------


def test_a_step_is_priced_and_accounted() -> None:
    """Two prompts (10 and 9 tokens, blocks of 4) under a 16-token budget: a prefill step of
    10 + 6 tokens, then a mixed one (a decode over 10 cached tokens, the other's last 3)."""
    v = core.V1Core(8, 4, True, max_num_batched_tokens=16)
    assert v.add_unique_request(0, 10, 5)
    assert v.add_token_request(1, list(range(9)), 3)
    assert not v.add_unique_request(2, 100, 5)  # 25 blocks: never fits
    assert v.schedule() == (2, 16, 0, 0, 55 + 21, 0, 0, 5, 0, 16, 0, 1)
    assert v.scheduled() == ([0, 1], [10, 6])
    assert v.rejected() == [2] and v.admitted() == [(0, 0), (1, 0)]
    reason = "exceeds KV capacity: 100 tokens need 25 blocks, the pool has 8"
    assert v.update() == [(2, "finished_rejected", reason)]
    # 0 decodes over 10 cached tokens; 1 computes its last 3 after 6
    assert v.schedule() == (2, 4, 1, 11, 6, 18, 6, 6, 2, 3, 0, 0)
    assert v.update() == []
    assert (v.num_running, v.num_waiting, v.num_cached_tokens) == (2, 0, 20)
    finished = []
    while v.has_unfinished():
        v.schedule()
        finished.append(v.update())
    assert finished[-1] == [(0, "finished_length", "length")]
    assert v.step == 5 and v.get_num_free_blocks() == 8


def test_rejections_give_the_python_reasons() -> None:
    v = core.V1Core(4, 4, max_model_len=8, enable_chunked_prefill=False, max_num_batched_tokens=6)
    assert not v.add_unique_request(0, 8, 1)
    assert v.add_unique_request(1, 7, 1)  # queued, but more than the budget to compute
    v.schedule()
    assert v.update() == [
        (0, "finished_rejected", "prompt of 8 tokens leaves no room for an output token "
         "within max_model_len 8"),
        (1, "finished_rejected", "7 tokens to compute exceed max_num_batched_tokens 6 "
         "(no chunked prefill)"),
    ]  # fmt: skip
    assert not v.has_unfinished()


def test_abort_and_misuse() -> None:
    v = core.V1Core(8, 4)
    assert v.add_unique_request(0, 5, 4)
    with pytest.raises(ValueError, match="already queued"):
        v.add_unique_request(0, 5, 4)
    with pytest.raises(RuntimeError, match="without a scheduled step"):
        v.update()
    v.schedule()
    with pytest.raises(RuntimeError, match="never updated"):
        v.schedule()
    assert v.abort(0) and not v.abort(0) and not v.abort(7)
    assert v.update() == []  # the aborted request is skipped
    assert v.add_unique_request(0, 5, 4)  # its seq_id may come back
    state = v.request(0)
    assert state is not None and state["status"] == "waiting"


def test_from_config_takes_the_v1_options() -> None:
    config = SchedulerConfig(scheduler="v1", max_num_seqs=3, policy="priority")
    v = core.V1Core.from_config(config, 10, 2, True, watermark=0.25)
    assert v.watermark_blocks == int(0.25 * 11) and v.block_size == 2
    with pytest.raises(ValueError, match="scheduler='v1'"):
        core.V1Core.from_config(SchedulerConfig(), 10, 2)
    with pytest.raises(ValueError, match="policy"):
        core.V1Core(10, 2, policy="lifo")


def test_events_carry_the_clock() -> None:
    pair = Pair(make_setup(6, 2, 0))
    pair.tick(1.5)
    pair.add(0, 0, 1, 2)
    pair.step()
    pair.tick(0.25)
    pair.step(("add", 1, 1, 2, 1))
    pair.drain()
    assert pair.recorder is not None
    assert len(set(pair.recorder.columns()[0]["time_s"].tolist())) == 2
    pair.compare_events()
