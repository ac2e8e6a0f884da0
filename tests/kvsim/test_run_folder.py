"""Run folders: write_run / read_run round-trip, replacement, and nothing half-written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from frame_equality import assert_frame_equal

import kvsim.plots
from kvsim.atomic import OutputError
from kvsim.config import RunConfig
from kvsim.outputs.run_folder import RunFolderError, read_run, write_run
from kvsim.runner import RunResult, run
from workloads import DEFAULT_TRACE_NAME

FILES = {"config.json", "summary.json", "requests.parquet", "steps.parquet", "events.parquet",
         "kvsim-manifest.json"}  # fmt: skip


@pytest.fixture(scope="module")
def short_run() -> RunResult:
    """30 simulated seconds of the default trace: finished and unfinished requests."""
    return run(RunConfig(trace=DEFAULT_TRACE_NAME, until=30.0))


def entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_read_run_returns_what_write_run_wrote(short_run: RunResult, tmp_path: Path) -> None:
    out = write_run(short_run, tmp_path / "run", plots=False)
    assert entries(out) == FILES
    back = read_run(out)
    assert back.config == short_run.config
    assert back.resolved == short_run.resolved
    assert back.summary == short_run.summary
    for name in ("requests", "steps", "events"):
        assert_frame_equal(getattr(back, name), getattr(short_run, name))


def test_config_json_reruns_the_same_simulation(short_run: RunResult, tmp_path: Path) -> None:
    out = write_run(short_run, tmp_path / "run", plots=False)
    again = run(RunConfig.load(out / "config.json"))
    assert_frame_equal(again.events, short_run.events)


def test_summary_json_is_strict_json(short_run: RunResult, tmp_path: Path) -> None:
    result = RunResult(**{f: getattr(short_run, f) for f in RunResult.__slots__})
    result.summary = {**short_run.summary, "kv_usage_mean": math.nan}
    out = write_run(result, tmp_path / "run", plots=False)

    def reject(token: str) -> None:
        raise AssertionError(f"summary.json holds {token}")

    summary = json.loads((out / "summary.json").read_text(), parse_constant=reject)
    assert summary["kv_usage_mean"] is None  # NaN is written as null


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_force_replaces_an_earlier_run_folder(short_run: RunResult, tmp_path: Path) -> None:
    out = tmp_path / "run"
    write_run(short_run, out, plots=True)
    with pytest.raises(OutputError, match="--force replaces it"):
        write_run(short_run, out, plots=False)
    (out / "plots" / "old.png").write_bytes(b"old")  # the user's: no longer kvsim's folder
    with pytest.raises(OutputError, match=r"plots/old\.png"):
        write_run(short_run, out, plots=False, force=True)
    (out / "plots" / "old.png").unlink()
    write_run(short_run, out, plots=False, force=True)
    assert entries(out) == FILES
    assert entries(tmp_path) == {"run"}  # no temporary, old folder or lock left beside it


def test_a_folder_kvsim_did_not_write_is_never_replaced(
    short_run: RunResult, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a kvsim run folder"):
        write_run(short_run, out, plots=False, force=True)
    assert entries(out) == {"notes.txt"}
    assert entries(tmp_path) == {"run"}


def test_plots_and_report_are_written_into_the_folder(short_run: RunResult, tmp_path: Path) -> None:
    out = write_run(short_run, tmp_path / "run", plots=True)
    assert entries(out) == {*FILES, "plots", "report.html"}
    pngs = list((out / "plots").glob("*.png"))
    assert pngs and all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)
    # The report embeds each of those pictures (no external files).
    report = (out / "report.html").read_text(encoding="utf-8")
    assert report.count("data:image/png;base64,") == len(pngs)
    assert '<img src="plots/' not in report


def failing_plots(*args: object, **kwargs: object) -> None:
    raise RuntimeError("plotting failed")


def test_a_failed_write_leaves_no_folder(
    short_run: RunResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kvsim.plots, "write_run_plots", failing_plots)
    with pytest.raises(RuntimeError, match="plotting failed"):
        write_run(short_run, tmp_path / "run", plots=True)
    assert entries(tmp_path) == set()


def test_a_failed_write_keeps_the_previous_folder(
    short_run: RunResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    write_run(short_run, out, plots=False)
    before = {name: (out / name).read_bytes() for name in FILES}

    def failing_parquet(self: pd.DataFrame, path: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", failing_parquet)
    with pytest.raises(OSError, match="disk full"):
        write_run(short_run, out, plots=False, force=True)
    assert entries(tmp_path) == {"run"}
    assert {name: (out / name).read_bytes() for name in FILES} == before


def test_read_run_names_what_is_missing(short_run: RunResult, tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match="no such directory"):
        read_run(tmp_path / "nowhere")
    out = write_run(short_run, tmp_path / "run", plots=False)
    (out / "steps.parquet").unlink()
    with pytest.raises(RunFolderError, match=r"missing steps\.parquet"):
        read_run(out)
