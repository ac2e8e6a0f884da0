"""Sweep executors agree: a local process pool and Ray give the serial results, row for row and
table for table (wall-clock columns aside)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from frame_equality import assert_frame_equal

from kvsim.sweep.execute import run_sweep
from kvsim.sweep.table import WALL_COLUMNS, SweepResult
from tests.kvsim.test_sweep import grid, write_tiny_trace


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tiny_trace(tmp_path_factory.mktemp("trace"))


@pytest.fixture(scope="module")
def serial(tiny_trace: str, tmp_path_factory: pytest.TempPathFactory) -> SweepResult:
    return run_sweep(
        grid(tiny_trace), tmp_path_factory.mktemp("s") / "sw", executor="serial", report=False
    )


def assert_same_sweep(a: SweepResult, b: SweepResult) -> None:
    assert_frame_equal(
        a.table.drop(columns=list(WALL_COLUMNS)), b.table.drop(columns=list(WALL_COLUMNS))
    )
    assert (a.table["status"] == "ok").all()
    for folder in a.table["folder"]:
        for name in ("requests.parquet", "steps.parquet", "events.parquet"):
            assert_frame_equal(
                pd.read_parquet(a.path / "points" / folder / name),
                pd.read_parquet(b.path / "points" / folder / name),
            )


def test_process_pool_gives_the_serial_results(
    serial: SweepResult, tiny_trace: str, tmp_path: Path
) -> None:
    pool = run_sweep(grid(tiny_trace), tmp_path / "pool", executor="process", jobs=2, report=False)
    assert_same_sweep(serial, pool)


@pytest.mark.ray
def test_ray_gives_the_serial_results(serial: SweepResult, tiny_trace: str, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    ray = run_sweep(grid(tiny_trace), tmp_path / "ray", executor="ray", jobs=2, report=False)
    assert_same_sweep(serial, ray)
