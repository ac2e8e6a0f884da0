"""Fleet shapes and routers as sweep axes: each point a fleet run, the imbalance columns in
sweep.csv only where some point is a fleet."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app

TRACE = "mooncake_fast25_conversation_first_1000"
QUICK = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--until", "60", "--jobs", "1")


def sweep(out: Path, *args: str) -> pd.DataFrame:
    result = CliRunner().invoke(app, ["sweep", TRACE, *QUICK, "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return pd.read_csv(out / "sweep.csv")


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_a_sweep_over_routers_and_fleet_sizes(tmp_path: Path) -> None:
    table = sweep(tmp_path / "s", "--router", "round-robin,prefix", "--replicas", "1,3")
    assert table[["replicas", "router"]].values.tolist() == [
        [1, "round-robin"],
        [1, "prefix"],
        [3, "round-robin"],
        [3, "prefix"],
    ]
    assert (table["status"] == "ok").all()
    fleets = table[table["replicas"] == 3]
    assert fleets["requests_cv"].notna().all() and fleets["busy_time_cv"].notna().all()
    assert table[table["replicas"] == 1]["requests_cv"].isna().all()
    # round-robin spreads requests evenly: its imbalance is the smallest there is
    rr = fleets[fleets["router"] == "round-robin"]["requests_cv"].item()
    assert rr <= fleets[fleets["router"] == "prefix"]["requests_cv"].item()
    assert rr < 0.05


def test_a_one_replica_sweep_has_no_fleet_columns(tmp_path: Path) -> None:
    table = sweep(tmp_path / "one", "--block-size", "16,32")
    assert "requests_cv" not in table and "busy_time_cv" not in table
