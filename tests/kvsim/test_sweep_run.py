"""`kvsim sweep` end to end: the sweep folder, the report (every point, self-contained), a
failing point, and a rate sweep with an SLO."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.sweep.execute import run_sweep
from kvsim.sweep.spec import SweepError, make_spec
from tests.kvsim.test_sweep import grid, write_tiny_trace

FIGURES = {"throughput", "latency", "normalized_latency", "memory", "batch"}
RUN_FILES = {"config.json", "summary.json", "requests.parquet", "steps.parquet", "events.parquet",
             "kvsim-manifest.json"}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tiny_trace(tmp_path_factory.mktemp("trace"))


@pytest.fixture(scope="module")
def sweep(tiny_trace: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweeps") / "serial"
    run_sweep(grid(tiny_trace), out, executor="serial")
    return out


def test_sweep_folder_has_every_point_table_and_report(sweep: Path) -> None:
    names = {p.name for p in sweep.iterdir()}
    assert names == {
        "points",
        "plots",
        "sweep.csv",
        "sweep.parquet",
        "sweep.json",
        "report.md",
        "report.html",
        "kvsim-manifest.json",
    }
    table = pd.read_csv(sweep / "sweep.csv")
    assert len(table) == 4 and (table["status"] == "ok").all()
    assert table["point"].tolist() == [0, 1, 2, 3]
    assert pd.read_parquet(sweep / "sweep.parquet")["label"].tolist() == table["label"].tolist()
    for folder in table["folder"]:
        assert {p.name for p in (sweep / "points" / folder).iterdir()} == RUN_FILES
    assert {p.stem for p in (sweep / "plots").iterdir()} == FIGURES
    # Every allocator gets the same KV memory at a block size; shares sum to 1.
    assert (table.groupby("block_size")["kv_slots"].nunique() == 1).all()
    shares = table[[c for c in table if c.startswith("kv_") and c.endswith("_share_mean")]]
    # five parts, and the cached share a v1 point has (empty here: these points are classic)
    assert len(shares.columns) == 6 and shares.fillna(0).sum(axis=1).round(9).eq(1).all()
    assert not list(sweep.parent.glob(".serial.*"))  # no temporary folder left


def test_report_names_every_point_and_is_self_contained(sweep: Path) -> None:
    table = pd.read_csv(sweep / "sweep.csv")
    md = (sweep / "report.md").read_text()
    page = (sweep / "report.html").read_text()
    for _, r in table.iterrows():
        met = "SLO met" if r["slo_met"] else "SLO missed"
        row = f"| {r['point']} | {r['block_size']} | {r['allocator']} | ok, {met} |"
        assert row in md
        assert f"<td>{r['point']}</td><td>{r['block_size']}</td><td>{r['allocator']}</td>" in page
    for text in (md, page):
        assert "kvsim sweep " in text and "--block-size 16,64 --allocator paged,max" in text
        assert "highest throughput" in text
    assert page.count("data:image/png;base64,") == len(FIGURES)
    assert not re.search(r"(src|href)=['\"]?(https?:|//|plots/)", page)
    for name in FIGURES:
        assert f"(plots/{name}.png)" in md


@pytest.fixture(scope="module")
def rate_sweep(tiny_trace: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Rates 1, 4 and 64 with a TTFT SLO, for a model that exists and one that does not."""
    out = tmp_path_factory.mktemp("rates") / "sw"
    args = [
        "sweep",
        tiny_trace,
        "--param",
        "model=llama-2-7b,no-such-model",
        "--rate",
        "1,4,64",
        "--slo-ttft",
        "0.5",
        "--executor",
        "serial",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output  # some points failed; the folder is complete
    return out, result.output


def test_a_failing_point_is_reported_and_the_sweep_completes(rate_sweep: tuple[Path, str]) -> None:
    out, output = rate_sweep
    assert "no-such-model" in output and "3 failed" in output
    table = pd.read_csv(out / "sweep.csv")
    assert table["status"].tolist() == ["ok", "failed"] * 3  # rate varies slowest
    failed = table[table["status"] == "failed"]
    assert failed["error"].str.contains("no-such-model").all()
    folder = out / "points" / failed["folder"].iloc[0]
    assert "no-such-model" in (folder / "error.txt").read_text()
    for report in ("report.md", "report.html"):
        text = (out / report).read_text()
        assert "Failed points" in text and "rate=64.0 model=no-such-model" in text


def test_rate_sweep_finds_the_highest_rate_meeting_the_slo(rate_sweep: tuple[Path, str]) -> None:
    out, _ = rate_sweep
    table = pd.read_csv(out / "sweep.csv")
    ok = table[table["status"] == "ok"]
    assert ok["rate"].tolist() == [1.0, 4.0, 64.0]
    assert ok["slo_met"].tolist() == (ok["ttft_s_p99"] <= 0.5).tolist()
    assert ok["slo_met"].iloc[0] and not ok["slo_met"].iloc[-1]
    assert not table["slo_met"][table["status"] == "failed"].any()
    # Points write no events unless asked (--events).
    assert not (out / "points" / ok["folder"].iloc[0] / "events.parquet").exists()
    last_met = ok["rate"][ok["slo_met"]].max()
    md = (out / "report.md").read_text()
    assert f"model=llama-2-7b: highest rate meeting the SLO: {last_met:g} requests/s" in md
    assert "model=no-such-model: no swept rate meets the SLO" in md
    assert (out / "plots" / "slo.png").exists()


def test_a_sweep_that_cannot_start_leaves_no_folder(tiny_trace: str, tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="executor must be one of"):
        run_sweep(grid(tiny_trace), tmp_path / "x", executor="slurm")
    assert list(tmp_path.iterdir()) == []
    result = CliRunner().invoke(app, ["sweep", tiny_trace, "--param", "bogus=1,2"])
    assert result.exit_code == 2 and "unknown run option 'bogus'" in result.output


def test_a_sweep_where_every_point_fails_still_has_a_report(
    tiny_trace: str, tmp_path: Path
) -> None:
    spec = make_spec(RunConfig(trace=tiny_trace), [("model", ("nope-a", "nope-b"))])
    result = run_sweep(spec, tmp_path / "sw", executor="serial")
    assert result.num_failed == 2 and result.report_error is None
    assert "No point succeeded." in (tmp_path / "sw" / "report.md").read_text()
    assert "nope-b" in (tmp_path / "sw" / "report.html").read_text()
    assert list((tmp_path / "sw" / "plots").iterdir()) == []
