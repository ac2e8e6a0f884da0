"""``kvsim plot / animate / report / export-trace`` through typer's CliRunner: exit codes, the
files written, and one-line errors for bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner, Result

from kvsim.cli import app
from kvsim.outputs.perfetto import validate_trace
from kvsim.outputs.run_folder import write_run
from kvsim.plots import PICTURES, V1_PICTURES
from kvsim.plots.standard import OFFLOAD_PICTURE_NAMES
from kvsim.runner import RunResult

# the pictures of a classic run (the pressured runs are classic)
# A classic run's pictures: no v1 prefix cache, no KV offload tier.
CLASSIC_PICTURES = {
    n: f for n, f in PICTURES.items() if n not in V1_PICTURES + OFFLOAD_PICTURE_NAMES
}


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_error_line(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def run_dir(pressured_run: RunResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pressured run (preemptions and rejections) as a run folder without plots."""
    return write_run(pressured_run, tmp_path_factory.mktemp("cli") / "run", plots=False)


def test_plot_draws_every_picture_into_the_run_folder(run_dir: Path) -> None:
    result = kvsim("plot", run_dir, "--from", "100", "--to", "130")
    assert result.exit_code == 0, result.output
    pngs = sorted(p.name for p in (run_dir / "plots").iterdir())
    assert pngs == sorted(CLASSIC_PICTURES.values())
    assert all((run_dir / "plots" / p).read_bytes().startswith(b"\x89PNG") for p in pngs)


def test_plot_some_pictures_elsewhere(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "pics"
    result = kvsim("plot", run_dir, "--what", "gantt", "-w", "occupancy", "--out", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["gantt.png", "kvsim-manifest.json",
                                                     "occupancy.png"]  # fmt: skip


@pytest.mark.parametrize("command", ["plot", "report", "export-trace"])
def test_a_bad_run_dir_is_one_line(command: str, tmp_path: Path) -> None:
    assert_one_error_line(kvsim(command, tmp_path / "nope"), "not a run folder")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    assert_one_error_line(kvsim(command, tmp_path / "half"), "missing summary.json")


def test_a_bad_window_is_one_line(run_dir: Path) -> None:
    assert_one_error_line(kvsim("plot", run_dir, "--from", "5", "--to", "3"), "--to")
    assert_one_error_line(kvsim("report", run_dir, "--from", "-1"), "--from must be >= 0")


def test_animate_writes_a_gif(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "blocks.gif"
    args = ("--from", "100", "--to", "110", "--frames", "4", "--fps", "2")
    result = kvsim("animate", run_dir, "-o", out, *args)
    assert result.exit_code == 0, result.output
    with Image.open(out) as gif:
        assert gif.format == "GIF"
        assert gif.n_frames == 4


def test_animate_over_a_window_without_events_shows_the_still_pool(tmp_path: Path) -> None:
    """A window inside the run where nothing happens is a well-defined animation: every
    frame the pool as it stood when the window opened, the free-blocks line flat at the
    count of the last event before it (not an empty panel), and one line saying so."""
    import numpy as np
    import pandas as pd

    from kvsim.plots.animation import free_blocks_over

    run = tmp_path / "run"
    made = kvsim("run", "azure_llm_2023_conv_first_2min", "--until", "20", "--no-plots",
                 "--out", run)  # fmt: skip
    assert made.exit_code == 0, made.output
    events = pd.read_parquet(run / "events.parquet")
    times = np.sort(events["time_s"].unique())
    gap = int(np.argmax(np.diff(times)))
    lo, hi = times[gap] + 0.01, times[gap + 1] - 0.01
    assert hi - lo > 1.0  # a real gap: no event for over a second
    out = tmp_path / "still.gif"
    result = kvsim("animate", run, "-o", out, "--from", lo, "--to", hi, "--frames", "3")
    assert result.exit_code == 0, result.output
    assert f"no events from {lo:g} s to {hi:g} s" in result.stdout
    with Image.open(out) as gif:
        assert gif.n_frames == 3
    t, free = free_blocks_over(events, 1000, float(lo), float(hi))
    before = events[events["time_s"] <= times[gap]]["free_blocks"].iloc[-1]
    assert t.tolist() == [lo, hi] and free.tolist() == [before, before]
    busy = kvsim("animate", run, "-o", tmp_path / "busy.gif", "--to", times[gap] + 0.01,
                 "--frames", "2")  # fmt: skip
    assert busy.exit_code == 0 and "no events" not in busy.stdout, busy.output


def test_animate_refuses_what_it_cannot_write(run_dir: Path, tmp_path: Path) -> None:
    assert_one_error_line(kvsim("animate", run_dir, "-o", tmp_path / "a.avi"), ".gif or an .mp4")
    assert_one_error_line(
        kvsim("animate", run_dir, "-o", tmp_path / "a.gif", "--frames", "0"), "frames"
    )
    if shutil.which("ffmpeg") is None:
        assert_one_error_line(kvsim("animate", run_dir, "-o", tmp_path / "a.mp4"), "ffmpeg")
    assert list(tmp_path.iterdir()) == []


def test_report_is_one_self_contained_file(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = kvsim("report", run_dir, "-o", out)
    assert result.exit_code == 0, result.output
    assert sorted(tmp_path.iterdir()) == [tmp_path / ".report.html.kvsim.json", out]  # its proof
    page = out.read_text()
    assert page.count('src="data:image/png;base64,') == len(CLASSIC_PICTURES)
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "preemptions" in page and ">240 blocks x 16 tokens<" in page


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_report_draws_side_by_side_what_it_would_draw_one_by_one(
    run_dir: Path, tmp_path: Path
) -> None:
    from kvsim.outputs.report import build_report
    from kvsim.outputs.run_folder import read_run

    out = tmp_path / "report.html"
    assert kvsim("report", run_dir, "-o", out, "--to", "90").exit_code == 0
    run = read_run(run_dir)
    title = f"kvsim run: {run.path.name} ({run.config.trace})"
    assert out.read_text() == build_report(run, title=title, t_to=90.0)  # drawn here, in turn


def test_export_trace_writes_a_valid_timeline(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.perfetto.json"
    result = kvsim("export-trace", run_dir, "-o", out, "--to", "60", "--max-requests", "3")
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    validate_trace(doc)
    threads = {e["tid"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 2}
    assert len(threads) == 3


def test_export_trace_defaults_into_the_run_folder(run_dir: Path) -> None:
    result = kvsim("export-trace", run_dir)
    assert result.exit_code == 0, result.output
    validate_trace(json.loads((run_dir / "run.perfetto.json").read_text()))


@pytest.mark.parametrize(
    ("command", "name", "extra"),
    [("export-trace", "t.json", []),
     pytest.param("report", "r.html", [], marks=pytest.mark.slow),  # the same rule, 5 s
     pytest.param("animate", "a.gif", ["--frames", "2"], marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_named_output_file_is_replaced_only_with_force(
    run_dir: Path, tmp_path: Path, command: str, name: str, extra: list[str]
) -> None:
    mine = tmp_path / name
    mine.write_text("mine")
    for force in ([], ["--force"]):  # the user's file: never replaced
        refused = kvsim(command, run_dir, "-o", mine, *extra, *force)
        assert_one_error_line(refused, "not a file kvsim wrote")
    assert mine.read_text() == "mine"
    folder = tmp_path / "folder"
    folder.mkdir()
    assert_one_error_line(kvsim(command, run_dir, "-o", folder, *extra), "folder")
    out = tmp_path / "k" / name
    assert kvsim(command, run_dir, "-o", out, *extra).exit_code == 0
    first = out.read_bytes()
    assert_one_error_line(kvsim(command, run_dir, "-o", out, *extra), "--force")
    replaced = kvsim(command, run_dir, "-o", out, *extra, "--force")  # kvsim's: replaced
    assert replaced.exit_code == 0, replaced.output
    assert out.read_bytes() == first
    # the run folder's own tables are its input, never an output
    for table in ("config.json", "events.parquet"):
        line = "write a .gif" if command == "animate" else "is this command's input"
        assert_one_error_line(kvsim(command, run_dir, "-o", run_dir / table, *extra), line)


def test_what_names_every_picture_a_run_writes(run_dir: Path, tmp_path: Path) -> None:
    from kvsim.commands.plot import PICTURE_NAMES

    assert tuple(PICTURES) == PICTURE_NAMES  # --what can redraw each file of plots/
    out = tmp_path / "v1"
    result = kvsim("plot", run_dir, "-w", "hit-rate,prompt-tokens", "--out", out)
    assert result.exit_code == 0, result.output  # a classic run: each picture draws a note
    assert sorted(p.name for p in out.iterdir()) == ["kvsim-manifest.json", "prefix_hit_rate.png",
                                                     "prompt_tokens.png"]  # fmt: skip
