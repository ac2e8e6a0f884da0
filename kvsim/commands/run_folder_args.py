"""What the picture commands (kvsim plot, animate, report, export-trace) share: their run-folder
argument and window options, reading the folder, the output-file rule over its tables, and
turning a library's exception into one red line and exit code 2."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.commands.console import fail
from kvsim.commands.fleet_plot import is_fleet, no_events_line
from kvsim.errors import KvsimError

RunDir = Annotated[
    Path, typer.Argument(metavar="RUN_DIR", help="A run folder written by kvsim run.")
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="Replace the --out file if kvsim wrote it.")
]


# The run folder's files a picture command reads: never one of its outputs.
RUN_INPUTS = ("config.json", "summary.json", "requests.parquet", "steps.parquet", "events.parquet")


def run_inputs(run_dir: Path) -> tuple[Path, ...]:
    return tuple(run_dir / name for name in RUN_INPUTS)


def check_out(out: Path | None, force: bool, run_dir: Path) -> None:
    """A file the user names is replaced only with --force and only if kvsim wrote it (the
    run folder's own report.html / run.perfetto.json, the defaults, are kvsim's to rewrite);
    never one of the run folder's tables. Checked before any work."""
    from kvsim.atomic import check_output_file

    if out is not None:
        try:
            check_output_file(out, force=force, inputs=run_inputs(run_dir))
        except KvsimError as exc:
            fail(str(exc))


def os_error_message(exc: OSError) -> str:
    from kvsim.commands.run import os_error_message as line  # run's imports only when needed

    return line(exc)


def write_file(path: Path, default: bool, force: bool, run_dir: Path, write: Any) -> None:
    """``write(tmp)`` makes the file; it replaces ``path`` by kvsim's one output rule."""
    from kvsim.atomic import output_file

    with output_file(path, force=force, default=default, inputs=run_inputs(run_dir)) as tmp:
        write(tmp)


FromOption = Annotated[
    float | None,
    typer.Option(
        "--from", metavar="SECONDS", help="Start of the time window (simulated s).",
        show_default="the start",
    ),
]  # fmt: skip
ToOption = Annotated[
    float | None,
    typer.Option(
        "--to", metavar="SECONDS", help="End of the time window (simulated s).",
        show_default="the end",
    ),
]  # fmt: skip


NO_EVENTS_HINT = "rerun it with kvsim run --config {run}/config.json to get them"
# What a hand-edited table can make a picture raise; reported as one line naming the folder.
DRAW_ERRORS = (KeyError, IndexError, TypeError, ValueError, OverflowError)


def read_run_window(
    run_dir: Path, t_from: float | None, t_to: float | None, *, whole_events: bool = True
) -> Any:
    """The run folder, after checking the window; any problem is one red line.
    ``whole_events=False``: for pictures, which read a long events file themselves."""
    for flag, value in (("--from", t_from), ("--to", t_to)):
        if value is not None and not (0 <= value < math.inf):
            fail(f"{flag} must be >= 0 and finite (seconds), got {value}")
    if t_from is not None and t_to is not None and t_to <= t_from:
        fail(f"--to ({t_to}) must be later than --from ({t_from})")
    from kvsim.outputs.run_folder import read_run

    try:
        run = read_run(run_dir, whole_events=whole_events)
    except (KvsimError, OSError, ValueError) as exc:
        fail(str(exc))
    end = float(run.summary["sim_duration_s"])
    if t_from is not None and t_from >= end > 0:
        fail(
            f"--from {t_from}: at or after the end of the run ({end:g} s simulated), so the "
            "window holds nothing to draw"
        )
    return run


def needs_events(run: Any, what: str) -> None:
    if is_fleet(run):  # its events.parquet holds the routing decisions only
        fail(no_events_line(run, what))
    if run.events is None:
        fail(
            f"{run.path}: {what} needs events.parquet, which this run folder does not have "
            f"(a sweep point without --events); {NO_EVENTS_HINT.format(run=run.path)}"
        )


@contextmanager
def one_line_errors(run_dir: Path, doing: str = "draw its tables") -> Iterator[None]:
    """A library's exception as one red line (exit 2): kvsim's own errors and OS errors as
    they say, what a hand-edited table makes a picture raise (``DRAW_ERRORS``) naming the
    folder."""
    try:
        yield
    except KvsimError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(os_error_message(exc))
    except DRAW_ERRORS as exc:
        fail(f"{run_dir}: cannot {doing} (edited by hand?): {type(exc).__name__}: {exc}")
