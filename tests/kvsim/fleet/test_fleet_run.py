"""A fleet run end to end: one replica is the plain run, a fleet's folder holds what
docs/fleet.md says, the same seed gives the same fleet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner, Result

from kvsim.analysis.metrics import WALL_CLOCK_FIELDS
from kvsim.cli import app
from kvsim.config import RunConfig, scheduling_limits
from kvsim.costmodel import resolve_gpu
from kvsim.fleet.run import simulate_fleet
from kvsim.runner import build_cost_model, build_executor, load_workload, run

TRACE = "mooncake_fast25_conversation_first_1000"


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def without_wall_clock(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in WALL_CLOCK_FIELDS}


def test_one_replica_through_the_fleet_is_the_plain_run() -> None:
    """The fleet's machinery (shared clock, router process, KV-event tap, per-replica
    measurement) with one replica gives the plain run's tables and summary."""
    config = RunConfig(trace=TRACE, model="llama-3.1-8b", gpu="h100-sxm", num_blocks=3000)
    plain = run(config, keep_events=False)
    _, trace = load_workload(config)
    cost_model = build_cost_model(config)
    summary, requests, steps, routing = simulate_fleet(
        config.replace(replicas=1),
        trace,
        3000,
        plain.resolved["max_model_len"],
        lambda: build_executor(config, cost_model),
        scheduling_limits(config, resolve_gpu(config.gpu)),
    )
    assert summary["num_preemptions"] > 0 and summary["prefix_cache_hits"] > 0  # a real test
    for name in plain.requests_table.columns:
        np.testing.assert_array_equal(requests[name], plain.requests_table[name], err_msg=name)
    for name in plain.steps_table.columns:
        np.testing.assert_array_equal(steps[name], plain.steps_table[name], err_msg=name)
    assert (requests["replica"] == 0).all() and (routing["replica"] == 0).all()
    fleet_wide = {k: summary[k] for k in plain.summary}
    assert without_wall_clock(fleet_wide) == without_wall_clock(plain.summary)
    assert without_wall_clock(summary["replicas"][0]) == {
        "replica": 0,
        **without_wall_clock(plain.summary),
    }


def test_replicas_1_round_robin_writes_the_plain_run_folder(tmp_path: Path) -> None:
    plain, fleet = tmp_path / "plain", tmp_path / "fleet"
    assert kvsim("run", "--out", plain, "--no-plots").exit_code == 0
    result = kvsim(
        "run", "--out", fleet, "--no-plots", "--replicas", "1", "--router", "round-robin"
    )
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in plain.iterdir())
    assert names == sorted(p.name for p in fleet.iterdir())
    for name in names:
        a, b = (plain / name).read_bytes(), (fleet / name).read_bytes()
        if name == "summary.json":
            assert without_wall_clock(json.loads(a)) == without_wall_clock(json.loads(b))
        elif name.endswith(".parquet") or name == "config.json":
            assert a == b, name


@pytest.fixture(scope="module")
def fleet_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fleet") / "run"
    result = kvsim(
        "run", TRACE, "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--num-blocks", "4000",
        "--replicas", "3", "--router", "prefix", "--out", out, "--no-plots",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def test_a_fleet_folder_holds_routing_and_per_replica_figures(fleet_folder: Path) -> None:
    summary = json.loads((fleet_folder / "summary.json").read_text())
    requests = pq.read_table(fleet_folder / "requests.parquet").to_pandas()
    routing = pq.read_table(fleet_folder / "routing.parquet").to_pandas()
    assert len(requests) == len(routing) == 1000 == summary["num_requests"]
    assert (requests["request_id"].to_numpy() == routing["request_id"].to_numpy()).all()
    assert (requests["replica"].to_numpy() == routing["replica"].to_numpy()).all()
    assert np.all(np.diff(routing["arrival_time_s"].to_numpy()) >= 0)
    fleet = summary["fleet"]
    assert fleet["num_replicas"] == 3 and fleet["router"] == "prefix"
    assert sum(fleet["requests_per_replica"]) == 1000
    assert fleet["requests_per_replica"] == np.bincount(routing["replica"], minlength=3).tolist()
    replicas = summary["replicas"]
    assert [r["replica"] for r in replicas] == [0, 1, 2]
    assert sum(r["num_finished"] for r in replicas) == summary["num_finished"]
    assert sum(r["prefix_cache_hits"] for r in replicas) == summary["prefix_cache_hits"]
    assert summary["prefix_cache_hit_rate"] == pytest.approx(
        summary["prefix_cache_hits"] / summary["prefix_cache_queries"]
    )
    assert summary["num_blocks"] == 3 * 4000
    # the router's view of the chosen replica's cache never exceeds the prompt's blocks
    assert (routing["router_prefix_blocks"] <= routing["prompt_blocks"]).all()
    assert routing["router_prefix_blocks"].sum() > 0


def test_a_fleet_run_repeats_exactly(fleet_folder: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    result = kvsim("run", "--config", fleet_folder / "config.json", "--out", again, "--no-plots")
    assert result.exit_code == 0, result.output
    a = json.loads((fleet_folder / "summary.json").read_text())
    b = json.loads((again / "summary.json").read_text())
    a["replicas"] = [without_wall_clock(r) for r in a["replicas"]]
    b["replicas"] = [without_wall_clock(r) for r in b["replicas"]]
    assert without_wall_clock(a) == without_wall_clock(b)
    for name in ("requests.parquet", "steps.parquet", "routing.parquet"):
        assert (fleet_folder / name).read_bytes() == (again / name).read_bytes(), name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "2", "--router", "best"], "router"),
        (["--replicas", "0"], "replicas"),
        (["--replicas", "2", "--scheduler", "classic"], "fleet"),
        (["--replicas", "2", "--concurrency", "4"], "fleet"),
        (["--replicas", "2", "--router-event-delay", "-1"], "router_event_delay"),
        (["--replicas", "2", "--router-weights", "2:1"], "PREFIX:QUEUE:KV"),
        (["--replicas", "2", "--router-weights", "0:0:0"], "not all 0"),
        (["--replicas", "2", "--router-weights", "1:inf:1"], "router_weights"),
    ],
)
def test_bad_fleet_options_exit_2_with_one_line(
    args: list[str], message: str, tmp_path: Path
) -> None:
    result = kvsim("run", "--out", tmp_path / "x", "--no-plots", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output
    assert not (tmp_path / "x").exists()


def test_a_fleet_draws_its_own_pictures(fleet_folder: Path, tmp_path: Path) -> None:
    """Not the one-replica pictures over mixed replicas: load, hit rate and imbalance per
    replica, embedded in report.html."""
    out = tmp_path / "plotted"
    result = kvsim("run", "--config", fleet_folder / "config.json", "--out", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "fleet_hit_rate.png",
        "fleet_imbalance.png",
        "fleet_load.png",
    ]
    report = (out / "report.html").read_text()
    assert report.count("<img") == 3 and 'alt="fleet-hit-rate"' in report
    assert "Prefix-cache hit rate per replica" in report  # captions, not picture names


def test_replicas_that_see_no_request_leave_the_fleet_figures_alone(tmp_path: Path) -> None:
    """16 replicas, one request: 15 replicas have no rates or latencies of their own."""
    out = tmp_path / "idle"
    result = kvsim("run", "--replicas", "16", "--until", "0.5", "--no-plots", "--out", out)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 1 == sum(summary["fleet"]["requests_per_replica"])
    assert summary["fleet"]["requests_per_replica"].count(0) == 15
    busy = [r for r in summary["replicas"] if r["num_requests"]]
    assert summary["ttft_s"] == busy[0]["ttft_s"]  # from the requests there are
    # a mean over replicas: an idle pool is 0% used (docs/fleet.md)
    usage = [r["kv_usage_mean"] for r in summary["replicas"]]
    assert summary["kv_usage_mean"] == pytest.approx(sum(usage) / 16)
    assert summary["prefix_cache_hit_rate"] == busy[0]["prefix_cache_hit_rate"]


def test_the_waiting_queue_picture_counts_arrived_not_yet_admitted_requests() -> None:
    import pandas as pd

    from kvsim.plots.fleet import waiting_at

    requests = pd.DataFrame(
        {
            "arrival_time_s": [0.0, 1.0, 2.0, 3.0],
            "admit_time_s": [0.5, 4.0, None, None],
            "finish_time_s": [5.0, 6.0, 2.5, None],  # the third is rejected at 2.5 s
        }
    )
    times = np.array([0.2, 0.6, 1.5, 2.2, 2.7, 3.5, 4.5])
    assert waiting_at(requests, times).tolist() == [1, 0, 1, 2, 1, 2, 1]


def test_the_terminal_summary_names_the_fleet(fleet_folder: Path) -> None:
    from kvsim.commands.summary import summary_rows

    rows = dict(summary_rows(json.loads((fleet_folder / "summary.json").read_text())))
    assert rows["fleet"].startswith("3 replicas x 4,000 blocks x 16 tokens")
    assert rows["router"] == "prefix (2:1:1), KV events 0.05 s late"
    assert rows["requests per replica"].count(" / ") == 2
    assert "KV pool" not in rows  # the pool is per replica: said in the fleet row


def test_a_fleet_reports_its_progress() -> None:
    """The progress bar of `kvsim run` moves during a fleet run and ends at every request."""
    calls: list[tuple[float, int]] = []
    config = RunConfig(trace=TRACE, model="llama-3.1-8b", gpu="h100-sxm", replicas=2)
    result = run(config, lambda t, done: calls.append((t, done)), keep_events=False)
    assert len(calls) >= 1000 // 256
    times, done = zip(*calls)
    assert list(times) == sorted(times) and list(done) == sorted(done)
    assert done[-1] == result.summary["num_requests"] == 1000
    assert done[len(done) // 2] < 1000  # reported while it runs, not only at the end
