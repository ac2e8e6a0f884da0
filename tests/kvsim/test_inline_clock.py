"""The compiled core's open-loop clocks without simpy (kvsim/sim/inline_clock.py in Python,
kvsim/sim/core_clock.py in the core) against the same runs under simpy: equal steps,
requests, events and summaries, ties included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from frame_equality import assert_frame_equal

import engine.compiled
from kvsim.config import RunConfig
from kvsim.outputs.run_folder import write_run
from kvsim.runner import run
from kvsim.sim import compiled_v1, core_clock, inline_clock
from kvsim.sim.compiled_v1 import CompiledV1Simulation
from workloads import Request, Trace, save_trace

if engine.compiled.load() is None:
    pytest.skip(str(engine.compiled.unavailable_reason()), allow_module_level=True)

WALL = ("wall_time_s", "sim_requests_per_wall_s", "sim_steps_per_wall_s")


CLOCKS = ("core", "inline", "simpy")


def run_both_clocks(config: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``config`` with the clock in the core (kvsim/sim/core_clock.py), with the inline
    clock in Python and with simpy's; compare tables, summaries and run-folder bytes."""
    calls: list[str] = []
    original_inline, original_core = inline_clock.run_inline, core_clock.run_in_core

    def counted_inline(*args: Any) -> None:
        calls.append("inline")
        original_inline(*args)

    def counted_core(*args: Any) -> None:
        calls.append("core")
        original_core(*args)

    monkeypatch.setattr(compiled_v1, "run_inline", counted_inline)
    monkeypatch.setattr(compiled_v1, "run_in_core", counted_core)
    results, folders = {}, {}
    for clock in CLOCKS:
        monkeypatch.setattr(CompiledV1Simulation, "inline_clock", clock != "simpy")
        monkeypatch.setattr(CompiledV1Simulation, "core_clock", clock == "core")
        calls.clear()
        results[clock] = run(config)
        assert calls == ([] if clock == "simpy" else [clock])
        folders[clock] = write_run(results[clock], tmp_path / clock, plots=False)
    b = results["simpy"]
    for clock in ("core", "inline"):
        a = results[clock]
        for table in ("steps", "requests"):
            assert_frame_equal(getattr(a, table), getattr(b, table))
        assert {k: v for k, v in a.summary.items() if k not in WALL} == {
            k: v for k, v in b.summary.items() if k not in WALL
        }
        for name in ("requests.parquet", "steps.parquet", "events.parquet"):
            assert (folders[clock] / name).read_bytes() == (folders["simpy"] / name).read_bytes()


def grid_trace(tmp_path: Path, spacing: float, per_instant: int, count: int = 90) -> str:
    """Requests arriving ``per_instant`` at a time every ``spacing`` seconds."""
    requests = [
        Request(
            request_id=str(i),
            arrival_time_s=spacing * (i // per_instant),
            prompt_tokens=30 + 7 * (i % 5),
            output_tokens=3 + i % 4,
        )
        for i in range(count)
    ]
    path = tmp_path / "grid.jsonl"
    save_trace(Trace(name="grid", hash_block_size=None, requests=requests), path)
    return str(path)


@pytest.mark.parametrize(
    ("spacing", "per_instant", "step_time"),
    [
        (0.5, 3, "linear:0.25:0"),  # every step ends exactly at an arrival
        (0.5, 1, "linear:0.125:0"),  # four steps to an arrival, the last ending on it
        (0.75, 2, "linear:0.25:0"),  # steps end on every third arrival instant
        (0.3, 4, "linear:0.1:0.0001"),  # steps of many lengths, most ending between arrivals
    ],
)
def test_steps_ending_at_arrivals_match_simpy(
    spacing: float,
    per_instant: int,
    step_time: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = RunConfig(
        trace=grid_trace(tmp_path, spacing, per_instant), num_blocks=60, step_time=step_time
    )
    run_both_clocks(config, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    "options",
    [
        {},  # the default trace, v1 with prefix caching
        {"num_blocks": 500, "block_size": 8},  # preemption storms
        {"step_time": "linear:0.005:0.00001", "num_blocks": 800},
    ],
)
def test_default_trace_matches_simpy(
    options: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = RunConfig(trace="azure_llm_2023_conv_first_2min", **options)
    run_both_clocks(config, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    "options",
    [
        {"until": 30.0},
        {"concurrency": 8},
    ],
)
def test_until_and_closed_loops_keep_simpy(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--until and closed loops have simpy events of their own: neither inline clock is
    used."""
    calls: list[int] = []
    monkeypatch.setattr(compiled_v1, "run_inline", lambda *args: calls.append(1))
    monkeypatch.setattr(compiled_v1, "run_in_core", lambda *args: calls.append(1))
    run(RunConfig(trace="azure_llm_2023_conv_first_2min", num_blocks=600, **options))
    assert not calls
