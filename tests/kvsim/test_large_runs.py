"""Runs whose events.parquet is too long to read back whole still get their occupancy map
(from a sample of blocks, said in the title) and Gantt chart (from the drawn requests' own
rows: exact). The limit is lowered here so that a small run stands for a 34.5 M-row one."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from kvsim.analysis.occupancy import block_intervals
from kvsim.config import RunConfig
from kvsim.outputs import run_folder
from kvsim.outputs.run_folder import write_run
from kvsim.plots import COLORS, large_runs, plot_gantt
from kvsim.plots.large_runs import (
    BLOCK_KINDS,
    event_rows,
    plot_gantt_of_file,
    plot_sampled_occupancy,
    sample_blocks,
)
from kvsim.runner import RunResult, run


@pytest.fixture(scope="module")
def streamed(
    conversation_trace: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RunResult, Path]:
    """A v1 run with prefix caching and preemptions, its events streamed to a file."""
    path = tmp_path_factory.mktemp("large") / "events.parquet"
    config = RunConfig(
        trace=str(conversation_trace), model="llama-3.1-8b", gpu="h100-sxm", num_blocks=40
    )
    return run(config, events_path=path), path


def test_the_sample_is_every_strideth_blocks_rows(streamed: tuple[RunResult, Path]) -> None:
    _, path = streamed
    rows = event_rows(path)
    sample = sample_blocks(path, max_rows=rows // 3)
    assert sample.stride == 3 or sample.stride == 4
    full = pd.read_parquet(path)
    block = full["block_id"].to_numpy()
    kept = full["kind"].isin(BLOCK_KINDS) & ((block % sample.stride == 0) | (block < 0))
    want = full[kept].reset_index(drop=True)
    want["block_id"] = np.where(want["block_id"] >= 0, want["block_id"] // sample.stride, -1)
    got = sample.events.reset_index(drop=True)
    assert got["kind"].astype(str).tolist() == want["kind"].astype(str).tolist()
    assert got["block_id"].tolist() == want["block_id"].tolist()
    assert got["time_s"].tolist() == want["time_s"].tolist()
    assert f"every {sample.stride}{'rd' if sample.stride == 3 else 'th'} block" in sample.note()


def test_the_sampled_map_holds_exactly_the_sampled_blocks_holdings(
    streamed: tuple[RunResult, Path],
) -> None:
    result, path = streamed
    sample = sample_blocks(path, max_rows=event_rows(path) // 3)
    end_s = result.summary["sim_duration_s"]
    full = block_intervals(pd.read_parquet(path), end_s)
    full = full[full["block_id"] % sample.stride == 0].assign(
        block_id=lambda d: d["block_id"] // sample.stride
    )
    got = block_intervals(sample.events, end_s, regions=False)
    key = ["block_id", "seq_id", "start_s", "end_s"]
    assert got[key].sort_values(key).values.tolist() == full[key].sort_values(key).values.tolist()
    fig = plot_sampled_occupancy(path, 40, end_s=end_s, max_rows=event_rows(path) // 3)
    title = fig.axes[0].get_title()
    assert title.startswith("Block occupancy: 40 blocks") and "sampled: every" in title
    assert fig.axes[0].get_ylim() == (39.5, -0.5)  # the whole pool's axis
    plt.close(fig)


def bars(fig: plt.Figure) -> list[tuple[float, float, float, tuple[float, ...]]]:
    return sorted(
        (round(p.get_y(), 6), round(p.get_x(), 9), round(p.get_width(), 9), p.get_facecolor())
        for p in fig.axes[0].patches
    )


def test_the_gantt_from_the_file_equals_the_one_from_every_event(
    streamed: tuple[RunResult, Path],
) -> None:
    result, path = streamed
    end_s = result.summary["sim_duration_s"]
    window = {"t_from": end_s * 0.3, "t_to": end_s * 0.6}
    full = plot_gantt(
        pd.read_parquet(path), result.steps, requests=result.requests, end_s=end_s, **window
    )
    from_file = plot_gantt_of_file(path, result.steps, result.requests, None, end_s=end_s, **window)
    assert bars(from_file) == bars(full) and bars(full)
    assert from_file.axes[0].get_title() == full.axes[0].get_title()
    assert to_rgba(COLORS["decode"]) in {b[3] for b in bars(full)}
    plt.close("all")


def test_kvsim_run_draws_both_pictures_of_a_long_run(
    pressured_config: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pressured_config.replace(until=30.0), events_path=tmp_path / "stream.parquet")
    limit = event_rows(tmp_path / "stream.parquet") // 2  # this run is "too long" for it
    monkeypatch.setattr(run_folder, "MAX_PLOTTED_EVENT_ROWS", limit)
    monkeypatch.setattr(large_runs, "MAX_PLOTTED_EVENT_ROWS", limit)
    folder = write_run(result, tmp_path / "run")
    pngs = {p.name for p in (folder / "plots").iterdir()}
    assert {"occupancy.png", "gantt.png"} <= pngs


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_kvsim_plot_and_report_of_a_long_run_folder(
    pressured_config: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from kvsim.cli import app
    from kvsim.outputs.run_folder import MARK_KINDS, read_run

    result = run(pressured_config.replace(until=30.0))
    folder = write_run(result, tmp_path / "run", plots=False)
    limit = event_rows(folder / "events.parquet") // 2
    monkeypatch.setattr(run_folder, "MAX_PLOTTED_EVENT_ROWS", limit)
    monkeypatch.setattr(large_runs, "MAX_PLOTTED_EVENT_ROWS", limit)
    marks = read_run(folder, whole_events=False)
    assert marks.events_path == folder / "events.parquet" and marks.events is not None
    assert set(marks.events["kind"].astype(str)) <= set(MARK_KINDS)
    assert read_run(folder).events_path is None  # animate, export-trace: every row
    from kvsim.plots import draw

    occupancy = draw(marks, "occupancy")
    title = occupancy.axes[0].get_title()
    assert "one row per 3 blocks" in title or "one row per 2 blocks" in title
    rows = event_rows(folder / "events.parquet")
    assert "sampled: every" in title and f"of {rows:,} event rows" in title
    gantt = draw(marks, "gantt", t_from=10.0, t_to=20.0)  # its requests' rows, from the file
    whole = draw(read_run(folder), "gantt", t_from=10.0, t_to=20.0)
    assert bars(gantt) == bars(whole) and gantt.axes[0].get_title() == whole.axes[0].get_title()
    plt.close("all")
    out = tmp_path / "pics"
    done = CliRunner().invoke(app, ["plot", str(folder), "-w", "occupancy,gantt", "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".png") == [
        "gantt.png", "occupancy.png",
    ]  # fmt: skip
    done = CliRunner().invoke(app, ["report", str(folder)])
    assert done.exit_code == 0, done.output
    assert "occupancy" in (folder / "report.html").read_text()
