"""``--out`` with two writers, killed writers and crashes: a folder being written is refused
at once, one of two runs into one folder wins and the other says so; what a killed writer or
a crash between renames leaves is removed, or put back, by the next writer in the same folder,
as its owner record says; nothing is lost (kvsim/atomic/names.py, owner.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from out_safety_helpers import (
    ROOT,
    an_earlier_run,
    one_error_line,
    run_into,
    tree,
)

from kvsim.atomic import (
    OutputBusyError,
    folders,
    names,
    output_lock,
    remove_stale_temporaries,
)
from kvsim.atomic.owner import OwnerRecord, process_start


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    return an_earlier_run(tmp_path)


def test_a_folder_being_written_is_refused_at_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with output_lock(out):  # another kvsim process, as far as the lock can tell
        one_error_line(run_into(out), "another kvsim process", f"pid {os.getpid()}")
        with pytest.raises(OutputBusyError), output_lock(out):
            pass
    assert os.listdir(tmp_path) == []  # the lock is gone with its holder
    assert run_into(out).exit_code == 0


SLOW_RUN = ("azure_llm_2023_conv", "--block-size", "2", "--until", "600", "--no-plots")


def _kvsim_process(*args: str | Path, cwd: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "kvsim", *map(str, args)],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def wait_for(condition: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_two_runs_into_one_folder_one_wins_the_other_says_so(tmp_path: Path) -> None:
    first = _kvsim_process("run", *SLOW_RUN, "--out", "runs/r", cwd=tmp_path)
    wait_for(lambda: any(n.endswith(".kvsim-lock") for n in _names(tmp_path / "runs")))
    first.send_signal(signal.SIGSTOP)  # still writing, however fast this machine is
    try:
        second = _kvsim_process("run", *SLOW_RUN, "--out", "runs/r", "--force", cwd=tmp_path)
        _, err2 = second.communicate(timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
    _, err1 = first.communicate(timeout=300)
    assert (first.returncode, second.returncode) == (0, 2), (err1, err2)
    lines = err2.decode().strip().splitlines()
    assert len(lines) == 1 and "another kvsim process" in lines[0], lines
    assert _names(tmp_path / "runs") == ["r"]


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []


def test_a_killed_run_leaves_temporaries_the_next_run_removes(tmp_path: Path) -> None:
    run = _kvsim_process("run", *SLOW_RUN, "--out", "runs/r", cwd=tmp_path)
    wait_for(lambda: any(".kvsim-tmp-" in n for n in _names(tmp_path / "runs")))
    run.kill()
    run.wait()
    left = _names(tmp_path / "runs")
    assert any(".kvsim-tmp-" in n for n in left) and ".r.kvsim-lock" in left
    # a run into another folder of the same parent removes them
    assert run_into(tmp_path / "runs" / "other").exit_code == 0
    assert _names(tmp_path / "runs") == ["other"]


def _lock_of(parent: Path, name: str, record: OwnerRecord | None, raw: bytes = b"") -> Path:
    path = parent / f".{name}.kvsim-lock"
    path.write_bytes(record.to_bytes() if record is not None else raw)
    return path


def test_temporaries_are_removed_only_by_a_dead_owners_record(tmp_path: Path) -> None:
    # look-alike names with no record, or with a record that proves nothing, are left alone
    dead_pid = _dead_pid()
    lookalikes = [f".r.kvsim-tmp-{names._host_id()}-{dead_pid}-0011", ".important.kvsim-lock",
                  ".x.kvsim-lock", ".y.kvsim-lock", ".z.kvsim-lock", "notes.txt"]  # fmt: skip
    (tmp_path / lookalikes[0]).mkdir()
    (tmp_path / lookalikes[1]).write_text("my very important notes")
    _lock_of(tmp_path, "x", None, b"false")
    elsewhere = OwnerRecord(dead_pid, "another-host", None, None, [lookalikes[0]])
    _lock_of(tmp_path, "y", elsewhere)
    alive = OwnerRecord.mine()
    alive.temporaries = [lookalikes[0]]
    _lock_of(tmp_path, "z", alive)
    (tmp_path / "notes.txt").write_text("x")
    before = sorted(os.listdir(tmp_path))
    assert remove_stale_temporaries(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == before
    # a valid record of a dead process of this host: what it lists goes, and its lock
    dead = OwnerRecord.mine()
    dead.pid, dead.started = dead_pid, None
    made = tmp_path / f".r.kvsim-tmp-{names._host_id()}-{dead_pid}-0022"
    made.mkdir()
    (made / "config.json").write_text("{}")
    dead.temporaries = [made.name, "notes.txt", "../escape"]  # only its own temporaries go
    lock = _lock_of(tmp_path, "r", dead)
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted([made, lock])
    assert sorted(os.listdir(tmp_path)) == sorted(before)


def test_a_reused_pid_is_dead_by_its_start_time() -> None:
    me = OwnerRecord.mine()
    assert not me.is_dead_here()
    if me.started is None:
        pytest.skip("no /proc: process start times are unknown")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        reused = OwnerRecord(child.pid, me.host, me.boot, (me.started or 0) - 1)
        assert reused.is_dead_here()  # the pid runs, but not the process the record names
        same = OwnerRecord(child.pid, me.host, me.boot, process_start(child.pid))
        assert not same.is_dead_here()
    finally:
        child.kill()
        child.wait()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


CRASH_BETWEEN_RENAMES = textwrap.dedent(
    """
    import os, sys
    from kvsim.atomic import folders
    folders.exchange = lambda a, b: False  # a file system without an atomic swap
    real_rename = os.rename
    def rename(src, dst):
        real_rename(src, dst)
        if ".kvsim-old-" in str(dst):
            os._exit(9)  # killed after moving the old run aside, before the new one is in
    folders.os.rename = rename
    from kvsim.cli import main
    sys.argv = ["kvsim", "run", "--until", "2", "--no-plots", "--force", "--out", sys.argv[1]]
    main()
    """
)


def test_a_crash_between_the_two_renames_never_loses_the_earlier_run(earlier_run: Path) -> None:
    before = tree(earlier_run)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    crash = subprocess.run([sys.executable, "-c", CRASH_BETWEEN_RENAMES, str(earlier_run)], env=env)
    assert crash.returncode == 9
    left = _names(earlier_run.parent)
    assert "r" not in left and any(".kvsim-old-" in n for n in left)
    # the next writer in the same parent puts the earlier run back
    assert run_into(earlier_run.parent / "other").exit_code == 0
    assert _names(earlier_run.parent) == ["other", "r"]
    assert tree(earlier_run) == before


def test_a_crash_after_the_swap_leaves_the_new_run_and_a_temporary_removed_later(
    earlier_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(folders, "remove_entry", lambda path: None)  # dies before removing old
    assert run_into(earlier_run, "--force", "--num-blocks", "500").exit_code == 0
    monkeypatch.undo()
    assert json.loads((earlier_run / "summary.json").read_text())["num_blocks"] == 500
    # the old run, now under a temporary name of this (live) process, goes with the next write
    # of another process; here: as if this process had died
    stale = [n for n in _names(earlier_run.parent) if ".kvsim-tmp-" in n]
    assert len(stale) == 1
    dead_pid = _dead_pid()
    dead = stale[0].replace(f"-{os.getpid()}-", f"-{dead_pid}-")
    os.rename(earlier_run.parent / stale[0], earlier_run.parent / dead)
    record = OwnerRecord(dead_pid, OwnerRecord.mine().host, None, None, [dead])
    _lock_of(earlier_run.parent, "r", record)  # what a killed writer leaves: its lock's record
    assert run_into(earlier_run.parent / "other").exit_code == 0
    assert _names(earlier_run.parent) == ["other", "r"]


def test_without_an_atomic_swap_the_replacement_is_still_complete(
    earlier_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(folders, "exchange", lambda a, b: False)
    assert run_into(earlier_run, "--force", "--num-blocks", "500").exit_code == 0
    assert json.loads((earlier_run / "summary.json").read_text())["num_blocks"] == 500
    assert _names(earlier_run.parent) == ["r"]
