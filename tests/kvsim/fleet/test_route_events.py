"""A fleet's events.parquet: one ROUTE event per routing decision (docs/fleet.md), with the
step and free blocks the chosen replica's own ARRIVE records, on the Python and the compiled
replicas alike, and the routing.parquet's choices."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings

from engine import EventKind
from engine.compiled import load
from kvsim.config import RunConfig
from kvsim.fleet.routers import make_router
from kvsim.runner import run
from tests.kvsim.fleet.test_kv_index import build_requests, fleet_of, requests_strategy
from tests.kvsim.fleet.test_pd import STEP, write_trace


@pytest.mark.parametrize("compiled", [False, True])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=requests_strategy)
def test_a_route_records_what_the_replicas_arrive_records(
    compiled: bool, spec: list[tuple[float, int, int, int]]
) -> None:
    """Each decision's (step, free blocks) equal the ARRIVE of its request on the chosen
    replica, which follows it at the same time: the last step begun there and its free blocks
    (small pools, so blocks are in use at arrivals)."""
    if compiled and load() is None:
        pytest.skip("the compiled core is not built")
    fleet, _ = fleet_of(
        build_requests(spec), 2, 0.05, 16, compiled=compiled, router=make_router("prefix", 2, 0)
    )
    result = fleet.run()
    assert result.route_step is not None and result.route_free_blocks is not None
    for i, (replica, seq_id) in enumerate(zip(result.route_replica, result.route_seq_id)):
        cols = result.replicas[replica].recorder.columns()[0]
        arrive = (cols["kind"] == EventKind.ARRIVE) & (cols["seq_id"] == seq_id)
        assert int(cols["step"][arrive][0]) == result.route_step[i]
        assert int(cols["free_blocks"][arrive][0]) == result.route_free_blocks[i]
        assert float(cols["time_s"][arrive][0]) == result.route_time_s[i]


def test_a_fleet_run_folder_has_its_routing_decisions_as_events(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvsim.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["run", "mooncake_fast25_conversation_first_1000", "--model", "llama-3.1-8b", "--gpu",
         "h100-sxm", "--replicas", "3", "--router", "prefix", "--until", "60", "--no-plots",
         "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    events = pd.read_parquet(out / "events.parquet")
    routing = pd.read_parquet(out / "routing.parquet")
    block_size = json.loads((out / "summary.json").read_text())["block_size"]
    assert list(events.columns) == [
        "time_s", "step", "kind", "seq_id", "block_id", "free_blocks", "num_tokens", "replica",
    ]  # fmt: skip
    assert len(events) == len(routing) > 100
    assert (events["kind"] == "ROUTE").all() and (events["block_id"] == -1).all()
    np.testing.assert_array_equal(events["replica"], routing["replica"])
    np.testing.assert_array_equal(events["seq_id"], routing["seq_id"])
    np.testing.assert_array_equal(events["time_s"], routing["arrival_time_s"])
    np.testing.assert_array_equal(
        events["num_tokens"], routing["router_prefix_blocks"] * block_size
    )
    assert (events["num_tokens"] > 0).any()  # the prefix router saw cached prompts
    assert (np.diff(events["time_s"]) >= 0).all()
    assert (events["step"] > 0).any() and (events["free_blocks"] > 0).all()


def test_a_pd_fleet_routes_each_leg(tmp_path: Path) -> None:
    """A disaggregated request has two ROUTE rows at its arrival, its decode replica first
    (num_tokens: what the decider saw cached there), then its prefill replica; a request the
    decider keeps whole has one."""
    rows = [{"arrival_time_s": 0.1 * i, "prompt_tokens": p, "output_tokens": 3}
            for i, p in enumerate([400, 10, 300, 12])]  # fmt: skip
    trace = write_trace(tmp_path / "t.jsonl", rows)
    config = RunConfig(trace=str(trace), step_time=STEP, num_blocks=400, pd="1:2")
    result = run(config, events_path=tmp_path / "events.parquet")
    events = pd.read_parquet(tmp_path / "events.parquet")
    requests = result.requests
    assert list(requests["disaggregated"]) == [1, 0, 1, 0]
    assert len(events) == 6 and (events["kind"] == "ROUTE").all()
    assert events["time_s"].tolist() == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.2, 0.3])
    decode = requests["decode_replica"].tolist()
    assert list(events["replica"]) == [decode[0], 0, decode[1], decode[2], 0, decode[3]]
    assert list(events["seq_id"][[1, 4]]) == [0, 1]  # the prefill replica's legs
    assert list(events["seq_id"][[0, 2, 3, 5]]) == list(requests["seq_id"][[0, 1, 2, 3]])


@pytest.mark.parametrize("fast", [True, False])  # the compiled replicas, the Python ones
def test_fleet_events_all_adds_each_replicas_stream(tmp_path: Path, fast: bool) -> None:
    """--fleet-events all: every replica's own events with their replica, each replica's rows
    in emission order with a request's ROUTE before its ARRIVE (same time, step and
    free blocks); the ROUTE rows are the routing-only file's, and the metrics do not change."""
    base = RunConfig(trace="mooncake_fast25_conversation_first_1000", model="llama-3.1-8b",
                     gpu="h100-sxm", replicas=3, router="prefix", until=30.0,
                     fast_decode=fast)  # fmt: skip
    routing = run(base, events_path=tmp_path / "routing.parquet")
    everything = run(base.replace(fleet_events="all"), events_path=tmp_path / "all.parquet")
    only = pd.read_parquet(tmp_path / "routing.parquet")
    events = pd.read_parquet(tmp_path / "all.parquet")
    assert set(events["kind"].unique()) >= {"ROUTE", "ARRIVE", "ALLOCATE", "CACHE", "STEP"}
    # the replicas' chunks interleave: the same decisions, not in the same order
    key = ["time_s", "replica", "seq_id"]
    routes = events[events["kind"] == "ROUTE"].sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(routes, only.sort_values(key).reset_index(drop=True))
    for replica in range(3):
        rows = events[events["replica"] == replica].reset_index(drop=True)
        assert (np.diff(rows["time_s"]) >= 0).all()
        route = rows.index[rows["kind"] == "ROUTE"].to_numpy()
        arrive = rows.index[rows["kind"] == "ARRIVE"].to_numpy()
        assert len(route) == len(arrive) == (only["replica"] == replica).sum() > 0
        assert (route < arrive).all()
        for name in ("seq_id", "time_s", "step", "free_blocks"):
            np.testing.assert_array_equal(
                rows[name].to_numpy()[route], rows[name].to_numpy()[arrive]
            )
    steps = everything.summary["num_steps"]
    assert (events["kind"] == "STEP").sum() == steps
    wall = {"wall_time_s", "sim_requests_per_wall_s", "sim_steps_per_wall_s", "replicas"}
    assert {k: v for k, v in everything.summary.items() if k not in wall} == {
        k: v for k, v in routing.summary.items() if k not in wall
    }


def test_fleet_events_all_is_refused_for_a_pd_fleet() -> None:
    from kvsim.option_spec import ConfigError

    with pytest.raises(ConfigError, match="--fleet-events all"):
        RunConfig(trace="x", pd="1:1", fleet_events="all")
    assert "fleet_events" not in RunConfig(trace="x", replicas=2).to_dict()
