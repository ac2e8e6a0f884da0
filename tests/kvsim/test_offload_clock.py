"""Two rules of the offload loop (kvsim/sim/offload_loop.py, mirrored in the compiled loop),
each found by the random differential test and kept here on its shrunk case.

The loop's waits land on the transfer link's clock: a flush wait (or an idle wait
for a completion) until time t is a simpy timeout, and ``now + (t - now)`` can fall one float
step short of t, where the link, already at t, refuses the earlier time ("time ... is before
the link's clock"). kvsim/sim/offload_loop.py's delay_until (mirrored in the compiled loop)
gives the delay that lands at or after t.

A step with nothing to compute reports the completions already collected at once: an aborted
request's last stores can complete while nothing else is in flight, and waiting for "the next
completion" then waits for nothing (simpy: "No scheduled events left")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine.compiled
from kvsim.config import RunConfig
from kvsim.runner import run
from kvsim.sim.offload_loop import delay_until

times = st.floats(0.0, 1e7, allow_nan=False, allow_infinity=False)


@given(now=times, t=times)
def test_a_wait_lands_at_or_after_its_time_and_no_later_than_needed(now: float, t: float) -> None:
    delay = delay_until(now, t)
    if t <= now:
        assert delay == 0.0
        return
    assert now + delay >= t
    if now + (t - now) >= t:
        assert delay == t - now  # the plain difference where it lands: simpy's own clock
    else:
        assert now + math.nextafter(delay, 0.0) < t  # else the smallest delay that does


def test_the_plain_difference_can_fall_short() -> None:
    now, t = 0.2, 0.845213100838437  # t: the flush wait's end in the run below
    assert now + (t - now) < t
    assert now + delay_until(now, t) >= t


def one_token(i: int) -> dict[str, object]:
    return {"prompt_tokens": 1, "output_tokens": 1, "hash_ids": [1000000 + 100 * i]}


def write_trace(path: Path) -> Path:
    """23 requests at once on a 40-block pool with a slow link (found by the random
    differential test, shrunk): a flush wait ends at 0.845213100838437 s."""
    rows = [
        {"prompt_tokens": 33, "output_tokens": 11, "hash_ids": [1000000, 1000001, 1000002]},
        {"prompt_tokens": 6, "output_tokens": 9, "hash_ids": [1000100]},
        {"prompt_tokens": 1, "output_tokens": 1, "hash_ids": [1000200]},
        {"prompt_tokens": 129, "output_tokens": 1, "hash_ids": [*range(7), 1000300, 1000301]},
        {"prompt_tokens": 1, "output_tokens": 1, "hash_ids": [1000400]},
        {"prompt_tokens": 1, "output_tokens": 5, "hash_ids": [1000500]},
    ]
    rows += [one_token(i) for i in range(6, 23)]
    lines = [json.dumps({"kvsim_trace": 1, "name": "flush", "hash_block_size": 16})]
    for i, row in enumerate(rows):
        lines.append(json.dumps({"request_id": f"r{i}", "arrival_time_s": 0.0, **row}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("pure_python", ["1", "0"])
def test_a_flush_wait_that_ends_on_the_links_clock_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pure_python: str
) -> None:
    if pure_python == "0" and engine.compiled.load() is None:
        pytest.skip(str(engine.compiled.unavailable_reason()))
    monkeypatch.setenv("KVSIM_PURE_PYTHON", pure_python)
    engine.compiled.cache_clear()
    try:
        config = RunConfig(
            trace=str(write_trace(tmp_path / "t.jsonl")), model="llama-3.1-8b", gpu="h100-sxm",
            max_model_len=4096, block_size=4, num_blocks=40,
            kv_offloading_size=0.0107421875, kv_offload_policy="lru", kv_offload_block_size=4,
            kv_offload_read_gbps=0.02, kv_offload_write_gbps=0.01, kv_offload_latency_us=0.0,
            max_num_batched_tokens=64, max_num_seqs=8, long_prefill_token_threshold=48,
        )  # fmt: skip
        summary = run(config).summary
    finally:
        engine.compiled.cache_clear()
    assert summary["num_finished"] == 23
    assert summary["offload"]["stores"]["jobs"] > 0


def test_an_aborted_requests_last_stores_are_reported_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one user, six requests; the last is cancelled 10 ms in, its stores still in flight,
    # and they complete before the next (empty) step
    rows = [one_token(i) for i in range(5)]
    last = {"prompt_tokens": 17, "output_tokens": 2, "hash_ids": [1000500, 1000501]}
    rows.append({**last, "cancel_after_s": 0.01})
    lines = [json.dumps({"kvsim_trace": 1, "name": "abort", "hash_block_size": 16})]
    for i, row in enumerate(rows):
        lines.append(json.dumps({"request_id": f"r{i}", "arrival_time_s": 0.0, **row}))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    config = RunConfig(
        trace=str(trace), model="llama-3.1-8b", gpu="h100-sxm", max_model_len=4096,
        block_size=4, num_blocks=40, kv_offloading_size=0.001953125, kv_offload_policy="lru",
        kv_offload_block_size=4, kv_offload_read_gbps=0.02, kv_offload_write_gbps=1.0,
        kv_offload_latency_us=0.0, max_num_batched_tokens=64, max_num_seqs=2, concurrency=1,
        long_prefill_token_threshold=48,
    )  # fmt: skip
    summaries = []
    paths = ("1", "0") if engine.compiled.load() is not None else ("1",)
    for pure_python in paths:
        monkeypatch.setenv("KVSIM_PURE_PYTHON", pure_python)
        engine.compiled.cache_clear()
        try:
            summaries.append(run(config).summary)
        finally:
            engine.compiled.cache_clear()
    assert len(summaries) == len(paths)
    for summary in summaries:
        assert summary["num_finished"] == 5
        assert summary["num_aborted"] == 1
        assert summary["offload"]["stores"]["jobs"] > 0
