"""Writers of different outputs in one folder never refuse each other, and a lock file is
locked by its maker alone until it records its owner: picture workers each write one PNG
into one folder, and each first sweeps that folder for what killed writers left.

A sweep used to flock every lock file in the folder, a new one too: a worker that had just
made its lock file found it held and said "another kvsim process is writing this output"
(a flaky ``kvsim plot``), leaving its lock file without a record, which refused every later
writer of that output."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvsim.atomic import (
    OutputBusyError,
    OutputError,
    atomic_write_bytes,
    lock_path,
    names,
    remove_stale_temporaries,
)
from kvsim.atomic.names import OutputLock
from kvsim.atomic.owner import OwnerRecord

LOCK_NOW = fcntl.LOCK_EX | fcntl.LOCK_NB


def _made(final: Path) -> int:
    """A writer's lock file for ``final``, made (its first step) but not yet locked."""
    return os.open(lock_path(final), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)


def _lock_and_record(fd: int) -> None:
    """The maker's next steps: lock its file, then record itself as its owner."""
    fcntl.flock(fd, LOCK_NOW)  # BlockingIOError: the maker would say its output is busy
    OutputLock(fd, OwnerRecord.mine())._write()


def test_a_sweep_never_holds_a_lock_file_its_maker_is_about_to_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    maker = _made(tmp_path / "latency_cdfs.png")
    refused: list[int] = []

    def flock(fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)
        if fd != maker:  # the sweep holds some lock file: the maker locks its own now
            try:
                fcntl.flock(maker, LOCK_NOW)
                fcntl.flock(maker, fcntl.LOCK_UN)
            except BlockingIOError:
                refused.append(fd)

    shim = SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB)
    monkeypatch.setattr(names, "fcntl", shim)
    try:
        assert remove_stale_temporaries(tmp_path) == []  # another picture's writer sweeps
        assert refused == []
        _lock_and_record(maker)
    finally:
        os.close(maker)


def test_a_writer_meeting_a_lock_file_without_a_record_lets_its_maker_lock_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    final = tmp_path / "latency_cdfs.png"
    maker = _made(final)
    read_record = names._read_record
    refused: list[int] = []

    def read_then_maker_goes_on(fd: int) -> OwnerRecord | None:
        if fd != maker and not refused:  # a second writer of the output looks at the file
            monkeypatch.setattr(names, "_read_record", read_record)
            try:
                _lock_and_record(maker)
            except BlockingIOError:
                refused.append(fd)
        return read_record(fd)

    monkeypatch.setattr(names, "_read_record", read_then_maker_goes_on)
    try:
        with pytest.raises(OutputBusyError, match=f"pid {os.getpid()}"):
            atomic_write_bytes(final, b"second")  # one of two writers of one output says busy
        assert refused == [] and not final.exists()
    finally:
        os.close(maker)


def test_a_lock_file_that_never_gets_a_record_is_not_kvsims(tmp_path: Path) -> None:
    final = tmp_path / "notes.txt"
    lock_path(final).write_bytes(b"")  # a user's file of that name, however it looks
    with pytest.raises(OutputError, match="is not a kvsim lock"):
        atomic_write_bytes(final, b"x")
    assert lock_path(final).read_bytes() == b"" and not final.exists()


def _write_often(folder: str, name: str, times: int) -> str | None:
    for _ in range(times):
        try:
            atomic_write_bytes(Path(folder) / name, b"x" * 1000)
        except OutputError as exc:
            return str(exc)
    return None


@pytest.mark.slow  # 1-2 s of processes racing; the tests above force the interleavings
def test_writers_of_different_files_in_one_folder_never_refuse_each_other() -> None:
    with tempfile.TemporaryDirectory() as folder:
        with multiprocessing.get_context("fork").Pool(6) as pool:
            jobs = [(folder, f"picture{i}.png", 300) for i in range(6)]
            assert pool.starmap(_write_often, jobs) == [None] * 6
        assert sorted(os.listdir(folder)) == [f"picture{i}.png" for i in range(6)]
