"""``--out`` never destroys a user's files: kvsim run / kvsim sweep write a new folder, or
replace a folder kvsim wrote (marked, and only with --force); two writers of one folder, a
crash between renames and a killed writer leave nothing lost and nothing of kvsim's behind."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvsim.atomic import (
    OutputBusyError,
    folders,
    names,
    output_lock,
    remove_stale_temporaries,
    temp_path,
)
from kvsim.atomic.owner import OwnerRecord, process_start
from kvsim.cli import app
from kvsim.commands.run import default_out

ROOT = Path(__file__).parents[2]
QUICK = ("--until", "2", "--no-plots")  # a run of about a tenth of a second


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result: Result, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for folders)."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


def run_into(out: Path, *extra: str) -> Result:
    return kvsim("run", *QUICK, "--out", out, *extra)


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    out = tmp_path / "runs" / "r"
    assert run_into(out).exit_code == 0
    return out


# --- what may be written over --------------------------------------------------------------


def test_a_new_folder_is_written_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "run"
    result = run_into(out)
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(out.parent)) == ["run"]
    assert json.loads((out / "config.json").read_text())["kvsim_run"] == 1


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_folder_of_the_users_is_never_touched(tmp_path: Path, force: bool) -> None:
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("important")
    (mine / "sub" / "config.json").write_text("{}")
    before = tree(tmp_path)
    one_error_line(run_into(mine, *(["--force"] if force else [])), "mine", "not a kvsim run")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_file_is_never_replaced(tmp_path: Path, force: bool) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("important")
    one_error_line(run_into(notes, *(["--force"] if force else [])), "notes.txt", "not a folder")
    assert tree(tmp_path) == {"notes.txt": b"important"}


@pytest.mark.parametrize("out", [".", "", "..", "./"], ids=["dot", "empty", "dotdot", "dot-slash"])
def test_the_current_folder_is_never_the_output(
    out: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "notes.txt").write_text("important")
    monkeypatch.chdir(cwd)
    before = tree(tmp_path)
    one_error_line(kvsim("run", *QUICK, "--out", out, "--force"))
    one_error_line(kvsim("sweep", "--until", "1", "--out", out, "--force"))
    assert tree(tmp_path) == before


def test_a_folder_above_the_current_one_is_never_the_output(
    earlier_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside = earlier_run / "plots"
    inside.mkdir()
    monkeypatch.chdir(inside)
    one_error_line(run_into(earlier_run, "--force"), "current folder")


def test_an_earlier_run_is_replaced_only_with_force(earlier_run: Path) -> None:
    before = tree(earlier_run)
    one_error_line(run_into(earlier_run), "earlier kvsim run", "--force")
    assert tree(earlier_run) == before
    result = run_into(earlier_run, "--force", "--num-blocks", "500")
    assert result.exit_code == 0, result.output
    assert json.loads((earlier_run / "summary.json").read_text())["num_blocks"] == 500
    assert sorted(os.listdir(earlier_run.parent)) == ["r"]  # no temporary, old folder or lock


def test_a_kvsim_folder_holding_a_users_file_is_not_replaced(earlier_run: Path) -> None:
    (earlier_run / "my-notes.md").write_text("mine")
    (earlier_run / "plots").mkdir()
    (earlier_run / "plots" / "sketch.svg").write_text("<svg/>")
    before = tree(earlier_run)
    one_error_line(run_into(earlier_run, "--force"), "my-notes.md", "did not write")
    (earlier_run / "my-notes.md").unlink()
    one_error_line(run_into(earlier_run, "--force"), "plots/sketch.svg")
    del before["my-notes.md"]
    assert tree(earlier_run) == before


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_a_hand_made_marker_is_not_enough_for_the_other_kind(earlier_run: Path) -> None:
    # a run folder is not a sweep folder, and the other way round
    one_error_line(kvsim("sweep", "--until", "1", "--out", earlier_run, "--force"), "sweep")
    sweep = earlier_run.parent / "sweep"
    assert kvsim("sweep", "--until", "1", "--out", sweep).exit_code == 0
    one_error_line(run_into(sweep, "--force"), "not a kvsim run folder")
    result = kvsim("sweep", "--until", "1", "--out", sweep, "--force", "--seed", "3")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(sweep.parent)) == ["r", "sweep"]


def test_a_symbolic_link_is_refused(earlier_run: Path) -> None:
    link = earlier_run.parent / "link"
    link.symlink_to(earlier_run)
    one_error_line(run_into(link, "--force"), "symbolic link")
    assert link.is_symlink()


@pytest.mark.parametrize(
    ("make", "out", "fragment"),
    [
        pytest.param(lambda d: (d / "f.txt").write_text("x"), "f.txt/run", "is not a folder",
                     id="file-as-parent"),
        pytest.param(lambda d: [(d / n).write_text("x") for n in ("runs", "sweeps")], None,
                     "is not a folder", id="file-named-runs"),
        pytest.param(lambda d: None, "x" * 300, "file name too long", id="enametoolong"),
        pytest.param(lambda d: (d / "f.txt").write_text("x"), "f.txt/a/b/run", "is not a folder",
                     id="file-as-grandparent"),
    ],
)  # fmt: skip
def test_an_impossible_out_is_one_line_and_leaves_nothing(
    make: object, out: str | None, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    make(tmp_path)  # type: ignore[operator]
    before = tree(tmp_path)
    args = ["--out", out] if out is not None else []
    one_error_line(kvsim("run", *QUICK, *args), fragment)
    one_error_line(kvsim("sweep", "--until", "1", *args), fragment)
    assert tree(tmp_path) == before


def test_a_long_name_still_gets_temporaries_that_fit(tmp_path: Path) -> None:
    out = tmp_path / ("r" * 250)
    result = run_into(out)
    assert result.exit_code == 0, result.output
    assert os.listdir(tmp_path) == [out.name]
    assert len(temp_path(out).name.encode()) <= 255


def test_the_default_folder_never_collides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = default_out("trace.jsonl")
    first.mkdir(parents=True)
    second = default_out("trace.jsonl")
    assert second != first and second.parent == first.parent
    assert second.name.startswith(first.name)


# --- file system failures --------------------------------------------------------------------


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


# --- two writers, killed writers and crashes -------------------------------------------------


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


def test_a_settled_file_is_hashed_once_and_again_once_changed(
    earlier_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--force checks the earlier folder three times; a file left alone for a while is hashed
    once (kvsim/atomic/manifest.py's digests by identity and times), and any write to it
    after, even one that keeps its size and puts its mtime back, changes its ctime: hashed
    again, and refused."""
    from kvsim.atomic import manifest

    monkeypatch.setattr(manifest, "_SETTLED_NS", 0)  # every file counts as settled
    monkeypatch.setattr(manifest, "_DIGESTS", {})
    summary = earlier_run / "summary.json"
    digest = manifest.file_digest(summary)
    assert digest in manifest._DIGESTS.values()
    hashed: list[str] = []
    sha256 = hashlib.sha256

    def counted() -> hashlib._Hash:
        hashed.append("read")
        return sha256()

    monkeypatch.setattr(hashlib, "sha256", counted)
    assert manifest.file_digest(summary) == digest and not hashed  # known: not read again
    before = os.stat(summary)
    text = summary.read_bytes()
    time.sleep(0.01)  # a ctime tick on coarse file systems' clocks
    summary.write_bytes(text.replace(b"0", b"1", 1))
    os.utime(summary, ns=(before.st_atime_ns, before.st_mtime_ns))
    monkeypatch.undo()
    monkeypatch.setattr(manifest, "_SETTLED_NS", 0)
    assert manifest.file_digest(summary) != digest
    one_error_line(run_into(earlier_run, "--force"), "summary.json", "changed since")
