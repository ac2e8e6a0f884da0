"""Pictures drawn side by side in forked processes (``write_pictures(..., workers=N)``).

A picture takes 0.2-1.1 s to draw and encode on a 2-core test machine (matplotlib's Agg; a
figure with a layout engine is drawn twice per save), and `kvsim run` draws eight of them:
4.5 s of its 7 (6.1 -> 4.2 s side by side, medians of 5 interleaved rounds). Forked
children inherit the run's tables and the drawing jobs (nothing is pickled), take job numbers
from a shared queue, each drawing and writing its PNG (atomically, as the parent would), and
report back; the parent takes jobs too. The bytes are the same as drawn one after another.

Only where fork is the platform's way of starting processes (Linux): elsewhere the jobs run
one after another. A child ignores Ctrl-C; the parent stops and waits for every child before
it returns or raises, so nothing writes into a folder after the caller removed it.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

Job = Callable[[], Path]  # draws one picture, writes it, returns its path
_STOPS = {signal.SIGINT, signal.SIGTERM}
MAX_WORKERS = 4


class PictureWorkerError(RuntimeError):
    """A child drawing pictures died, or failed with an exception that could not be sent back
    as itself; the message carries what is known (its traceback, its exit code)."""


def can_fork() -> bool:
    """Whether ``run_jobs`` can draw side by side here."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def picture_workers() -> int:
    """How many pictures the CLI draws at a time: one per usable CPU, at most
    ``MAX_WORKERS`` (`kvsim run` draws eight; more would mostly wait)."""
    return min(usable_cpus(), MAX_WORKERS)


def run_jobs(jobs: Sequence[Job], workers: int) -> list[Path]:
    """Run every job, at most ``workers`` at a time (this process counts as one); returns
    their paths in job order. Raises the first failure once every child has stopped."""
    num_children = min(workers, len(jobs)) - 1
    if num_children < 1 or not can_fork():
        return [job() for job in jobs]
    ctx = multiprocessing.get_context("fork")
    try:
        tasks = ctx.SimpleQueue()
        reader, writer = ctx.Pipe(duplex=False)
        send_lock = ctx.Lock()
    except OSError:  # no POSIX semaphores (a container without /dev/shm): one after another
        return [job() for job in jobs]
    for i in range(len(jobs)):
        tasks.put(i)
    for _ in range(num_children + 1):
        tasks.put(None)  # one stop for each taker
    children: list[Any] = []
    paths: dict[int, Path] = {}
    try:
        # A signal held until every child has set its own handlers (a Ctrl-C in between
        # would raise the CLI's Interrupted inside a child, with a traceback), then
        # delivered here.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            for _ in range(num_children):
                child = ctx.Process(
                    target=_child, args=(jobs, tasks, writer, send_lock, os.getpid()), daemon=True
                )
                try:
                    child.start()
                except OSError:  # no more processes (EAGAIN, ENOMEM): fewer side by side
                    break
                children.append(child)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        writer.close()  # the children hold it now: the reader sees EOF once they all exit
        while (i := tasks.get()) is not None:
            paths[i] = jobs[i]()
        _collect(reader, children, jobs, paths)
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
            child.join()
        reader.close()
    return [paths[i] for i in range(len(jobs))]


def _collect(
    reader: Connection, children: list[Any], jobs: Sequence[Job], paths: dict[int, Path]
) -> None:
    """Read the children's reports until every job is done (a dead child's jobs would
    never be)."""
    running = list(children)
    while len(paths) < len(jobs):
        ready = wait([reader, *(c.sentinel for c in running)])
        if reader in ready:
            try:
                i, path, error, where = reader.recv()
            except EOFError:  # every child has exited, and some job is still missing
                raise _died(children) from None
            if where is not None:
                raise _rebuilt(error, where)
            paths[i] = Path(path)
            continue
        for child in [c for c in running if c.sentinel in ready]:
            child.join()
            if child.exitcode != 0:
                raise _died([child])
            running.remove(child)  # done: its reports are in the pipe already


def _died(children: list[Any]) -> PictureWorkerError:
    for child in children:
        child.join()
        if child.exitcode != 0:
            return PictureWorkerError(f"a picture worker exited with code {child.exitcode}")
    return PictureWorkerError("the picture workers exited before drawing every picture")


def _child(
    jobs: Sequence[Job], tasks: Any, writer: Connection, send_lock: Any, parent: int
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    while (i := tasks.get()) is not None:
        if os.getppid() != parent:
            return  # the parent was killed (SIGKILL): its folder is stale, draw nothing more
        try:
            report: tuple[int, str | None, bytes | None, str | None] = (
                i, os.fspath(jobs[i]()), None, None
            )  # fmt: skip
        except BaseException as exc:  # sent to the parent, which raises it
            try:
                error: bytes | None = pickle.dumps(exc)
            except Exception:  # an exception that does not pickle: its traceback says it
                error = None
            report = (i, None, error, traceback.format_exc().rstrip())
        with send_lock:
            try:
                writer.send(report)
            except BrokenPipeError:  # the parent died while we drew
                return
    writer.close()


def _rebuilt(error: bytes | None, where: str) -> BaseException:
    """A child's exception as the same type (an OSError keeps its errno and file name, so
    the CLI's one-line messages hold), caused by its traceback; else PictureWorkerError."""
    cause = PictureWorkerError(f"in a picture worker: {where}")
    if error is not None:
        try:
            exc = pickle.loads(error)
        except Exception:  # a type that cannot be rebuilt from its arguments
            return cause
        if isinstance(exc, BaseException):
            exc.__cause__ = cause
            return exc
    return cause
