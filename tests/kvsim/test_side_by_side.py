"""Pictures drawn side by side in forked processes: the same files as one after another, every
job done once and in order, a child's failure raised in the parent, and no child left behind."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvsim import RunConfig, run
from kvsim.plots import write_pictures
from kvsim.plots.side_by_side import PictureWorkerError, can_fork, run_jobs

pytestmark = pytest.mark.skipif(not can_fork(), reason="pictures are drawn side by side on Linux")


def pid_job(folder: Path, i: int, seconds: float = 0.0):
    """A job writing the pid that ran it into file ``i``."""

    def job() -> Path:
        time.sleep(seconds)
        path = folder / f"{i}.txt"
        path.write_text(str(os.getpid()))
        return path

    return job


@pytest.mark.slow  # seconds of end-to-end work; .ci/run runs the slow set too
def test_the_pictures_are_the_same_bytes_drawn_side_by_side(tmp_path: Path) -> None:
    result = run(
        RunConfig(trace="azure_llm_2023_conv_first_2min", until=20.0, num_blocks=400)
    )  # v1: all eight pictures
    one, two = tmp_path / "one", tmp_path / "two"
    paths_one = write_pictures(result, one, workers=1)
    paths_two = write_pictures(result, two, workers=3)
    assert [p.name for p in paths_two] == [p.name for p in paths_one]
    assert len(paths_one) == 8
    for a, b in zip(paths_one, paths_two):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert multiprocessing.active_children() == []


def test_every_job_runs_once_in_job_order_and_in_more_than_one_process(tmp_path: Path) -> None:
    jobs = [pid_job(tmp_path, i, 0.2) for i in range(6)]
    paths = run_jobs(jobs, workers=2)
    assert paths == [tmp_path / f"{i}.txt" for i in range(6)]
    pids = {p.read_text() for p in paths}
    assert len(pids) == 2 and str(os.getpid()) in pids
    assert multiprocessing.active_children() == []


def test_one_worker_runs_everything_here(tmp_path: Path) -> None:
    paths = run_jobs([pid_job(tmp_path, i) for i in range(3)], workers=1)
    assert {p.read_text() for p in paths} == {str(os.getpid())}


def test_a_childs_failure_is_raised_with_its_traceback_and_stops_the_rest(tmp_path: Path) -> None:
    parent = os.getpid()

    def failing() -> Path:
        if os.getpid() != parent:
            raise ValueError("no such column: prefix_hit_tokens")
        time.sleep(1.0)  # the parent is busy: the child takes the next job
        return tmp_path / "parent"

    jobs = [failing, failing, *(pid_job(tmp_path, i, 0.5) for i in range(4))]
    with pytest.raises(ValueError, match="no such column: prefix_hit_tokens") as raised:
        run_jobs(jobs, workers=2)
    # the same type (the CLI's one-line errors catch it), caused by the child's traceback
    assert isinstance(raised.value.__cause__, PictureWorkerError)
    assert "Traceback" in str(raised.value.__cause__)
    assert multiprocessing.active_children() == []


def test_a_childs_file_system_error_keeps_its_errno_and_file(tmp_path: Path) -> None:
    parent = os.getpid()

    def no_space() -> Path:
        if os.getpid() != parent:
            raise OSError(28, "No space left on device", str(tmp_path / "gantt.png"))
        time.sleep(1.0)
        return tmp_path / "parent"

    with pytest.raises(OSError) as raised:
        run_jobs([no_space, no_space, no_space], workers=2)
    assert raised.value.errno == 28 and raised.value.filename == str(tmp_path / "gantt.png")
    assert raised.value.strerror == "No space left on device"


def test_an_exception_that_cannot_be_sent_back_is_named_in_the_error(tmp_path: Path) -> None:
    parent = os.getpid()

    class Unpicklable(Exception):  # local: a child's pickle of it fails
        pass

    def failing() -> Path:
        if os.getpid() != parent:
            raise Unpicklable("drawing went wrong")
        time.sleep(1.0)
        return tmp_path / "parent"

    with pytest.raises(PictureWorkerError, match="Unpicklable: drawing went wrong"):
        run_jobs([failing, failing, failing], workers=2)


def test_a_child_that_dies_is_an_error_not_a_hang(tmp_path: Path) -> None:
    parent = os.getpid()

    def dying() -> Path:
        if os.getpid() != parent:
            os._exit(3)
        time.sleep(1.0)
        return tmp_path / "parent"

    with pytest.raises(PictureWorkerError, match="exited with code 3"):
        run_jobs([dying, dying, dying], workers=2)
    assert multiprocessing.active_children() == []


ORPHANS = """
import os, sys, time
from pathlib import Path
from kvsim.plots.side_by_side import run_jobs

folder = Path(sys.argv[1])

def job(i):
    def draw():
        (folder / f"start-{i}-{os.getpid()}").touch()
        time.sleep(0.4)
        return folder / f"start-{i}-{os.getpid()}"
    return draw

run_jobs([job(i) for i in range(40)], workers=3)
"""


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie has exited; nobody reaped it yet


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_children_of_a_killed_parent_stop_at_their_next_picture(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", ORPHANS, str(tmp_path)])
    deadline = time.monotonic() + 60
    while len({p.name.split("-")[2] for p in tmp_path.glob("start-*")}) < 3:
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    parent.kill()
    parent.wait()
    children = {int(p.name.split("-")[2]) for p in tmp_path.glob("start-*")} - {parent.pid}
    time.sleep(1.5)  # each finishes the picture it was drawing (0.4 s), then takes no other
    started = len(list(tmp_path.glob("start-*")))
    time.sleep(1.0)
    assert len(list(tmp_path.glob("start-*"))) == started < 40
    assert not any(alive(pid) for pid in children)


def test_without_semaphores_or_processes_the_jobs_run_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fork = type(multiprocessing.get_context("fork"))

    def no_semaphores(self: object) -> None:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(fork, "Lock", no_semaphores)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    paths = run_jobs([pid_job(tmp_path / "a", i) for i in range(3)], workers=2)
    assert {p.read_text() for p in paths} == {str(os.getpid())}
    monkeypatch.undo()

    def no_processes(self: object) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", no_processes)
    paths = run_jobs([pid_job(tmp_path / "b", i) for i in range(3)], workers=3)
    assert [p.name for p in paths] == ["0.txt", "1.txt", "2.txt"]
    assert {p.read_text() for p in paths} == {str(os.getpid())}
