"""``kvsim run``: simulate one trace and write a run folder."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.commands.console import Command, console, fail, print_notice
from kvsim.commands.options import with_run_options
from kvsim.commands.summary import print_summary
from kvsim.config import RunConfig
from kvsim.errors import KvsimError
from workloads import DEFAULT_TRACE_NAME, WorkloadError


def user_errors(*extra: type[Exception]) -> tuple[type[Exception], ...]:
    """The exceptions that mean bad input (one red line, exit 2), not a bug; plus ``extra``."""
    from engine import EngineError  # here: importing the engine costs `kvsim --help` 60 ms

    return (KvsimError, WorkloadError, EngineError, *extra)


Opt = typer.Option


def default_out(trace: str, folder: str = "runs") -> Path:
    """``runs/<trace>-<timestamp>``, with ``-2``, ``-3``, ... if that is taken already (or
    being written)."""
    stem = Path(trace).stem or folder.rstrip("s")
    return next_free(Path(folder) / f"{stem}-{dt.datetime.now():%Y%m%d-%H%M%S}")


def next_free(base: Path, n: int = 1) -> Path:
    """``base`` (for ``n`` 1) or ``base-N`` for the first N >= ``n`` that is neither taken
    nor being written by another kvsim process."""
    from kvsim.atomic import lock_path

    out = base if n <= 1 else base.with_name(f"{base.name}-{n}")
    while os.path.lexists(out) or os.path.lexists(lock_path(out)):
        n = max(n, 1) + 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def out_path(out: str | None, trace: str, folder: str) -> Path:
    """The ``--out`` folder (refusing an empty one), or the default under ``folder``."""
    if out is None:
        return default_out(trace, folder)
    if not out.strip():
        fail("--out is empty: name the folder to write, e.g. --out runs/mine")
    if "\x00" in out:
        fail("--out must not contain a NUL character")
    return Path(out)


def os_error_message(exc: OSError) -> str:
    """One line for a file-system error: the file and what went wrong."""
    where = str(exc.filename) if exc.filename is not None else ""
    if len(where) > 200:  # a path too long to use is too long to print whole
        where = f"{where[:120]}...{where[-40:]} ({len(where):,} characters)"
    if where and exc.strerror:
        return f"{where}: {exc.strerror}"
    return exc.strerror or str(exc)


@with_run_options("run")
def run_command(
    trace: Annotated[
        str | None,
        typer.Argument(
            metavar="TRACE",
            help="Trace file (.json/.jsonl/.csv) or shipped trace name",
            show_default=DEFAULT_TRACE_NAME,
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        Opt(
            "--config",
            metavar="FILE",
            help="Re-run a run folder's config.json (other options override it)",
        ),
    ] = None,
    options: dict[str, Any] | None = None,
    gpu_spec: Annotated[
        Path | None,
        Opt(metavar="FILE", help="GPU spec JSON file instead of a preset (same as --gpu FILE)"),
    ] = None,
    out: Annotated[
        str | None,
        Opt(
            help="Run folder to create (an existing one only with --force)",
            metavar="DIR",
            show_default="runs/<trace>-<timestamp>",
        ),
    ] = None,
    force: Annotated[
        bool, Opt("--force", help="Replace the --out folder if it holds an earlier kvsim run")
    ] = False,
    no_plots: Annotated[bool, Opt("--no-plots", help="Skip the PNG plots")] = False,
) -> None:
    """Simulate a trace through the engine's BlockManager and Scheduler; write a run folder."""
    given = dict(options or {})
    if trace is not None:
        given["trace"] = trace
    if gpu_spec is not None:
        given["gpu"] = str(gpu_spec)
    try:
        if config_file is not None:
            config = RunConfig.load(config_file).replace(**given)
        else:
            config = RunConfig(**{"trace": DEFAULT_TRACE_NAME, **given})
        out_dir = out_path(out, config.trace, "runs")
        _notice_pure_python()
        result, out_dir = _run_and_write(
            config, out_dir, plots=not no_plots, force=force, default=out is None
        )
    except user_errors() as exc:
        fail(str(exc))
    except OSError as exc:
        fail(os_error_message(exc))
    # its loading share, from the table's columns (a DataFrame would import pandas: 0.2 s)
    requests = result.requests_table if "offload" in result.summary else None
    warned = result.resolved.get("warnings") or []
    print_summary(result.summary, out_dir, config.allocator, warned, requests)


def _notice_pure_python() -> None:
    """Say once, on stderr, when the compiled core is missing (the run goes on in Python)."""
    import engine.compiled

    if engine.compiled.load() is None and os.environ.get(engine.compiled.PURE_PYTHON_ENV) != "1":
        print_notice(str(engine.compiled.unavailable_reason()))


def _run_and_write(
    config: RunConfig, out_dir: Path, *, plots: bool, force: bool, default: bool = False
) -> tuple[Any, Path]:
    """Run with the events streamed into the temporary run folder (so memory stays bounded),
    write the rest there and swap it into place; a failure or an interrupt leaves nothing.
    A ``default`` folder another kvsim run took meanwhile (the same second) gives way to the
    next free name. Returns the result and the folder written."""
    from kvsim.atomic import OutputError, lock_path, output_folder
    from kvsim.outputs.run_folder import RUN_FOLDER, write_run_files

    first = out_dir
    for n in range(2, 1002):
        started = False
        try:
            with output_folder(out_dir, RUN_FOLDER, force=force) as tmp:
                started = True
                result = _run_with_progress(config, tmp / "events.parquet")
                try:
                    workers = 1
                    if plots:
                        from kvsim.plots.side_by_side import picture_workers

                        # the default trace's `kvsim run`, 2 cores: 6.1 -> 4.2 s (medians,
                        # 5 rounds)
                        workers = picture_workers()
                    write_run_files(result, tmp, plots=plots, picture_workers=workers)
                except BaseException:
                    # the writer thread lets go of the folder before it is removed; the
                    # error that stopped the write is the one to report
                    with contextlib.suppress(Exception):
                        result.finish_events()
                    raise
            return result, out_dir
        except OutputError:
            taken = os.path.lexists(out_dir) or os.path.lexists(lock_path(out_dir))
            if started or not default or not taken:
                raise
            out_dir = next_free(first, n)
    raise OutputError(f"{out_dir}: no free name for the run folder")


def _run_with_progress(config: RunConfig, events_path: Path) -> Any:
    from kvsim.runner import run

    if not console.is_terminal:
        # nothing on stdout but the results when piped: no bar (rich.progress alone took
        # 8 ms to import)
        return run(config, None, events_path, finish_events_later=True)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("[bold]simulating[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("requests  {task.fields[sim_s]:>10.1f} s simulated"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("run", total=None, sim_s=0.0)

        def start(total: int) -> None:
            bar.update(task, total=total)

        def progress(sim_s: float, done: int) -> None:
            bar.update(task, completed=done, sim_s=sim_s)

        return run(config, progress, events_path, on_start=start, finish_events_later=True)


def register(app: typer.Typer) -> None:
    app.command("run", cls=Command)(run_command)
