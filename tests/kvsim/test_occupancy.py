"""kvsim.analysis.occupancy: block ownership intervals, the pixel grid and request states,
checked on hand-built event lists and on tiny simulations whose timelines are computed by hand."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from kvsim.analysis.occupancy import (
    FREE,
    SHARED,
    OccupancyError,
    block_intervals,
    occupancy_grid,
    owners_at,
    request_states,
)
from kvsim.config import RunConfig
from kvsim.runner import RunResult, run


def events_of(rows: list[tuple[float, int, str, int, int]]) -> pd.DataFrame:
    """An events table from (time_s, step, kind, seq_id, block_id) rows."""
    t, step, kind, seq, block = zip(*rows)
    return pd.DataFrame(
        {
            "time_s": t,
            "step": step,
            "kind": pd.Categorical(kind),
            "seq_id": seq,
            "block_id": block,
            "free_blocks": 0,
            "num_tokens": 0,
        }
    )


# seq 0 takes blocks 0, 1 at t=1, appends block 2 at t=2, is preempted at t=3 (frees all), gets
# blocks 2, 0 back at t=4 and still holds them at the end; seq 1 takes block 1 from t=3.5 to 5.
HAND_EVENTS = events_of(
    [
        (1.0, 1, "ALLOCATE", 0, 0),
        (1.0, 1, "ALLOCATE", 0, 1),
        (1.0, 1, "ADMIT", 0, -1),
        (2.0, 2, "APPEND_BLOCK", 0, 2),
        (3.0, 3, "FREE", 0, 0),
        (3.0, 3, "FREE", 0, 1),
        (3.0, 3, "FREE", 0, 2),
        (3.0, 3, "PREEMPT", 0, -1),
        (3.5, 4, "ALLOCATE", 1, 1),
        (4.0, 5, "ALLOCATE", 0, 2),
        (4.0, 5, "ALLOCATE", 0, 0),
        (5.0, 6, "FINISH", 1, -1),
        (5.0, 6, "FREE", 1, 1),
    ]
)


def test_block_intervals_pair_each_allocation_with_its_free() -> None:
    got = block_intervals(HAND_EVENTS, end_s=6.0)
    rows = set(got[["block_id", "seq_id", "start_s", "end_s", "start_step", "end_step"]].itertuples(
        index=False, name=None
    ))  # fmt: skip
    assert rows == {
        (0, 0, 1.0, 3.0, 1, 3),
        (1, 0, 1.0, 3.0, 1, 3),
        (2, 0, 2.0, 3.0, 2, 3),
        (1, 1, 3.5, 5.0, 4, 6),
        (2, 0, 4.0, 6.0, 5, -1),  # still held: ends at end_s, no end step
        (0, 0, 4.0, 6.0, 5, -1),
    }
    assert got["start_s"].is_monotonic_increasing


def test_a_free_without_allocation_is_an_error() -> None:
    bad = events_of([(1.0, 1, "ALLOCATE", 0, 0), (2.0, 2, "FREE", 0, 0), (3.0, 3, "FREE", 0, 0)])
    with pytest.raises(OccupancyError, match="FREE of block 0 by sequence 0"):
        block_intervals(bad)


def test_a_contiguous_region_becomes_one_holding_per_slot() -> None:
    # engine/contiguous/allocator.py: ALLOCATE and FREE name the region's first slot; its size is
    # the drop in free slots (16 -> 12: slots 8-11).
    events = events_of(
        [(0.0, 0, "ARRIVE", 0, -1), (1.0, 1, "ALLOCATE", 0, 8), (2.0, 2, "FREE", 0, 8)]
    )
    events["free_blocks"] = [16, 12, 16]
    got = block_intervals(events)
    assert got["block_id"].tolist() == [8, 9, 10, 11]
    assert set(got["start_s"]) == {1.0} and set(got["end_s"]) == {2.0}


@pytest.mark.parametrize("allocator", ["paged", "pow2"])
def test_blocks_held_match_the_free_counts(pressured_config: RunConfig, allocator: str) -> None:
    # At any moment the reconstruction holds exactly the blocks the pool says are in use.
    result = run(pressured_config.replace(num_blocks=1024, allocator=allocator, until=120.0))
    num_blocks = result.summary["num_blocks"]
    intervals = block_intervals(result.events, result.summary["sim_duration_s"])
    times = result.steps["time_s"].to_numpy()[::97]
    last = np.searchsorted(result.events["time_s"].to_numpy(), times, side="right") - 1
    expected = num_blocks - result.events["free_blocks"].to_numpy()[last]
    held = [int((owners_at(intervals, t, num_blocks) != FREE).sum()) for t in times]
    assert held == expected.tolist()
    assert len(times) > 20 and max(held) > 0


def test_a_prefix_hit_holds_its_block_until_the_free() -> None:
    # v1: seq 1 hits seq 0's cached block 0 (one more reference) and frees it with its table.
    events = events_of(
        [
            (1.0, 1, "ALLOCATE", 0, 0),
            (2.0, 2, "PREFIX_HIT", 1, 0),
            (2.0, 2, "ALLOCATE", 1, 5),
            (3.0, 3, "FREE", 0, 0),
            (4.0, 4, "FREE", 1, 0),
            (4.0, 4, "FREE", 1, 5),
        ]
    )
    rows = set(block_intervals(events)[["block_id", "seq_id", "start_s", "end_s"]].itertuples(
        index=False, name=None
    ))  # fmt: skip
    assert rows == {(0, 0, 1.0, 3.0), (0, 1, 2.0, 4.0), (5, 1, 2.0, 4.0)}


@pytest.mark.parametrize(
    "trace", ["azure_llm_2023_conv_first_2min", "mooncake_fast25_conversation_first_1000"]
)
def test_v1_blocks_held_match_the_free_counts(trace: str) -> None:
    # Prefix caching on: a resumed or sharing sequence holds blocks through PREFIX_HIT.
    result = run(RunConfig(trace=trace, scheduler="v1", num_blocks=800, until=120.0))
    assert result.summary["num_preemptions"] > 0
    assert (result.events["kind"] == "PREFIX_HIT").any()
    num_blocks = result.summary["num_blocks"]
    intervals = block_intervals(result.events, result.summary["sim_duration_s"])
    times = result.steps["time_s"].to_numpy()[::97]
    last = np.searchsorted(result.events["time_s"].to_numpy(), times, side="right") - 1
    expected = num_blocks - result.events["free_blocks"].to_numpy()[last]
    held = [int((owners_at(intervals, t, num_blocks) != FREE).sum()) for t in times]
    assert held == expected.tolist()
    assert len(times) > 20 and max(held) > 0


def test_owners_at_an_instant() -> None:
    iv = block_intervals(HAND_EVENTS, end_s=6.0)
    assert owners_at(iv, 0.5, 4).tolist() == [FREE] * 4
    assert owners_at(iv, 2.0, 4).tolist() == [0, 0, 0, FREE]  # held from its start time
    assert owners_at(iv, 3.0, 4).tolist() == [FREE] * 4  # released at its end time
    assert owners_at(iv, 4.5, 4).tolist() == [0, 1, 0, FREE]


def test_owners_at_marks_shared_blocks() -> None:
    iv = pd.DataFrame(
        {"block_id": [0, 0], "seq_id": [3, 4], "start_s": [0.0, 1.0], "end_s": [2.0, 2.0]}
    )
    assert owners_at(iv, 1.5, 2).tolist() == [SHARED, FREE]


def test_grid_cells_hold_the_exact_in_use_share() -> None:
    iv = block_intervals(HAND_EVENTS, end_s=6.0)
    grid = occupancy_grid(iv, 4, 0.0, 6.0, cols=6)
    expected = np.array(
        [
            [0, 1, 1, 0, 1, 1],  # block 0: [1, 3) and [4, 6)
            [0, 1, 1, 0.5, 1, 0],  # block 1: [1, 3), then seq 1 over [3.5, 5)
            [0, 0, 1, 0, 1, 1],  # block 2: [2, 3) and [4, 6)
            [0, 0, 0, 0, 0, 0],
        ]
    )
    np.testing.assert_allclose(grid.share, expected)
    np.testing.assert_allclose(grid.time_edges, np.arange(7.0))
    assert grid.owner is not None
    assert grid.owner[1].tolist() == [FREE, 0, 0, 1, 1, FREE]  # the owner at each centre


def test_grid_splits_partial_bins_and_aggregates_rows() -> None:
    iv = pd.DataFrame(
        {"block_id": [0, 3], "seq_id": [0, 1], "start_s": [0.5, 0.0], "end_s": [2.5, 4.0]}
    )
    grid = occupancy_grid(iv, 4, 0.0, 4.0, max_rows=2, cols=4)
    # Row 0 = blocks 0-1: block 0 covers half of bin 0, all of bin 1, half of bin 2.
    np.testing.assert_allclose(grid.share[0], [0.25, 0.5, 0.25, 0.0])
    np.testing.assert_allclose(grid.share[1], [0.5] * 4)
    assert grid.row_edges.tolist() == [0, 2, 4]
    assert grid.owner is None  # rows aggregate blocks: no single owner


def test_grid_of_a_window_clips_intervals() -> None:
    iv = block_intervals(HAND_EVENTS, end_s=6.0)
    grid = occupancy_grid(iv, 4, 2.5, 4.5, cols=2)
    np.testing.assert_allclose(grid.share[0], [0.5, 0.5])  # [2.5, 3) of the first bin, [4, 4.5)
    with pytest.raises(OccupancyError, match="empty time window"):
        occupancy_grid(iv, 4, 3.0, 3.0)


def test_grid_of_100k_blocks_conserves_block_seconds() -> None:
    rng = np.random.default_rng(0)
    n, num_blocks = 200_000, 100_000
    start = rng.uniform(0, 1000, n)
    iv = pd.DataFrame(
        {
            "block_id": rng.integers(0, num_blocks, n),
            "seq_id": rng.integers(0, 5000, n),
            "start_s": start,
            "end_s": start + rng.exponential(20, n),
        }
    )
    grid = occupancy_grid(iv, num_blocks, 0.0, 1000.0, max_rows=400, cols=800)
    assert grid.share.shape == (400, 800)
    assert grid.owner is None
    assert grid.share.min() >= 0 and grid.share.max() <= 1
    per_row = np.diff(grid.row_edges)
    block_seconds = (grid.share * per_row[:, None]).sum() * (1000.0 / 800)
    held = (np.minimum(iv["end_s"], 1000.0) - iv["start_s"]).sum()
    assert block_seconds == pytest.approx(held, rel=1e-3)  # random overlaps clip a little


# --- request states from tiny simulations (conftest's toy_sim: prefill 1 s + 1/16 s per token,
# decode 1/4 s, watermark 0) ----------------------------------------------------------------------


def states_of(result: RunResult, seq_id: int) -> list[tuple[str, float, float]]:
    s = request_states(result.events, result.steps)
    s = s[s["seq_id"] == seq_id]
    return list(zip(s["state"].astype(str), s["start_s"], s["end_s"]))


def test_states_of_a_preempted_request(toy_sim: Callable[..., RunResult]) -> None:
    # Two 4-token prompts, 6 tokens each, in a pool of 4 blocks of 4. Prefill both (1.5 s);
    # decode steps of 0.25 s from 1.5 s; at 2.5 s both need a third block and none is free:
    # seq 1 (admitted last) is preempted; seq 0 finishes at 2.75 s; seq 1 recomputes its
    # 4 + 5 tokens (1 + 9/16 s) and that prefill samples its last token.
    result = toy_sim([(0, 4, 6), (0, 4, 6)], block_size=4, num_blocks=4)
    assert states_of(result, 0) == [("prefill", 0.0, 1.5), ("decode", 1.5, 2.75)]
    assert states_of(result, 1) == [
        ("prefill", 0.0, 1.5),
        ("decode", 1.5, 2.5),
        ("preempted", 2.5, 2.75),
        ("prefill", 2.75, 4.3125),
    ]


def test_states_of_a_queued_request(toy_sim: Callable[..., RunResult]) -> None:
    # One seat: seq 1 waits until seq 0 has finished (prefill 1.25 s + one decode step).
    result = toy_sim([(0, 4, 2), (0, 4, 2)], block_size=4, num_blocks=8, max_num_seqs=1)
    assert states_of(result, 1) == [
        ("queued", 0.0, 1.5),
        ("prefill", 1.5, 2.75),
        ("decode", 2.75, 3.0),
    ]


def test_a_rejected_request_is_queued_until_its_rejection(
    toy_sim: Callable[..., RunResult],
) -> None:
    result = toy_sim([(0, 4, 2), (0.5, 40, 2)], block_size=4, num_blocks=8)
    assert states_of(result, 1) == [("queued", 0.5, 1.25)]  # rejected at the next schedule


def test_open_states_end_at_the_given_end(toy_sim: Callable[..., RunResult]) -> None:
    result = toy_sim([(0, 4, 100)], block_size=4, num_blocks=64, until=2.0)
    s = request_states(result.events, result.steps, end_s=2.0)
    assert list(s["state"].astype(str)) == ["prefill", "decode"]
    assert s["end_s"].iloc[-1] == 2.0
