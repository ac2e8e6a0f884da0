"""``--out`` on a failing file system: a full disk, a read-only folder, or an error injected
while writing the tables is one error line, and leaves nothing behind (an earlier run being
replaced is kept whole)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from out_safety_helpers import (
    kvsim,
    one_error_line,
    run_into,
    tree,
)


def _mount_tmpfs(where: Path, options: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> object:
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "size=64k")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


@pytest.fixture
def read_only_disk(tmp_path: Path) -> object:
    disk = tmp_path / "ro"
    _mount_tmpfs(disk, "ro,size=64k")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_one_line_and_leaves_nothing(small_disk: Path) -> None:
    one_error_line(kvsim("run", "--until", "30", "--out", small_disk / "run"), "No space left")
    assert os.listdir(small_disk) == []
    one_error_line(kvsim("sweep", "--until", "30", "--out", small_disk / "sw"), "No space left")
    assert os.listdir(small_disk) == []


def test_a_full_disk_while_replacing_keeps_the_earlier_run(small_disk: Path) -> None:
    out = small_disk / "run"
    assert kvsim("run", "--until", "0.5", "--no-plots", "--out", out).exit_code == 0
    before = tree(out)
    one_error_line(kvsim("run", "--until", "30", "--out", out, "--force"), "No space left")
    assert tree(out) == before and os.listdir(small_disk) == ["run"]


def test_a_read_only_folder_is_one_line(read_only_disk: Path) -> None:
    one_error_line(run_into(read_only_disk / "run"), "Read-only file system")
    one_error_line(run_into(read_only_disk / "a" / "run"), "Read-only file system")


def test_an_injected_enospc_while_writing_tables_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    def no_space(table: object, path: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device", str(path))

    # requests.parquet and steps.parquet are written with pq.write_table
    monkeypatch.setattr(pq, "write_table", no_space)
    one_error_line(run_into(tmp_path / "run"), "No space left on device")
    assert os.listdir(tmp_path) == []
