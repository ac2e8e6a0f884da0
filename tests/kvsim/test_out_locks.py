"""Writers of different outputs in one folder never refuse each other, and no writer sees a
lock before its maker has locked it and recorded itself: picture workers each write one PNG
into one folder, and each first sweeps that folder for what killed writers left.

A lock file used to be made under its name and then locked, and a sweep flocked every lock
file in the folder, a new one too: a worker that had just made its lock file found it held
and said "another kvsim process is writing this output" (a flaky ``kvsim plot``), leaving
its lock file without a record, which refused every later writer of that output."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvsim.atomic import (
    OutputError,
    atomic_write_bytes,
    lock_path,
    names,
    output_lock,
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
    # A lock file made in place (where the file system has no hard links; elsewhere, a new
    # lock being made under a name of its own), not yet locked.
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


def test_no_writer_sees_a_lock_before_its_maker_locked_it_and_recorded_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers of one output: the second comes in just as the first locks its new lock
    file. It used to find that file unlocked and without a record, take it for a stranger's
    and fail ("not a kvsim lock"), or hold it and make the first fail and leave it there."""
    final = tmp_path / "latency_cdfs.png"
    second: list[str] = []

    def flock(fd: int, operation: int) -> None:
        if not second:  # the first writer is about to lock its new file: the second comes in
            second.append("came")
            try:
                with output_lock(final):
                    second.append("wrote")
            except OutputError as exc:
                second.append(str(exc))
        fcntl.flock(fd, operation)

    shim = SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB)
    monkeypatch.setattr(names, "fcntl", shim)
    atomic_write_bytes(final, b"first")
    assert second == ["came", "wrote"]  # before the first had its lock: one after the other
    assert final.read_bytes() == b"first" and os.listdir(tmp_path) == [final.name]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_writer_waits_for_a_sweep_reaping_a_dead_writers_lock_of_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed writer left its lock and a temporary; while another output's writer sweeps
    them away (holding that lock a moment), a writer of the killed one's output comes in: it
    used to say "another kvsim process (pid of the dead one) is writing this output"."""
    final = tmp_path / "latency_cdfs.png"
    dead_pid = _dead_pid()
    left = tmp_path / f".{final.name}.kvsim-tmp-{names._host_id()}-{dead_pid}-0011"
    left.mkdir()
    dead = OwnerRecord(dead_pid, OwnerRecord.mine().host, None, None, [left.name])
    lock_path(final).write_bytes(dead.to_bytes())
    outcome: list[str] = []
    waiting = threading.Event()
    sweeper = threading.current_thread()

    def write() -> None:
        try:
            atomic_write_bytes(final, b"new")
            outcome.append("wrote")
        except OutputError as exc:
            outcome.append(str(exc))
        finally:
            waiting.set()

    def sleep(seconds: float) -> None:  # the writer waits for the lock's reaper
        waiting.set()
        time.sleep(seconds)

    def flock(fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)
        if threading.current_thread() is sweeper and not outcome and not waiting.is_set():
            writer.start()  # the sweep holds the dead writer's lock: the writer comes in
            assert waiting.wait(10)

    writer = threading.Thread(target=write)
    shim = SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB)
    monkeypatch.setattr(names, "fcntl", shim)
    monkeypatch.setattr(names, "time", SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted([left, lock_path(final)])
    writer.join(10)
    assert outcome == ["wrote"]
    assert final.read_bytes() == b"new" and os.listdir(tmp_path) == [final.name]


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
