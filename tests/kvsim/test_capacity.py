"""Capacity search (kvsim/sweep/capacity.py, docs/sweeps.md "Capacity search"): the bisection
against a known threshold, rates above a miss not counted, the search's floor and ceiling,
the same answer whatever the executor, and ``kvsim capacity`` / ``kvsim sweep --metric
capacity`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.sweep.capacity import MAX_FACTOR, Search, capacity_search
from kvsim.sweep.slo import parse_slo
from kvsim.sweep.spec import SweepError, SweepPoint, make_spec
from tests.kvsim.test_sweep import write_tiny_trace

POINT = SweepPoint(0, {}, RunConfig(trace="t"))


def searched(capacity: float, start: float, met=None) -> Search:  # type: ignore[no-untyped-def]
    """A search run to its end against an oracle: a rate meets the SLOs when ``met(rate)``
    (default: at most ``capacity``)."""
    met = met or (lambda rate: rate <= capacity)
    search = Search(POINT, start, 0.05)
    while rates := search.proposals():
        for rate in rates:
            ok = met(rate)
            search.record(rate, {"status": "ok"}, [] if ok else ["p99 TTFT 9 s > 2 s"])
    return search


@pytest.mark.parametrize(("capacity", "start"), [(5.3, 1.0), (5.3, 40.0), (0.07, 3.8)])
def test_bisection_brackets_the_capacity_within_the_tolerance(
    capacity: float, start: float
) -> None:
    search = searched(capacity, start)
    assert search.good is not None and search.bad is not None
    assert search.good <= capacity < search.bad <= search.good * 1.05
    assert search.stopped is None and len(search.probes) <= 15


def test_a_rate_that_meets_the_slos_above_a_miss_does_not_count() -> None:
    # meets up to 4, misses above, but meets again by chance at 5.657 (probed in round 2)
    search = searched(0, 4.0, met=lambda rate: rate <= 4.0 or 5.5 < rate < 6.0)
    assert any(p["rate"] == 5.657 and p["slo_met"] for p in search.probes)
    assert search.good is not None and search.good <= 4.0 < search.bad  # type: ignore[operator]


def test_the_search_stops_at_its_floor_and_ceiling() -> None:
    never = searched(0, 2.0, met=lambda rate: False)
    assert never.good is None and never.bad is not None and never.bad <= 2.0 / MAX_FACTOR
    assert never.stopped == f"no rate meets the SLOs, down to {never.bad:g} req/s"
    always = searched(0, 2.0, met=lambda rate: True)
    assert always.bad is None and (always.stopped or "").startswith("meets the SLOs up to")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tiny_trace(tmp_path_factory.mktemp("trace"))


def test_the_answer_is_the_same_whatever_the_executor(tiny: str) -> None:
    spec = make_spec(RunConfig(trace=tiny), [("block_size", (16, 64))], **parse_slo("ttft_p99=1s"))
    serial = capacity_search(spec, executor="serial", tolerance=0.1)
    pool = capacity_search(spec, executor="process", jobs=2, tolerance=0.1)
    pd.testing.assert_frame_equal(serial.table, pool.table)
    pd.testing.assert_frame_equal(serial.probes, pool.probes)
    for _, r in serial.table.iterrows():  # the capacity met the SLO; the miss above did not
        rate, bad = r["capacity_rate_per_s"], r["lowest_miss_rate_per_s"]
        assert r["ttft_s_p99"] <= 1.0 and bad <= rate * 1.1
        probes = serial.probes[serial.probes["block_size"] == r["block_size"]]
        missed = probes[probes["rate"] == bad].iloc[0]
        assert not missed["slo_met"] and missed["ttft_s_p99"] > 1.0
    with pytest.raises(SweepError, match="give --rate once"):
        capacity_search(make_spec(RunConfig(trace=tiny), [("rate", (1.0, 2.0))]))


def test_kvsim_capacity_writes_its_folder_and_prints_each_capacity(
    tiny: str, tmp_path: Path
) -> None:
    out = tmp_path / "cap"
    args = ["capacity", tiny, "--block-size", "16,64", "--slo", "ttft_p99=1s,tpot_p99=200ms"]
    result = CliRunner().invoke(app, [*args, "--executor", "serial", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "SLO: p99 TTFT ≤ 1 s and p99 TPOT ≤ 200 ms" in result.output
    assert "block_size=16: serves " in result.output and " req/s within the SLOs" in result.output
    assert {p.name for p in out.iterdir()} >= {"capacity.json", "capacity.csv", "probes.csv"}
    table = pd.read_csv(out / "capacity.csv")
    assert table["block_size"].tolist() == [16, 64] and table["capacity_rate_per_s"].gt(0).all()
    described = json.loads((out / "capacity.json").read_text())
    assert described["slo"][0] == {"metric": "ttft", "percentile": 99, "bound_s": 1.0}
    assert described["command"][-2:] == ["--metric", "capacity"]
    # kvsim sweep --metric capacity is the same search; a swept rate is refused
    again = CliRunner().invoke(
        app,
        ["sweep", *args[1:], "--metric", "capacity", "--executor", "serial",
         "--out", str(tmp_path / "again")],
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert pd.read_csv(tmp_path / "again" / "capacity.csv").equals(table)
    refused = CliRunner().invoke(app, ["capacity", tiny, "--rate", "1,2"])
    assert refused.exit_code == 2 and "give --rate once" in refused.output
