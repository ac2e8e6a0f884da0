"""Properties of whole runs of the shipped default trace: block conservation, Little's law,
token accounting, rejections, determinism."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy

from engine import blocks_needed
from kvsim.analysis.metrics import WALL_CLOCK_FIELDS
from kvsim.config import RunConfig
from kvsim.outputs.run_folder import write_run
from kvsim.runner import RunResult, load_workload, run
from workloads import DEFAULT_TRACE_NAME

END_KINDS = ("FINISH", "ABORT", "REJECT")
BLOCK_KINDS = ("ALLOCATE", "APPEND_BLOCK", "FREE")


def test_pressured_run_preempts_and_rejects(pressured_run: RunResult) -> None:
    # The premise of the tests below: the small pool really is under pressure.
    assert pressured_run.summary["num_preemptions"] > 50
    assert pressured_run.summary["num_rejected"] > 2


# --- conservation -------------------------------------------------------------------------------


def test_every_allocated_block_is_freed_by_its_owner(pressured_run: RunResult) -> None:
    events = pressured_run.events
    num_blocks = pressured_run.summary["num_blocks"]
    kind = events["kind"].astype(str).to_numpy()
    block = events["block_id"].to_numpy()
    seq = events["seq_id"].to_numpy()
    free = events["free_blocks"].to_numpy()
    has_block = np.isin(kind, BLOCK_KINDS)
    assert (block[~has_block] == -1).all()
    assert ((block[has_block] >= 0) & (block[has_block] < num_blocks)).all()

    # Replay the stream: a block is taken only when free, freed only by its holder, and each
    # event's free_blocks equals the pool minus the blocks held once the event is applied.
    owner: dict[int, int] = {}
    n = len(kind)
    for i in range(n):
        k, b, s = kind[i], int(block[i]), int(seq[i])
        if k == "FREE":
            assert owner.pop(b) == s, f"row {i}: block {b} freed by {s}"
        elif k in ("ALLOCATE", "APPEND_BLOCK"):
            assert b not in owner, f"row {i}: block {b} taken while held by {owner.get(b)}"
            owner[b] = s
        last_row_of_event = i + 1 == n or not (
            has_block[i] and kind[i + 1] == k and seq[i + 1] == s and free[i + 1] == free[i]
        )
        if last_row_of_event:
            assert free[i] == num_blocks - len(owner), f"row {i}: free_blocks {free[i]}"
    assert owner == {}, "blocks still held at the end"


def test_free_blocks_stay_within_the_pool(pressured_run: RunResult) -> None:
    num_blocks = pressured_run.summary["num_blocks"]
    for frame in (pressured_run.events, pressured_run.steps):
        assert frame["free_blocks"].between(0, num_blocks).all()
    assert pressured_run.steps["free_blocks"].min() == 0  # the pool does run dry


def test_filled_slots_never_exceed_allocated_slots(pressured_run: RunResult) -> None:
    steps = pressured_run.steps
    bs = pressured_run.summary["block_size"]
    assert (steps["filled_slots"] <= steps["allocated_slots"]).all()
    assert (steps["filled_slots"] >= steps["num_batched_tokens"]).all()
    # Each running sequence leaves at most block_size - 1 slots of its last block unfilled.
    unfilled = steps["allocated_slots"] - steps["filled_slots"]
    assert (unfilled <= (bs - 1) * steps["num_running"]).all()
    expected_allocated = (pressured_run.summary["num_blocks"] - steps["free_blocks"]) * bs
    assert (steps["allocated_slots"] == expected_allocated).all()


def test_steps_are_contiguous_in_time(pressured_run: RunResult) -> None:
    steps = pressured_run.steps
    start = steps["time_s"].to_numpy()
    end = start + steps["duration_s"].to_numpy()
    assert (steps["duration_s"] > 0).all()
    assert (start[1:] >= end[:-1]).all()
    assert (np.diff(steps["step"].to_numpy()) > 0).all()
    assert (np.diff(pressured_run.events["time_s"].to_numpy()) >= 0).all()
    assert end[-1] <= pressured_run.summary["sim_duration_s"]


def test_step_rows_agree_with_step_events(pressured_run: RunResult) -> None:
    events = pressured_run.events
    step_events = events[events["kind"] == "STEP"].reset_index(drop=True)
    steps = pressured_run.steps
    assert step_events["step"].tolist() == steps["step"].tolist()
    assert step_events["time_s"].tolist() == steps["time_s"].tolist()
    assert step_events["free_blocks"].tolist() == steps["free_blocks"].tolist()
    assert step_events["num_tokens"].tolist() == steps["num_batched_tokens"].tolist()
    decode = steps[steps["kind"] == "decode"]
    assert (decode["num_batched_tokens"] == decode["num_seqs"]).all()
    assert (steps["num_seqs"] <= steps["num_running"]).all()


# --- Little's law and token accounting ------------------------------------------------------------


def number_in_system(events: pd.DataFrame, end_s: float) -> tuple[float, int]:
    """Time integral of (arrived - ended) requests over [0, end_s] from the event stream,
    and its maximum."""
    kind = events["kind"].astype(str)
    arrive = events.loc[kind == "ARRIVE", "time_s"].to_numpy()
    leave = events.loc[kind.isin(END_KINDS), "time_s"].to_numpy()
    times = np.concatenate([arrive, leave])
    delta = np.concatenate([np.ones(len(arrive)), -np.ones(len(leave))])
    order = np.lexsort((delta, times))  # at equal times count the arrival first
    times, level = times[order], np.cumsum(delta[order])
    assert (level >= 0).all()
    widths = np.diff(np.append(times, end_s))
    return float((level * widths).sum()), int(level.max())


@pytest.fixture(params=["planned", "pressured"])
def long_run(request: pytest.FixtureRequest) -> RunResult:
    """Both long runs of the default trace: without and with preemptions."""
    return request.getfixturevalue(f"{request.param}_run")


def test_littles_law_holds(long_run: RunResult) -> None:
    result = long_run
    s, requests = result.summary, result.requests
    duration = s["sim_duration_s"]
    area, peak = number_in_system(result.events, duration)
    mean_in_system = area / duration  # L
    arrival_rate = s["num_requests"] / duration  # lambda
    mean_time_in_system = (requests["finish_time_s"] - requests["arrival_time_s"]).mean()  # W
    assert mean_in_system == pytest.approx(arrival_rate * mean_time_in_system, rel=1e-9)
    # The run ends with its last request; at most everyone in the system is running.
    assert duration == requests["finish_time_s"].max()
    assert s["mean_running_seqs"] * s["busy_time_s"] <= area * (1 + 1e-12)
    assert result.steps["num_running"].max() <= peak


def test_finished_requests_generate_their_trace_output_tokens(long_run: RunResult) -> None:
    requests = long_run.requests
    max_len = long_run.resolved["max_model_len"]
    finished = requests[requests["status"] == "finished"]
    prompt, output = finished["prompt_tokens"], finished["output_tokens"]
    # A sequence stops at max_model_len tokens (prompt + generated), so the longest generate
    # max_model_len - prompt; the rest exactly their trace's output_tokens.
    capped = prompt + output > max_len
    if long_run.summary["num_preemptions"] == 0:
        assert capped.any()  # in the small pool, these prompts are too big to run at all
    assert (finished.loc[~capped, "generated_tokens"] == output[~capped]).all()
    assert (finished.loc[capped, "generated_tokens"] == max_len - prompt[capped]).all()
    expected = np.minimum(output, max_len - prompt).sum()
    assert finished["generated_tokens"].sum() == expected
    s = long_run.summary
    assert s["throughput_output_tokens_per_s"] * s["sim_duration_s"] == pytest.approx(expected)
    # Every request of the trace ran to an end.
    _, trace = load_workload(long_run.config)
    assert requests["request_id"].tolist() == [r.request_id for r in trace.requests]
    assert set(requests["status"].astype(str)) == {"finished", "rejected"}


def test_rejected_requests_are_exactly_those_that_can_never_fit(
    pressured_run: RunResult,
) -> None:
    requests = pressured_run.requests
    config = pressured_run.config
    max_len = pressured_run.resolved["max_model_len"]
    num_blocks, bs = pressured_run.summary["num_blocks"], config.block_size
    assert config.watermark == 0.0 and pressured_run.resolved["max_num_batched_tokens"] >= max_len
    prompt, output = requests["prompt_tokens"], requests["output_tokens"]
    too_long = prompt > max_len
    too_big = prompt.map(lambda p: blocks_needed(p, bs)) > num_blocks
    # Premise: an admitted request can always grow to its last token when running alone, so
    # none can be rejected later while decoding or when resuming after a preemption.
    last_cached = np.minimum(prompt + output - 1, np.maximum(max_len - 1, prompt))
    admitted = ~(too_long | too_big)
    assert (last_cached[admitted].map(lambda n: blocks_needed(n, bs)) <= num_blocks).all()

    rejected = requests["status"] == "rejected"
    assert too_long.any() and (too_big & ~too_long).any()
    assert rejected.tolist() == (too_long | too_big).tolist()
    assert (requests.loc[rejected, "generated_tokens"] == 0).all()
    assert requests.loc[rejected, "admit_time_s"].isna().all()


# --- determinism ----------------------------------------------------------------------------------


def write_twice(config: RunConfig, tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(run(config), a, plots=False)
    write_run(run(config), b, plots=False)
    return a, b


def summary_without_wall_clock(folder: Path) -> dict:
    summary = json.loads((folder / "summary.json").read_text())
    for field in WALL_CLOCK_FIELDS:
        summary.pop(field)
    return summary


def assert_same_run(a: Path, b: Path) -> None:
    assert summary_without_wall_clock(a) == summary_without_wall_clock(b)
    for name in ("config.json", "requests.parquet", "steps.parquet", "events.parquet"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"num_blocks": 400, "until": 90.0}, id="open-loop"),
        pytest.param(
            {"num_blocks": 400, "concurrency": 12, "think_time_s": 2.0, "seed": 5, "until": 90.0},
            id="closed-loop",
        ),
    ],
)
def test_same_config_gives_identical_run_folders(options: dict, tmp_path: Path) -> None:
    a, b = write_twice(RunConfig(trace=DEFAULT_TRACE_NAME, **options), tmp_path)
    assert_same_run(a, b)
    assert summary_without_wall_clock(a)["num_preemptions"] > 0


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"num_blocks": 400, "until": 90.0}, id="open-loop"),
        pytest.param(
            {"num_blocks": 400, "concurrency": 12, "think_time_s": 0.5, "seed": 5, "until": 90.0},
            id="closed-loop",
        ),
    ],
)
def test_moving_the_clock_between_events_changes_nothing(
    options: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine loop moves simpy's clock itself when no other event is due before a step
    ends; a run that fires a timeout for every step must be byte-identical."""
    config = RunConfig(trace=DEFAULT_TRACE_NAME, **options)
    write_run(run(config), tmp_path / "moved", plots=False)
    with monkeypatch.context() as patch:
        patch.setattr(simpy.Environment, "peek", lambda self: -math.inf)  # always yield
        write_run(run(config), tmp_path / "fired", plots=False)
    assert_same_run(tmp_path / "moved", tmp_path / "fired")


def test_closed_loop_think_times_follow_the_seed() -> None:
    def arrivals(seed: int) -> list[float]:
        config = RunConfig(
            trace=DEFAULT_TRACE_NAME, concurrency=4, think_time_s=1.0, seed=seed, until=30.0
        )
        return run(config).requests["arrival_time_s"].tolist()

    assert arrivals(1) == arrivals(1)
    assert arrivals(1) != arrivals(2)


def test_a_run_leaves_the_garbage_collector_as_it_found_it() -> None:
    import gc

    from kvsim.sim.gc_passes import fewer_gc_passes

    before = gc.get_threshold()
    run(RunConfig(trace=DEFAULT_TRACE_NAME, until=5.0))
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), fewer_gc_passes():
        assert gc.get_threshold()[0] >= 100_000
        raise RuntimeError("a failing run")
    assert gc.get_threshold() == before


@pytest.mark.parametrize("scheduler", ["classic", "v1"])
def test_progress_is_reported_every_4096_steps_and_at_the_end(
    pressured_config: RunConfig, pressured_run: RunResult, scheduler: str
) -> None:
    # The CLI's progress bar: (simulated seconds, requests done), both non-decreasing, every
    # 4,096 steps (plain decode steps included) and once more when the run ends, on the
    # compiled cores (whose loop stops at each multiple of 4,096) as in Python.
    calls: list[tuple[float, int]] = []
    config = pressured_config.replace(scheduler=scheduler)
    result = run(config, progress=lambda now, done: calls.append((now, done)))
    num_steps = result.summary["num_steps"]
    assert num_steps > 2 * 4096
    assert len(calls) == num_steps // 4096 + 1
    assert calls == sorted(calls)
    last = result.steps.iloc[-1]
    assert calls[-1] == (last["time_s"] + last["duration_s"], result.summary["num_requests"])
    # the k-th report comes during or right after step 4096 k, whichever path ran it
    start, duration = result.steps["time_s"].to_numpy(), result.steps["duration_s"].to_numpy()
    for k, (now, _) in enumerate(calls[:-1], start=1):
        i = 4096 * k - 1
        assert start[i] <= now <= start[i] + duration[i]
    if scheduler == "classic":  # pressured_run's
        assert num_steps == pressured_run.summary["num_steps"]  # watching changes nothing
