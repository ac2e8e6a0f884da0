"""Running a sweep's points: serially, in a local process pool, or as Ray tasks.

Each point runs in one call of ``run_point``, wherever it is: it simulates, builds the point's
sweep.csv row and the bytes of its run folder (config.json, summary.json, the parquet tables;
no plots), and returns them; a point that raises returns its error instead. The driver writes
every file, so results are identical whatever the executor and a Ray cluster needs no shared
file system. The sweep folder is written into a temporary folder renamed into place at the
end (kvsim.atomic), so an interrupted sweep leaves nothing behind.
"""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from kvsim.atomic import FolderKind, deferred_signals, output_folder
from kvsim.config import RunConfig
from kvsim.sweep.spec import SweepError, SweepPoint, SweepSpec, command_line
from kvsim.sweep.table import SweepResult, failed_row, point_row, rows_frame

EXECUTORS = ("process", "serial", "ray")
# A point failing with one of these stops the sweep: the disk, not the point, is at fault.
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
FORMAT_VERSION = 1
# What kvsim writes in a sweep folder; sweep.json's ``kvsim_sweep`` field marks one.
SWEEP_FOLDER = FolderKind(
    what="sweep folder",
    marker_file="sweep.json",
    marker_key="kvsim_sweep",
    entries=frozenset(
        {"sweep.json", "sweep.csv", "sweep.parquet", "report.md", "report.html",
         "report_error.txt", "plots", "points"}
    ),
)  # fmt: skip


@dataclass(slots=True)
class PointOutcome:
    """What a point sends back: its row and run-folder files, or its error."""

    index: int
    row: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    error: str | None = None  # one line
    details: str | None = None  # the traceback

    @property
    def ok(self) -> bool:
        return self.error is None


# --- one point, wherever it runs -----------------------------------------------------------


def run_point(
    index: int,
    values: dict[str, Any],
    options: dict[str, Any],
    events: bool,
    scratch: str | None = None,
) -> PointOutcome:
    """Simulate one point (``options``: its RunConfig as a dict) and return its outcome. Its
    files are made in a temporary folder under ``scratch`` (default: the system's)."""
    from kvsim.outputs.run_folder import write_run
    from kvsim.runner import run

    point = SweepPoint(index, values, RunConfig.from_dict(options))
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="kvsim-point-", dir=scratch) as tmp:
            # Events stream to disk while the point runs, so memory stays bounded; without
            # --events they are not written at all (tens of millions of rows at block size 1).
            result = run(point.config, None, Path(tmp) / "events.parquet", keep_events=events)
            folder = write_run(result, Path(tmp) / "run", plots=False)
            files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        row = point_row(point, result, time.perf_counter() - start)
        return PointOutcome(index, row, files)
    except OSError as exc:
        if exc.errno in OUT_OF_SPACE:  # every other point would fail the same way
            raise
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return PointOutcome(
            index, failed_row(point, error), error=error, details=traceback.format_exc()
        )
    except Exception as exc:  # a failing point is reported; the sweep goes on
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return PointOutcome(
            index, failed_row(point, error), error=error, details=traceback.format_exc()
        )


# --- executors -----------------------------------------------------------------------------

Task = tuple[int, dict[str, Any], dict[str, Any], bool, str | None]
OnDone = Callable[[PointOutcome], None]


def _serial(tasks: list[Task], on_done: OnDone) -> None:
    for task in tasks:
        on_done(run_point(*task))


def _pool_context() -> multiprocessing.context.BaseContext:
    # forkserver: workers fork from a clean, single-threaded server that imported kvsim once.
    if sys.platform.startswith("linux"):
        from multiprocessing import forkserver, resource_tracker

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(
            ["kvsim.sweep.execute", "kvsim.runner", "kvsim.outputs.run_folder"]
        )
        # Started with SIGINT blocked, which the server and its workers inherit (a signal mask
        # survives exec): Ctrl-C goes to the whole process group, and only the driver should
        # act on it (the server would print a KeyboardInterrupt traceback while it imports
        # kvsim). Blocked, not ignored: a Ctrl-C in the meantime stays pending in the driver
        # and arrives when its mask is restored (ignored, it was lost and the sweep ran on).
        # The resource tracker first: starting it unblocks SIGINT (it protects its own
        # process the same way), which would let the server start unprotected.
        resource_tracker.ensure_running()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return ctx
    return multiprocessing.get_context("spawn")


def _worker_signals() -> None:
    """In a pool worker: Ctrl-C (sent to the whole process group) is the driver's to handle;
    SIGTERM, which the driver sends to stop a worker, unwinds it so that its temporary
    folder is removed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _stop_workers(workers: list[multiprocessing.process.BaseProcess]) -> None:
    """Stop ``workers`` now (SIGTERM, then SIGKILL after 10 s): the pool's shutdown() alone
    lets each finish the point it is running, which may take minutes."""
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    for worker in workers:
        worker.join(10)
        if worker.is_alive():
            worker.kill()
            worker.join()


def _process_pool(tasks: list[Task], on_done: OnDone, jobs: int) -> None:
    pool = ProcessPoolExecutor(
        max_workers=min(jobs, len(tasks)), mp_context=_pool_context(), initializer=_worker_signals
    )
    try:
        # Submitting starts the workers (waiting for the server's imports, seconds): an interrupt
        # in the middle of starting one would leave it running, unknown to the pool.
        with deferred_signals():
            futures = {pool.submit(run_point, *task): task for task in tasks}
        for future in as_completed(futures):
            try:
                outcome = future.result()
            except BrokenProcessPool as exc:
                index, values, options, _, _ = futures[future]
                point = SweepPoint(index, values, RunConfig.from_dict(options))
                error = f"worker process died (out of memory?): {exc}"
                outcome = PointOutcome(index, failed_row(point, error), error=error)
            on_done(outcome)
    except BaseException:  # Ctrl-C, SIGTERM or a driver error: stop every point now
        # _processes is private but stable since Python 3.2 (3.14 adds terminate_workers());
        # shutdown() forgets it, so it is read first.
        workers = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        _stop_workers(workers)
        raise
    pool.shutdown()


def _ray(tasks: list[Task], on_done: OnDone, jobs: int, address: str | None) -> None:
    try:
        import ray
    except ImportError:
        raise SweepError(
            "--executor ray needs Ray: pip install 'kvsim[ray]' (or pip install 'ray>=2.9')"
        ) from None
    started = not ray.is_initialized()
    if started:
        try:
            if address is None:
                ray.init(
                    num_cpus=jobs,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                )
            else:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except Exception as exc:
            raise SweepError(f"cannot start or reach Ray ({address or 'local'}): {exc}") from None
    try:
        remote = ray.remote(num_cpus=1)(run_point)
        pending = [remote.remote(*task) for task in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            on_done(ray.get(done[0]))
    finally:
        if started:
            ray.shutdown()


def execute(
    tasks: list[Task], on_done: OnDone, *, executor: str, jobs: int, address: str | None
) -> None:
    """Run every task, calling ``on_done`` in the driver as each finishes (any order)."""
    if executor not in EXECUTORS:
        raise SweepError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if address is not None and executor != "ray":
        raise SweepError("--address is for --executor ray")
    if executor == "ray":
        _ray(tasks, on_done, jobs, address)
    elif executor == "serial" or jobs == 1 or len(tasks) <= 1:
        _serial(tasks, on_done)
    else:
        _process_pool(tasks, on_done, jobs)


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _slowest_first(points: Iterable[SweepPoint]) -> list[SweepPoint]:
    # Small paged blocks cost most (a block event per few tokens): start them first, so the
    # pool's last worker is not left with the longest point.
    def cost(p: SweepPoint) -> float:
        c = p.config
        return 16 / c.block_size if c.allocator == "paged" else 1.0

    return sorted(points, key=cost, reverse=True)


# --- the sweep folder ----------------------------------------------------------------------


def run_sweep(
    spec: SweepSpec,
    out: Path,
    *,
    executor: str = "process",
    jobs: int | None = None,
    address: str | None = None,
    on_point: Callable[[PointOutcome], None] | None = None,
    report: bool = True,
    force: bool = False,
) -> SweepResult:
    """Run every point of ``spec`` and write the sweep folder ``out`` atomically:
    points/<NNN_...>/ (a run folder each, or error.txt), sweep.csv, sweep.parquet, sweep.json,
    report.md, report.html and plots/. ``out`` must not exist, or be a sweep folder kvsim
    wrote, replaced only with ``force`` (else ``kvsim.atomic.OutputError``, before any point
    runs)."""
    points = spec.points()
    jobs = default_jobs() if jobs is None else jobs
    if type(jobs) is not int or jobs < 1:
        raise SweepError(f"--jobs must be an integer >= 1, got {jobs!r}")
    if executor not in EXECUTORS:  # before the folder: nothing to clean up
        raise SweepError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    command = command_line(spec)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    with output_folder(Path(out), SWEEP_FOLDER, force=force) as tmp:
        _write_json(tmp / "sweep.json", _describe(spec, command))

        def done(outcome: PointOutcome) -> None:
            _write_point(tmp / "points" / points[outcome.index].folder, outcome)
            rows.append(outcome.row)
            outcome.files = {}
            if on_point is not None:
                on_point(outcome)

        # Local points make their files inside the sweep's temporary folder, so that nothing
        # outlives an interrupt; Ray workers may be on other machines and use their own.
        scratch = None if executor == "ray" else tmp / ".scratch"
        if scratch is not None:
            scratch.mkdir()
        tasks: list[Task] = [
            (
                p.index,
                p.values,
                p.config.to_dict(),
                spec.events,
                None if scratch is None else str(scratch),
            )
            for p in _slowest_first(points)
        ]
        execute(tasks, done, executor=executor, jobs=jobs, address=address)
        if scratch is not None:
            shutil.rmtree(scratch)
        table = rows_frame(rows, spec)
        table.to_csv(tmp / "sweep.csv", index=False)
        table.to_parquet(tmp / "sweep.parquet", index=False)
        result = SweepResult(out, spec, table, command, time.perf_counter() - start)
        if report:
            from kvsim.sweep.report import write_report

            try:
                write_report(result, tmp)
            except Exception as exc:  # keep the results: the table and points are written
                result.report_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                (tmp / "report_error.txt").write_text(traceback.format_exc())
    return result


def _write_point(folder: Path, outcome: PointOutcome) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in outcome.files.items():
        (folder / name).write_bytes(data)
    if not outcome.ok:
        (folder / "error.txt").write_text(f"{outcome.error}\n\n{outcome.details or ''}")


def _describe(spec: SweepSpec, command: list[str]) -> dict[str, Any]:
    return {
        "kvsim_sweep": FORMAT_VERSION,
        "command": command,
        "base": spec.base.to_dict(),
        "axes": {name: list(values) for name, values in spec.axes},
        "kv_slots": spec.kv_slots,
        "slo": {
            "ttft_s": spec.slo_ttft_s,
            "tpot_s": spec.slo_tpot_s,
            "percentile": spec.slo_percentile,
        },
        "objective": spec.objective,
        "events": spec.events,
        "num_points": spec.num_points,
    }


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
