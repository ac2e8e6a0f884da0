"""The picture commands over a fleet's run folder, whose events.parquet holds only the
routing decisions and whose tables mix its replicas: ``kvsim plot`` and ``kvsim report`` draw
the fleet's own pictures and say what they skipped; what needs events, or a one-replica
picture, is one line, exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvsim.cli import app
from kvsim.commands.fleet_plot import FLEET_PICTURE_NAMES
from kvsim.commands.plot import PICTURE_NAMES
from kvsim.plots.fleet import FLEET_PICTURES

FLEET_FILES = sorted(FLEET_PICTURES.values())


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result: Result, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fleet") / "run"
    result = kvsim("run", "--until", "10", "--replicas", "2", "--no-plots", "--out", out)
    assert result.exit_code == 0, result.output
    assert (out / "events.parquet").exists()  # the routing decisions (test_route_events.py)
    return out


@pytest.fixture
def copy(fleet: Path, tmp_path: Path) -> Path:
    shutil.copytree(fleet, tmp_path / "run")
    return tmp_path / "run"


def test_the_fleet_picture_names_are_the_fleet_pictures() -> None:
    assert tuple(FLEET_PICTURES) == FLEET_PICTURE_NAMES


def test_plot_of_a_fleet_draws_its_pictures_and_says_what_it_skipped(copy: Path) -> None:
    result = kvsim("plot", copy)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (copy / "plots").iterdir()) == FLEET_FILES
    skipped = [line for line in result.stdout.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 1 and "mix its 2 replicas" in skipped[0]
    assert all(name in skipped[0] for name in PICTURE_NAMES)
    out = copy.parent / "pics"
    result = kvsim("plot", copy, "--what", "fleet-load", "--out", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["fleet_load.png", "kvsim-manifest.json"]
    assert "skipped" not in result.stdout  # asked for one picture, given it


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["plot", "{run}", "--what", "gantt"], ["a fleet run (2 replicas) has no gantt picture"]),
        (["plot", "{run}", "--what", "latency"], ["mix the replicas", "fleet-load"]),
        (["plot", "{run}", "--from", "1"], ["span the whole run", "--from/--to"]),
        (["report", "{run}", "--to", "5"], ["span the whole run"]),
        (["animate", "{run}", "-o", "{tmp}/a.gif"], ["kvsim animate needs a replica's events",
                                                     "holds only its routing decisions"]),
        (["export-trace", "{run}", "-o", "{tmp}/t.json"], ["kvsim export-trace needs a "
                                                           "replica's events"]),
        (["export-kv-events", "{run}", "-o", "{tmp}/k.jsonl"], ["routing decisions (ROUTE)",
                                                               "not its replicas' KV events"]),
    ],
)  # fmt: skip
def test_what_a_fleet_cannot_draw_is_one_line(
    args: list[str], fragments: list[str], copy: Path, tmp_path: Path
) -> None:
    before = sorted(p.name for p in tmp_path.rglob("*"))
    argv = [a.format(run=copy, tmp=tmp_path) for a in args]
    one_error_line(kvsim(*argv), *fragments)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_report_of_a_fleet_embeds_its_pictures(copy: Path) -> None:
    result = kvsim("report", copy)
    assert result.exit_code == 0, result.output
    report = (copy / "report.html").read_text()
    assert report.count("<img") == 3
    assert all(f'alt="{name}"' in report for name in FLEET_PICTURE_NAMES)
    assert "kvsim fleet" in report


def test_a_fleet_picture_of_a_one_replica_run_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "one"
    assert kvsim("run", "--until", "2", "--no-plots", "--out", run).exit_code == 0
    one_error_line(kvsim("plot", run, "--what", "fleet-imbalance"), "is a fleet's picture")
