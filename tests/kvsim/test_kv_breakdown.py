"""The paged KV breakdown is accounted chunk by chunk as the recorder packs events; however
the event stream is cut into chunks, U (Σ over sequences of min(slots held, T)) at every step
equals a plain one-event-at-a-time replay of events.parquet."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EventKind
from kvsim.analysis.kv_breakdown import PagedUsageTracker
from kvsim.config import RunConfig
from kvsim.runner import RunResult, run

BLOCK_KINDS = {"ALLOCATE": 1, "APPEND_BLOCK": 1, "FREE": -1}


@pytest.fixture(scope="module")
def pressured_run() -> RunResult:
    # a small pool: preemptions free blocks mid-run and allocate them again on resume (the
    # classic scheduler: one owner per block; tests/kvsim/test_v1_breakdown.py has v1's)
    config = RunConfig(
        trace="azure_llm_2023_conv_first_2min", num_blocks=400, until=40.0, scheduler="classic"
    )
    result = run(config)
    assert result.summary["num_preemptions"] > 0
    return result


def final_lengths(result: RunResult) -> np.ndarray:
    """T by seq_id, from requests.parquet: prompt + output, capped at max_model_len."""
    r, max_model_len = result.requests, result.resolved["max_model_len"]
    output = np.minimum(r["output_tokens"], np.maximum(max_model_len - r["prompt_tokens"], 1))
    return (r["prompt_tokens"] + output).to_numpy()


def replayed_usage(result: RunResult) -> list[int]:
    """U at every STEP event: events.parquet row by row (one row per block), a dict of counts."""
    assert result.events is not None
    final, block_size = final_lengths(result), result.config.block_size
    held: dict[int, int] = {}
    usage: list[int] = []
    for kind, seq_id in zip(result.events["kind"].astype(str), result.events["seq_id"]):
        if kind in BLOCK_KINDS:
            held[seq_id] = held.get(seq_id, 0) + BLOCK_KINDS[kind]
        elif kind == "STEP":
            usage.append(sum(min(h * block_size, int(final[s])) for s, h in held.items()))
    return usage


def test_the_runs_breakdown_matches_a_plain_replay(pressured_run: RunResult) -> None:
    steps = pressured_run.steps
    usage = (steps["reserved_slots"] + steps["filled_slots"]).tolist()
    assert usage == replayed_usage(pressured_run)
    assert (steps["internal_frag_slots"] > 0).any() and (steps["reserved_slots"] > 0).any()


def exploded_columns(events: pd.DataFrame) -> dict[str, np.ndarray]:
    """events.parquet rows as recorder columns: each block row an event of one block."""
    kind = events["kind"].astype(str)
    return {
        "kind": np.array([EventKind[k] for k in kind], dtype=np.int8),
        "seq_id": events["seq_id"].to_numpy(np.int32),
        "num_blocks": kind.isin(list(BLOCK_KINDS)).to_numpy(np.int32),
    }


@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=1 << 30), max_size=12))
def test_usage_is_the_same_however_the_events_are_chunked(
    pressured_run: RunResult, cuts: list[int]
) -> None:
    result = pressured_run
    assert result.events is not None
    cols = exploded_columns(result.events)
    n = len(cols["kind"])
    bounds = sorted({0, n, *(c % (n + 1) for c in cuts)})
    final = final_lengths(result)
    tracker = PagedUsageTracker(result.config.block_size, lambda s: int(final[s]))
    for a, b in itertools.pairwise(bounds):
        tracker.consume({name: c[a:b] for name, c in cols.items()})
    usage = tracker.usable_at_steps(len(result.steps))
    expected = result.steps["reserved_slots"] + result.steps["filled_slots"]
    np.testing.assert_array_equal(usage, expected.to_numpy())
