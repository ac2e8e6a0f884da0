"""Issue 28 item 4: a capacity search over routers and fleet sizes names the configuration
that serves the most load and why — the hits it gained against the imbalance it caused
(kvsim/sweep/fleet_advice.py, docs/sweeps.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.sweep.fleet_advice import fleet_advice
from kvsim.sweep.spec import SweepSpec


def spec(axes: list[tuple[str, tuple]]) -> SweepSpec:  # type: ignore[type-arg]
    return SweepSpec(base=RunConfig(trace="azure_llm_2023_conv", replicas=4), axes=tuple(axes))


def table(rows: list[tuple]) -> pd.DataFrame:  # type: ignore[type-arg]
    return pd.DataFrame(
        rows,
        columns=["router", "replicas", "capacity_rate_per_s", "prefix_cache_hit_rate",
                 "busy_time_cv"],
    )  # fmt: skip


def test_the_winner_is_named_with_its_hits_against_round_robins_imbalance() -> None:
    frame = table([
        ("round-robin", 4, 8.0, 0.135, 0.002),
        ("prefix", 4, 10.0, 0.314, 0.020),
        ("kv-router", 4, 9.0, 0.243, 0.003),
    ])  # fmt: skip
    [line] = fleet_advice(frame, spec([("router", ("round-robin", "prefix", "kv-router"))]))
    assert line.startswith("Most load: prefix on 4 replicas serves 10 req/s within the SLOs")
    assert "(2.5 req/s per replica)" in line
    # the baseline is round-robin even though kv-router came second
    assert "round-robin on as many replicas serves 8 req/s" in line
    assert "hit rate 31.4% against 13.5% (+17.9 points)" in line
    assert "busy-time CV 0.020 against 0.002" in line
    assert "outweighs the imbalance" in line


def test_round_robin_winning_says_the_rivals_hits_did_not_pay_for_their_imbalance() -> None:
    frame = table([("round-robin", 4, 8.0, 0.135, 0.002), ("prefix", 4, 6.0, 0.314, 0.30)])
    [line] = fleet_advice(frame, spec([("router", ("round-robin", "prefix"))]))
    assert line.startswith("Most load: round-robin on 4 replicas serves 8 req/s")
    assert "prefix on as many replicas serves 6 req/s" in line
    assert "(-17.9 points)" in line and "do not pay for its imbalance" in line


def test_fleet_sizes_are_compared_per_replica_and_routers_at_the_same_size() -> None:
    frame = table([
        ("round-robin", 2, 4.0, 0.10, 0.01),
        ("prefix", 2, 5.0, 0.20, 0.01),
        ("round-robin", 4, 9.0, 0.12, 0.01),
        ("prefix", 4, 7.0, 0.25, 0.04),
    ])  # fmt: skip
    axes = [("router", ("round-robin", "prefix")), ("replicas", (2, 4))]
    [line] = fleet_advice(frame, spec(axes))
    assert line.startswith("Most load: round-robin on 4 replicas serves 9 req/s")
    assert "(2.25 req/s per replica)" in line
    assert "prefix on as many replicas serves 7 req/s" in line  # 4 replicas, not 2


def test_no_fleet_axis_no_advice_and_no_rate_met_is_said() -> None:
    frame = table([("round-robin", 4, 8.0, 0.1, 0.0)])
    assert fleet_advice(frame, spec([("block_size", (16, 32))])) == []
    missed = table([("round-robin", 4, None, None, None), ("prefix", 4, None, None, None)])
    [line] = fleet_advice(missed, spec([("router", ("round-robin", "prefix"))]))
    assert line == "No fleet configuration met the SLOs at any rate probed."


@pytest.mark.slow  # seconds of end-to-end work; .ci/run runs the slow set too
def test_kvsim_capacity_over_routers_prints_and_keeps_the_advice(tmp_path: Path) -> None:
    trace = tmp_path / "agents.jsonl"
    runner = CliRunner()
    made = runner.invoke(app, ["gen", "-o", str(trace), "--sessions", "12", "--session-rate",
                               "2", "--tool-call-prob", "0.8", "--seed", "1"])  # fmt: skip
    assert made.exit_code == 0, made.output
    out = tmp_path / "cap"
    result = runner.invoke(app, [
        "capacity", str(trace), "--router", "round-robin,prefix", "--replicas", "2",
        "--num-blocks", "600", "--slo", "ttft_p99=2s", "--executor", "serial", "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    printed = " ".join(result.output.split())
    assert "Most load: " in printed and " on 2 replicas serves " in printed
    described = json.loads((out / "capacity.json").read_text())
    [advice] = described["fleet_advice"]
    assert " ".join(advice.split()) in printed
    probes = pd.read_csv(out / "probes.csv")
    assert {"prefix_cache_hit_rate", "busy_time_cv", "requests_cv"} <= set(probes.columns)
