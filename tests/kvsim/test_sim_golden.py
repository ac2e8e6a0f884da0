"""Golden timelines: tiny simulations whose every event was worked out by hand.

All runs use conftest's ToyExecutor (prefill 1 s + 1/16 s per batched token, decode 1/4 s),
block_size 4, watermark 0 and no max_model_len. Times are sums of powers of two, so they are
exact and compare with ``==``.

Reminders used in the hand computations (engine/core/scheduler.py, engine/core/block_manager.py):
- a P-token prefill allocates ceil(P/4) blocks from the front of the FIFO free queue (a fresh
  pool hands out 0, 1, 2, ...; freed blocks go to the back) and samples the first token;
- a request with O output tokens then needs O - 1 decode steps; a decode step appends a block
  to a sequence whose cached token count is a multiple of 4;
- events at a schedule are stamped with the step's start, those of update() (FINISH, FREE)
  with its end; events between steps (ARRIVE, ABORT) carry the step in progress;
- FINISH/ABORT/REJECT carry the sequence's total tokens and the free count *before* its FREE.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest

from kvsim.runner import RunResult

ToySim = Callable[..., RunResult]  # conftest's toy_sim fixture

Row = tuple[str, int, float, int, int, int, int]


def ev(
    kind: str,
    seq: int,
    t: float,
    step: int,
    free: int,
    tokens: int = 0,
    blocks: tuple[int, ...] = (),
) -> list[Row]:
    """events.parquet rows of one event: (kind, seq_id, time_s, step, block_id, free_blocks,
    num_tokens), one per block, or one with block_id -1. ``free`` is the free-block count after
    the event."""
    return [(kind, seq, t, step, b, free, tokens) for b in (blocks or (-1,))]


def step_ev(t: float, step: int, free: int, tokens: int) -> list[Row]:
    return ev("STEP", -1, t, step, free, tokens)


def event_rows(events: pd.DataFrame) -> list[Row]:
    cols = ["kind", "seq_id", "time_s", "step", "block_id", "free_blocks", "num_tokens"]
    return [
        (str(k), int(s), float(t), int(st), int(b), int(f), int(n))
        for k, s, t, st, b, f, n in events[cols].itertuples(index=False)
    ]


STEP_COLS = [
    "step",
    "time_s",
    "duration_s",
    "kind",
    "num_seqs",
    "num_running",
    "num_batched_tokens",
    "free_blocks",
    "allocated_slots",
    "filled_slots",
]


def step_rows(steps: pd.DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in steps[STEP_COLS].astype({"kind": str}).itertuples(index=False)]


REQUEST_COLS = [
    "request_id",
    "status",
    "arrival_time_s",
    "admit_time_s",
    "first_token_time_s",
    "finish_time_s",
    "generated_tokens",
    "num_preemptions",
    "queueing_delay_s",
    "ttft_s",
    "tpot_s",
    "e2e_latency_s",
]


def request_rows(requests: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Rows with NaN replaced by None, so they compare with ``==``."""
    frame = requests[REQUEST_COLS].astype({"status": str, "request_id": str})
    return [
        tuple(None if isinstance(v, float) and math.isnan(v) else v for v in row)
        for row in frame.itertuples(index=False)
    ]


# --- three overlapping requests, no preemption -------------------------------------------------

# (arrival_s, prompt_tokens, output_tokens); 8 blocks of 4 tokens.
OVERLAP = [(0.0, 6, 3), (0.5, 3, 4), (0.75, 5, 2)]

OVERLAP_EVENTS = [
    *ev("ARRIVE", 0, 0.0, 0, 8, 6),
    # step 1 at 0: prefill r0 (6 tokens, blocks 0-1); lasts 1 + 6/16 = 1.375 s
    *ev("ALLOCATE", 0, 0.0, 1, 6, 6, (0, 1)),
    *ev("ADMIT", 0, 0.0, 1, 6, 6),
    *step_ev(0.0, 1, 6, 6),
    *ev("ARRIVE", 1, 0.5, 1, 6, 3),
    *ev("ARRIVE", 2, 0.75, 1, 6, 5),
    # step 2 at 1.375: prefill r1 (3 tokens, block 2) and r2 (5 tokens, blocks 3-4);
    # lasts 1 + 8/16 = 1.5 s
    *ev("ALLOCATE", 1, 1.375, 2, 5, 3, (2,)),
    *ev("ADMIT", 1, 1.375, 2, 5, 3),
    *ev("ALLOCATE", 2, 1.375, 2, 3, 5, (3, 4)),
    *ev("ADMIT", 2, 1.375, 2, 3, 5),
    *step_ev(1.375, 2, 3, 8),
    # step 3 at 2.875: decode r0 (token 6), r1 (3), r2 (5): no new block
    *step_ev(2.875, 3, 3, 3),
    # at 3.125 r2 has 2 tokens: done (5 + 2 tokens), its blocks go to the back of the queue
    *ev("FINISH", 2, 3.125, 3, 3, 7),
    *ev("FREE", 2, 3.125, 3, 5, 0, (3, 4)),
    # step 4 at 3.125: decode r0 (token 7), r1 (token 4 starts a block: 5, the queue's front)
    *ev("APPEND_BLOCK", 1, 3.125, 4, 4, 1, (5,)),
    *step_ev(3.125, 4, 4, 2),
    *ev("FINISH", 0, 3.375, 4, 4, 9),
    *ev("FREE", 0, 3.375, 4, 6, 0, (0, 1)),
    # step 5 at 3.375: decode r1 (token 5); at 3.625 r1 has its 4 tokens
    *step_ev(3.375, 5, 6, 1),
    *ev("FINISH", 1, 3.625, 5, 6, 7),
    *ev("FREE", 1, 3.625, 5, 8, 0, (2, 5)),
]

# step, time, duration, kind, seqs in batch, running, batched tokens, free blocks,
# allocated slots = (8 - free) * 4, filled slots = cached tokens of running seqs + this step's
OVERLAP_STEPS = [
    (1, 0.0, 1.375, "prefill", 1, 1, 6, 6, 8, 0 + 6),
    (2, 1.375, 1.5, "prefill", 2, 3, 8, 3, 20, 6 + 8),
    (3, 2.875, 0.25, "decode", 3, 3, 3, 3, 20, 14 + 3),
    (4, 3.125, 0.25, "decode", 2, 2, 2, 4, 16, 7 + 4 + 2),
    (5, 3.375, 0.25, "decode", 1, 1, 1, 6, 8, 5 + 1),
]

# first token = end of the admitting prefill step; TPOT = (finish - first) / (generated - 1)
OVERLAP_REQUESTS = [
    # id, status, arrival, admit, first token, finish, generated, preempt, queue, TTFT, TPOT, e2e
    ("r0", "finished", 0.0, 0.0, 1.375, 3.375, 3, 0, 0.0, 1.375, 2.0 / 2, 3.375),
    ("r1", "finished", 0.5, 1.375, 2.875, 3.625, 4, 0, 0.875, 2.375, 0.75 / 3, 3.125),
    ("r2", "finished", 0.75, 1.375, 2.875, 3.125, 2, 0, 0.625, 2.125, 0.25 / 1, 2.375),
]


def test_overlapping_requests_follow_the_hand_computed_timeline(toy_sim: ToySim) -> None:
    result = toy_sim(OVERLAP, num_blocks=8, block_size=4)
    assert event_rows(result.events) == OVERLAP_EVENTS
    assert step_rows(result.steps) == OVERLAP_STEPS
    assert request_rows(result.requests) == OVERLAP_REQUESTS


def test_overlapping_requests_summary_matches_hand_computation(toy_sim: ToySim) -> None:
    s = toy_sim(OVERLAP, num_blocks=8, block_size=4).summary
    assert (s["num_requests"], s["num_finished"], s["num_preemptions"]) == (3, 3, 0)
    assert (s["num_rejected"], s["num_aborted"], s["num_unfinished"]) == (0, 0, 0)
    assert s["sim_duration_s"] == 3.625 and s["busy_time_s"] == 3.625
    assert s["num_steps"] == 5 and s["max_batch_size"] == 3
    assert s["throughput_requests_per_s"] == pytest.approx(3 / 3.625)
    assert s["throughput_output_tokens_per_s"] == pytest.approx(9 / 3.625)
    assert s["throughput_total_tokens_per_s"] == pytest.approx((9 + 14) / 3.625)
    # sum(allocated * duration) = 8*1.375 + 20*1.5 + 20*.25 + 16*.25 + 8*.25 = 52 slot-seconds
    # of 32 slots over 3.625 busy seconds
    assert s["kv_usage_mean"] == pytest.approx(52 / (32 * 3.625))
    assert s["kv_usage_peak"] == 20 / 32
    # (allocated - filled) * duration = 2*1.375 + 6*1.5 + (3 + 3 + 2)*.25 = 13.75
    assert s["internal_fragmentation_mean"] == pytest.approx(13.75 / (32 * 3.625))
    # running: 1*1.375 + 3*1.5 + (3 + 2 + 1)*.25 = 7.375; batch: 1.375 + 3 + 1.5 = 5.875
    assert s["mean_running_seqs"] == pytest.approx(7.375 / 3.625)
    assert s["mean_batch_size"] == pytest.approx(5.875 / 3.625)
    # TTFTs 1.375, 2.125, 2.375; percentiles interpolate linearly between order statistics
    assert s["ttft_s"] == pytest.approx(
        {"mean": 5.875 / 3, "p50": 2.125, "p90": 2.125 + 0.8 * 0.25, "p99": 2.125 + 0.98 * 0.25}
    )
    assert s["e2e_latency_s"]["mean"] == pytest.approx((3.375 + 3.125 + 2.375) / 3)
    assert s["tpot_s"]["p50"] == 0.25
    assert s["queueing_delay_s"]["mean"] == pytest.approx((0 + 0.875 + 0.625) / 3)


# --- three requests, one preemption -------------------------------------------------------------

# 5 blocks of 4 tokens.
PREEMPTION = [(0.0, 4, 6), (0.25, 7, 2), (0.5, 4, 4)]

PREEMPTION_EVENTS = [
    *ev("ARRIVE", 0, 0.0, 0, 5, 4),
    # step 1 at 0: prefill r0 (block 0); 1 + 4/16 = 1.25 s
    *ev("ALLOCATE", 0, 0.0, 1, 4, 4, (0,)),
    *ev("ADMIT", 0, 0.0, 1, 4, 4),
    *step_ev(0.0, 1, 4, 4),
    *ev("ARRIVE", 1, 0.25, 1, 4, 7),
    *ev("ARRIVE", 2, 0.5, 1, 4, 4),
    # step 2 at 1.25: prefill r1 (7 tokens: blocks 1-2) and r2 (block 3); 1 + 11/16 s
    *ev("ALLOCATE", 1, 1.25, 2, 2, 7, (1, 2)),
    *ev("ADMIT", 1, 1.25, 2, 2, 7),
    *ev("ALLOCATE", 2, 1.25, 2, 1, 4, (3,)),
    *ev("ADMIT", 2, 1.25, 2, 1, 4),
    *step_ev(1.25, 2, 1, 11),
    # step 3 at 2.9375: decode. r0's token 4 takes the last free block (4); r1's token 7 fits;
    # r2's token 4 needs a block, none is free: r2, the most recently admitted, is preempted
    # (its block is freed first) and the step decodes r0 and r1 only
    *ev("APPEND_BLOCK", 0, 2.9375, 3, 0, 1, (4,)),
    *ev("FREE", 2, 2.9375, 3, 1, 0, (3,)),
    *ev("PREEMPT", 2, 2.9375, 3, 1),
    *step_ev(2.9375, 3, 1, 2),
    *ev("FINISH", 1, 3.1875, 3, 1, 9),
    *ev("FREE", 1, 3.1875, 3, 3, 0, (1, 2)),
    # step 4 at 3.1875: recompute r2's prompt and its one generated token (5 tokens) in blocks
    # 3 and 1 (the free queue is 3, 1, 2); 1 + 5/16 = 1.3125 s
    *ev("ALLOCATE", 2, 3.1875, 4, 1, 5, (3, 1)),
    *ev("RESUME", 2, 3.1875, 4, 1, 5),
    *step_ev(3.1875, 4, 1, 5),
    # steps 5 and 6: decode r0 (tokens 5, 6) and r2 (tokens 5, 6); r2 then has its 4 tokens
    *step_ev(4.5, 5, 1, 2),
    *step_ev(4.75, 6, 1, 2),
    *ev("FINISH", 2, 5.0, 6, 1, 8),
    *ev("FREE", 2, 5.0, 6, 3, 0, (3, 1)),
    # steps 7 and 8: decode r0 (token 7, then token 8 in block 2, the queue's front)
    *step_ev(5.0, 7, 3, 1),
    *ev("APPEND_BLOCK", 0, 5.25, 8, 2, 1, (2,)),
    *step_ev(5.25, 8, 2, 1),
    *ev("FINISH", 0, 5.5, 8, 2, 10),
    *ev("FREE", 0, 5.5, 8, 5, 0, (0, 4, 2)),
]

PREEMPTION_STEPS = [
    (1, 0.0, 1.25, "prefill", 1, 1, 4, 4, 4, 0 + 4),
    (2, 1.25, 1.6875, "prefill", 2, 3, 11, 1, 16, 4 + 11),
    # r2's 4 cached tokens left with it: 4 (r0) + 7 (r1) cached, plus 2 written
    (3, 2.9375, 0.25, "decode", 2, 2, 2, 1, 16, 11 + 2),
    (4, 3.1875, 1.3125, "prefill", 1, 2, 5, 1, 16, 5 + 5),
    (5, 4.5, 0.25, "decode", 2, 2, 2, 1, 16, 10 + 2),
    (6, 4.75, 0.25, "decode", 2, 2, 2, 1, 16, 12 + 2),
    (7, 5.0, 0.25, "decode", 1, 1, 1, 3, 8, 7 + 1),
    (8, 5.25, 0.25, "decode", 1, 1, 1, 2, 12, 8 + 1),
]

PREEMPTION_REQUESTS = [
    ("r0", "finished", 0.0, 0.0, 1.25, 5.5, 6, 0, 0.0, 1.25, 4.25 / 5, 5.5),
    ("r1", "finished", 0.25, 1.25, 2.9375, 3.1875, 2, 0, 1.0, 2.6875, 0.25 / 1, 2.9375),
    # r2's first token came from its first prefill; the preemption kept it
    ("r2", "finished", 0.5, 1.25, 2.9375, 5.0, 4, 1, 0.75, 2.4375, 2.0625 / 3, 4.5),
]


def test_preempted_request_follows_the_hand_computed_timeline(toy_sim: ToySim) -> None:
    result = toy_sim(PREEMPTION, num_blocks=5, block_size=4)
    assert event_rows(result.events) == PREEMPTION_EVENTS
    assert step_rows(result.steps) == PREEMPTION_STEPS
    assert request_rows(result.requests) == PREEMPTION_REQUESTS
    s = result.summary
    assert (s["num_preemptions"], s["num_finished"], s["sim_duration_s"]) == (1, 3, 5.5)
    assert s["kv_usage_peak"] == 16 / 20


# --- an arrival during a run of decode steps ------------------------------------------------------


def test_arrival_during_decode_is_admitted_at_the_next_step_boundary(toy_sim: ToySim) -> None:
    # r0: 4-token prompt, 8 output tokens; r1 arrives at 1.625, inside decode step 3
    # (1.5 - 1.75), and is prefilled by step 4 at 1.75, pausing r0's decodes for 1.25 s.
    result = toy_sim([(0.0, 4, 8), (1.625, 4, 2)], num_blocks=8, block_size=4)
    assert event_rows(result.events) == [
        *ev("ARRIVE", 0, 0.0, 0, 8, 4),
        *ev("ALLOCATE", 0, 0.0, 1, 7, 4, (0,)),
        *ev("ADMIT", 0, 0.0, 1, 7, 4),
        *step_ev(0.0, 1, 7, 4),
        *ev("APPEND_BLOCK", 0, 1.25, 2, 6, 1, (1,)),  # token 4 of r0
        *step_ev(1.25, 2, 6, 1),
        *step_ev(1.5, 3, 6, 1),
        *ev("ARRIVE", 1, 1.625, 3, 6, 4),
        *ev("ALLOCATE", 1, 1.75, 4, 5, 4, (2,)),
        *ev("ADMIT", 1, 1.75, 4, 5, 4),
        *step_ev(1.75, 4, 5, 4),
        *ev("APPEND_BLOCK", 1, 3.0, 5, 4, 1, (3,)),  # token 4 of r1; r0 writes its token 6
        *step_ev(3.0, 5, 4, 2),
        *ev("FINISH", 1, 3.25, 5, 4, 6),
        *ev("FREE", 1, 3.25, 5, 6, 0, (2, 3)),
        *step_ev(3.25, 6, 6, 1),  # r0 token 7
        *ev("APPEND_BLOCK", 0, 3.5, 7, 5, 1, (4,)),  # r0 token 8; the queue is 4, 5, 6, 7, 2, 3
        *step_ev(3.5, 7, 5, 1),
        *step_ev(3.75, 8, 5, 1),
        *step_ev(4.0, 9, 5, 1),  # r0 token 10, its 8th output token is sampled
        *ev("FINISH", 0, 4.25, 9, 5, 12),
        *ev("FREE", 0, 4.25, 9, 8, 0, (0, 1, 4)),
    ]
    assert request_rows(result.requests) == [
        # r0's 7 later tokens came from 1.25 to 4.25
        ("r0", "finished", 0.0, 0.0, 1.25, 4.25, 8, 0, 0.0, 1.25, 3.0 / 7, 4.25),
        ("r1", "finished", 1.625, 1.75, 3.0, 3.25, 2, 0, 0.125, 1.375, 0.25, 1.625),
    ]


# --- cancellation ---------------------------------------------------------------------------------

# OVERLAP with patience: r0 gives up at 2.0 (running, between its prefill and its first decode),
# r1 at 0.5 + 1.0 = 1.5 (in the middle of its own prefill step, 1.375 - 2.875), r3 at
# 1.0 + 0.25 = 1.25 (still waiting); r2 would give up at 10.75 but is done at 3.125.
CANCEL = [(0.0, 6, 3, 2.0), (0.5, 3, 4, 1.0), (0.75, 5, 2, 10.0), (1.0, 4, 2, 0.25)]


def test_cancelled_requests_are_aborted_and_their_blocks_freed_at_once(toy_sim: ToySim) -> None:
    result = toy_sim(CANCEL, num_blocks=8, block_size=4)
    assert (
        event_rows(result.events)
        == [
            *OVERLAP_EVENTS[:7],  # r0 prefilled; r1 and r2 arrive
            *ev("ARRIVE", 3, 1.0, 1, 6, 4),
            *ev("ABORT", 3, 1.25, 1, 6, 4),  # waiting: holds no block, so no FREE
            *OVERLAP_EVENTS[7:13],  # step 2 prefills r1 and r2
            *ev("ABORT", 1, 1.5, 2, 3, 3),
            *ev("FREE", 1, 1.5, 2, 4, 0, (2,)),
            *ev("ABORT", 0, 2.0, 2, 4, 7),  # 6 prompt tokens + the first sampled one
            *ev("FREE", 0, 2.0, 2, 6, 0, (0, 1)),
            # step 2's update skips r1; step 3 decodes r2 alone
            *step_ev(2.875, 3, 6, 1),
            *ev("FINISH", 2, 3.125, 3, 6, 7),
            *ev("FREE", 2, 3.125, 3, 8, 0, (3, 4)),
        ]
    )
    requests = result.requests.set_index("request_id")
    assert list(requests["status"].astype(str)) == ["aborted", "aborted", "finished", "aborted"]
    assert list(requests["finish_time_s"]) == [2.0, 1.5, 3.125, 1.25]
    assert list(requests["generated_tokens"]) == [1, 0, 2, 0]
    assert requests["e2e_latency_s"].isna().tolist() == [True, True, False, True]
    assert requests.loc["r0", "ttft_s"] == 1.375
    assert math.isnan(requests.loc["r3", "admit_time_s"])
    # step 3 holds r2 alone: 2 blocks, 5 cached tokens + 1 written
    assert step_rows(result.steps)[-1] == (3, 2.875, 0.25, "decode", 1, 1, 1, 6, 8, 6)
    s = result.summary
    assert (s["num_aborted"], s["num_finished"], s["num_unfinished"]) == (3, 1, 0)
    assert s["sim_duration_s"] == 3.125  # r2's pending patience timer does not extend the run


def test_request_aborted_before_its_first_token_has_no_ttft(toy_sim: ToySim) -> None:
    result = toy_sim(CANCEL, num_blocks=8, block_size=4)
    r1 = result.requests.set_index("request_id").loc["r1"]
    assert r1["generated_tokens"] == 0
    assert math.isnan(r1["first_token_time_s"]) and math.isnan(r1["ttft_s"])


# --- --until --------------------------------------------------------------------------------------


def test_until_stops_the_run_and_leaves_requests_unfinished(toy_sim: ToySim) -> None:
    # OVERLAP stopped at 3.0, in the middle of step 3 (2.875 - 3.125) and before the
    # 4th request arrives at 5.0.
    result = toy_sim([*OVERLAP, (5.0, 4, 1)], num_blocks=8, block_size=4, until=3.0)
    assert event_rows(result.events) == OVERLAP_EVENTS[:14]  # up to step 3's STEP event
    assert list(result.requests["request_id"]) == ["r0", "r1", "r2"]  # r3 never arrived
    assert (result.requests["status"] == "unfinished").all()
    assert result.requests["finish_time_s"].isna().all()
    assert result.requests["generated_tokens"].isna().all()
    assert list(result.requests["first_token_time_s"]) == [1.375, 2.875, 2.875]
    s = result.summary
    assert s["sim_duration_s"] == 3.0
    assert (s["num_requests"], s["num_unfinished"], s["num_finished"]) == (3, 3, 0)
    assert s["throughput_requests_per_s"] == 0.0
    assert s["e2e_latency_s"]["p50"] is None


def test_until_inside_a_prefill_gives_no_first_token_after_the_end(toy_sim: ToySim) -> None:
    # stop at 2.0, inside step 2 (1.375 - 2.875) which prefills r1 and r2
    result = toy_sim(OVERLAP, num_blocks=8, block_size=4, until=2.0)
    end = result.summary["sim_duration_s"]
    first = result.requests["first_token_time_s"]
    assert (first.isna() | (first <= end)).all()
