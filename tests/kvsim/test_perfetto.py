"""kvsim.outputs.perfetto: the trace-event document of a run, checked against the format,
against the hand-computed timeline of a tiny run, and the validator against broken documents."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvsim.outputs.perfetto import (
    ENGINE_PID,
    REQUESTS_PID,
    TraceFormatError,
    build_trace,
    trace_problems,
    validate_trace,
    write_trace,
)
from kvsim.runner import RunResult


@pytest.fixture
def preempting_run(toy_sim: Callable[..., RunResult]) -> RunResult:
    """Seq 1 is preempted at 2.5 s (see test_occupancy); seq 2 (40 tokens) is rejected."""
    return toy_sim([(0, 4, 6), (0, 4, 6), (1, 40, 2)], block_size=4, num_blocks=4)


def trace_of(run: RunResult, **options: Any) -> dict[str, Any]:
    return build_trace(run.events, run.steps, run.requests, **options)


def slices(doc: dict[str, Any], pid: int, tid: int) -> list[tuple[str, float, float]]:
    return [
        (e["name"], e["ts"], e["dur"])
        for e in doc["traceEvents"]
        if e["ph"] == "X" and e["pid"] == pid and e["tid"] == tid
    ]


def test_trace_of_a_tiny_run_is_valid_and_exact(preempting_run: RunResult) -> None:
    doc = trace_of(preempting_run)
    assert trace_problems(doc) == []
    # Seq 1's track (tid = seq_id + 1), in microseconds.
    assert slices(doc, REQUESTS_PID, 2) == [
        ("prefill", 0.0, 1.5e6),
        ("decode", 1.5e6, 1.0e6),
        ("preempted", 2.5e6, 0.25e6),
        ("prefill", 2.75e6, 1.5625e6),
    ]
    assert slices(doc, REQUESTS_PID, 3) == [("queued", 1.0e6, 0.5e6)]  # rejected at 1.5 s
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert names == {(ENGINE_PID, 1): "steps", (2, 1): "req r0", (2, 2): "req r1", (2, 3): "req r2"}


def test_steps_and_counters(preempting_run: RunResult) -> None:
    doc = trace_of(preempting_run)
    steps = preempting_run.steps
    step_slices = slices(doc, ENGINE_PID, 1)
    assert [name for name, _, _ in step_slices] == [str(k) for k in steps["kind"]]
    assert [ts for _, ts, _ in step_slices] == [t * 1e6 for t in steps["time_s"]]
    counters: dict[str, list[tuple[float, float]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append((e["ts"], *e["args"].values()))
    assert set(counters) == {"free blocks", "running sequences", "batched tokens"}
    free = steps["free_blocks"].tolist()
    changes = [f for i, f in enumerate(free) if i == 0 or f != free[i - 1]]
    assert [v for _, v in counters["free blocks"]] == changes  # a sample per change


def test_window_and_request_limit(pressured_run: RunResult) -> None:
    doc = trace_of(pressured_run, t_from=100.0, t_to=130.0, max_requests=5)
    validate_trace(doc)
    xs = [e for e in doc["traceEvents"] if e["ph"] in ("X", "C")]
    assert xs and all(100e6 <= e["ts"] <= 130e6 for e in xs)
    assert all(e["ts"] + e["dur"] <= 130e6 + 1e-3 for e in xs if e["ph"] == "X")
    tracks = {e["tid"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == REQUESTS_PID}
    assert len(tracks) == 5


def test_whole_run_is_valid_and_round_trips(pressured_run: RunResult, tmp_path: Path) -> None:
    doc = trace_of(pressured_run, end_s=pressured_run.summary["sim_duration_s"])
    path = write_trace(doc, tmp_path / "run.perfetto.json")
    again = json.loads(path.read_text())
    assert again == doc
    validate_trace(again)
    tracks = {e["tid"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == REQUESTS_PID}
    assert len(tracks) == len(pressured_run.requests)


# --- the validator ------------------------------------------------------------------------------

GOOD: dict[str, Any] = {
    "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "p"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}},
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0},
        {"ph": "C", "name": "c", "pid": 1, "ts": 3.0, "args": {"v": 2}},
    ]
}


def broken(index: int, **changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    doc["traceEvents"][index].update(changes)
    return doc


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"events": []}, "'traceEvents' list"),
        (broken(2, dur=-1.0), "dur must be a finite number >= 0"),
        (broken(2, ts=float("nan")), "ts must be a finite number >= 0"),
        (broken(3, ts=9.0), "overlaps"),
        (broken(2, ph="Q"), "ph must be one of"),
        (broken(2, tid="1"), "tid must be an integer"),
        (broken(4, args={"v": "two"}), "counter args must be numbers"),
        (broken(1, tid=7), "no process or thread name"),
        (broken(0, name="process_label"), "metadata name must be one of"),
    ],
)
def test_validator_finds_broken_documents(doc: dict[str, Any], problem: str) -> None:
    assert trace_problems(GOOD) == []
    with pytest.raises(TraceFormatError, match=problem):
        validate_trace(doc)
