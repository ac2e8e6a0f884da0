"""Picture commands over a run folder: ``kvsim plot``, ``kvsim animate``, ``kvsim report``,
``kvsim export-trace``.

Each reads the run folder and hands off to one library function (kvsim.plots,
kvsim.plots.animation, kvsim.outputs.report, kvsim.outputs.perfetto); only this edge turns their
exceptions into one red line and exit code 2.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.commands.console import Command, fail, say
from kvsim.commands.fleet_plot import (
    FLEET_PICTURE_NAMES,
    PD_PICTURE_NAMES,
    draw_fleet,
    fleet_names,
    fleet_pngs,
    is_fleet,
    no_events_line,
    skipped_line,
)
from kvsim.errors import KvsimError

RunDir = Annotated[
    Path, typer.Argument(metavar="RUN_DIR", help="A run folder written by kvsim run.")
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="Replace the --out file if kvsim wrote it.")
]


# The run folder's files a picture command reads: never one of its outputs.
RUN_INPUTS = ("config.json", "summary.json", "requests.parquet", "steps.parquet", "events.parquet")


def _inputs(run_dir: Path) -> tuple[Path, ...]:
    return tuple(run_dir / name for name in RUN_INPUTS)


def _check_out(out: Path | None, force: bool, run_dir: Path) -> None:
    """A file the user names is replaced only with --force and only if kvsim wrote it (the
    run folder's own report.html / run.perfetto.json, the defaults, are kvsim's to rewrite);
    never one of the run folder's tables. Checked before any work."""
    from kvsim.atomic import check_output_file

    if out is not None:
        try:
            check_output_file(out, force=force, inputs=_inputs(run_dir))
        except KvsimError as exc:
            fail(str(exc))


def os_error_message(exc: OSError) -> str:
    from kvsim.commands.run import os_error_message as line  # run's imports only when needed

    return line(exc)


def _write_file(path: Path, default: bool, force: bool, run_dir: Path, write: Any) -> None:
    """``write(tmp)`` makes the file; it replaces ``path`` by kvsim's one output rule."""
    from kvsim.atomic import output_file

    with output_file(path, force=force, default=default, inputs=_inputs(run_dir)) as tmp:
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


# The pictures ``kvsim plot`` draws (the keys of kvsim.plots.PICTURES; kept here so that
# ``kvsim --help`` does not import matplotlib).
PICTURE_NAMES = (
    "occupancy", "free-blocks", "kv-breakdown", "gantt", "latency", "batch", "hit-rate",
    "prompt-tokens", "offload-tier", "offload-sources", "offload-ttft", "offload-transfers",
)  # fmt: skip
NO_EVENTS_HINT = "rerun it with kvsim run --config {run}/config.json to get them"
# What a hand-edited table can make a picture raise; reported as one line naming the folder.
DRAW_ERRORS = (KeyError, IndexError, TypeError, ValueError, OverflowError)


def _read(
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


def _needs_events(run: Any, what: str) -> None:
    if is_fleet(run):  # its events.parquet holds the routing decisions only
        fail(no_events_line(run, what))
    if run.events is None:
        fail(
            f"{run.path}: {what} needs events.parquet, which this run folder does not have "
            f"(a sweep point without --events); {NO_EVENTS_HINT.format(run=run.path)}"
        )


def picture_names(what: list[str] | None) -> list[str] | None:
    """``--what`` values, each a name or a comma-separated list of names (None: all)."""
    if not what:
        return None
    names = [n.strip() for item in what for n in item.split(",")]
    for name in names:
        if name not in PICTURE_NAMES + FLEET_PICTURE_NAMES + PD_PICTURE_NAMES:
            fail(
                f"--what: no picture named {name!r}; pictures: {', '.join(PICTURE_NAMES)} "
                f"(a fleet's: {', '.join(FLEET_PICTURE_NAMES + PD_PICTURE_NAMES)})"
            )
    return list(dict.fromkeys(names))


def plot_command(
    run_dir: RunDir,
    what: Annotated[
        list[str] | None,
        typer.Option(
            "--what",
            "-w",
            metavar="NAME[,NAME...]",
            help=f"Pictures to draw: {', '.join(PICTURE_NAMES)}; a fleet's: "
            f"{', '.join(FLEET_PICTURE_NAMES + PD_PICTURE_NAMES)} (comma-separated or "
            "repeated).",
            show_default="all",
        ),
    ] = None,
    t_from: FromOption = None,
    t_to: ToOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="DIR",
            help="Folder for the PNGs (a new one, or one kvsim plot wrote, with --force).",
            show_default="RUN_DIR/plots",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the --out folder if kvsim plot wrote it.")
    ] = False,
) -> None:
    """Draw pictures of a run as PNGs: occupancy map, free blocks, KV breakdown, Gantt chart,
    latency CDFs, batch size; a v1 run's prefix-cache hit rate and prompt tokens too, and a
    KV offloading run's CPU tier, prompt tokens by source, TTFT split and transfers.

    Reads RUN_DIR's tables, so any picture can be redrawn over any time window. A run folder
    without events.parquet (a sweep point) gets the pictures that need no events; a fleet's,
    its fleet pictures (load, hit rate, imbalance per replica) over the whole run."""
    from kvsim.plots import NEEDS_EVENTS
    from kvsim.plots.standard import OFFLOAD_PICTURE_NAMES, is_offload_run

    names = picture_names(what)
    run = _read(run_dir, t_from, t_to, whole_events=False)
    fleet = is_fleet(run)
    if fleet:
        names = fleet_names(run, names, t_from, t_to)
    for name in names or []:
        if name in FLEET_PICTURE_NAMES + PD_PICTURE_NAMES and not fleet:
            fail(f"{run_dir}: {name} is a fleet's picture, and this run has one replica")
        if name in OFFLOAD_PICTURE_NAMES and not is_offload_run(run):
            fail(
                f"{run_dir}: {name} is a KV offloading run's picture (kvsim run "
                "--kv-offloading-size GiB), and this run has no CPU tier"
            )
        if name in NEEDS_EVENTS:
            _needs_events(run, f"the {name} picture")
    try:
        paths = _draw_pictures(run, run_dir, out, names, force, t_from, t_to, fleet)
    except KvsimError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(os_error_message(exc))
    except DRAW_ERRORS as exc:
        fail(f"{run_dir}: cannot draw its tables (edited by hand?): {type(exc).__name__}: {exc}")
    for path in paths:
        say("wrote ", path)
    if fleet and what is None:
        say(skipped_line(run, PICTURE_NAMES))
    elif names is None and run.events is None:
        say(
            f"skipped {', '.join(_event_pictures(run))}: no events.parquet; "
            + NO_EVENTS_HINT.format(run=run_dir)
        )


def _event_pictures(run: Any) -> list[str]:
    """The pictures ``run`` would get from its events (an offload run's transfers too)."""
    from kvsim.plots import NEEDS_EVENTS
    from kvsim.plots.standard import OFFLOAD_PICTURE_NAMES, is_offload_run

    offload = is_offload_run(run)
    return [n for n in NEEDS_EVENTS if offload or n not in OFFLOAD_PICTURE_NAMES]


def _draw_pictures(
    run: Any,
    run_dir: Path,
    out: Path | None,
    names: list[str] | None,
    force: bool,
    t_from: float | None,
    t_to: float | None,
    fleet: bool = False,
) -> list[Path]:
    """Draw into RUN_DIR/plots (each picture a file of the run folder, replaced only if kvsim
    wrote it, and listed in the folder's manifest), or into the new folder ``out``; a fleet's
    pictures with ``fleet`` (``names`` then names fleet pictures)."""
    import shutil
    import tempfile

    from kvsim.atomic import FolderKind, check_output_file, output_folder
    from kvsim.plots import write_pictures
    from kvsim.plots.side_by_side import picture_workers

    def draw(folder: Path) -> list[Path]:
        if fleet:
            return draw_fleet(run, folder, names or list(FLEET_PICTURE_NAMES))
        workers = picture_workers()
        return write_pictures(run, folder, names, t_from=t_from, t_to=t_to, workers=workers)

    default = run_dir / "plots"
    if out is not None and not _same_place(out, default):
        kind = FolderKind("pictures folder", "", "", frozenset())
        with output_folder(out, kind, force=force) as tmp:
            drawn = draw(tmp)
        return [out / p.name for p in drawn]
    with tempfile.TemporaryDirectory(prefix="kvsim-plot-") as scratch:
        drawn = draw(Path(scratch))
        for path in drawn:  # every target checked before any is written
            check_output_file(default / path.name, force=force, default=True)
        for path in drawn:
            _write_file(
                default / path.name,
                True,
                force,
                run_dir,
                lambda tmp, p=path: shutil.copyfile(p, tmp),
            )
    return [default / p.name for p in drawn]


def _same_place(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False


def animate_command(
    run_dir: RunDir,
    out: Annotated[
        Path,
        typer.Option("--out", "-o", metavar="FILE", help="blocks.gif, or .mp4 (needs ffmpeg)."),
    ],
    t_from: FromOption = None,
    t_to: ToOption = None,
    frames: Annotated[
        int, typer.Option(min=1, max=10_000, metavar="N", help="Frames, evenly spaced.")
    ] = 60,
    fps: Annotated[int, typer.Option(min=1, max=60, metavar="FPS", help="Frames per second.")] = 10,
    by_request: Annotated[
        bool | None,
        typer.Option(
            "--by-request/--by-state",
            help="Colour blocks by owning request or by "
            "state (default: by request up to 1,024 blocks).",
        ),
    ] = None,
    force: ForceOption = False,
) -> None:
    """Animate the block pool over a time window."""
    from kvsim.plots.animation import animate_occupancy

    if out.suffix not in (".gif", ".mp4"):  # checked here, before the file is a temporary
        fail(f"{out}: write a .gif or an .mp4, not {out.suffix or 'no suffix'!r}")
    _check_out(out, force, run_dir)
    run = _read(run_dir, t_from, t_to)
    _needs_events(run, "kvsim animate")
    try:
        _write_file(
            out, False, force, run_dir,
            lambda tmp: animate_occupancy(
                run.events, int(run.summary["num_blocks"]), tmp, t_from=t_from, t_to=t_to,
                frames=frames, fps=fps, by_request=by_request,
                end_s=float(run.summary["sim_duration_s"]),
            ),
        )  # fmt: skip
    except KvsimError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(os_error_message(exc))
    except DRAW_ERRORS as exc:
        fail(f"{run_dir}: cannot draw its tables (edited by hand?): {type(exc).__name__}: {exc}")
    say("wrote ", out, f" ({frames} frames)")
    _say_if_still(run, t_from, t_to)


def _say_if_still(run: Any, t_from: float | None, t_to: float | None) -> None:
    """One line when the window holds no event: the frames are one unchanging pool."""
    from kvsim.plots.animation import events_in_window

    lo = 0.0 if t_from is None else t_from
    hi = float(run.summary["sim_duration_s"]) if t_to is None else t_to
    if events_in_window(run.events, lo, hi) == 0:
        say(
            f"no events from {lo:g} s to {hi:g} s: the pool did not change, so every frame "
            f"shows it as it stood at {lo:g} s"
        )


def report_command(
    run_dir: RunDir,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", metavar="FILE", help="HTML file.", show_default="RUN_DIR/report.html"
        ),
    ] = None,
    t_from: FromOption = None,
    t_to: ToOption = None,
    force: ForceOption = False,
) -> None:
    """Write a self-contained report.html: summary, options and every picture."""
    import tempfile

    from kvsim.outputs.report import write_report
    from kvsim.plots import read_pngs, write_pictures
    from kvsim.plots.side_by_side import picture_workers

    _check_out(out, force, run_dir)
    run = _read(run_dir, t_from, t_to, whole_events=False)
    path = out or run_dir / "report.html"
    title = f"kvsim run: {run.path.name} ({run.config.trace})"
    names = None
    if is_fleet(run):  # its own pictures, as kvsim run's report of a fleet (docs/fleet.md)
        names = fleet_names(run, None, t_from, t_to)
        title = f"kvsim fleet: {run.path.name} ({run.config.trace})"
    try:
        if names is not None:
            pngs = fleet_pngs(run)
        else:  # the pictures drawn side by side first (the same bytes the report would draw)
            with tempfile.TemporaryDirectory(prefix="kvsim-report-") as drawn:
                paths = write_pictures(
                    run, Path(drawn), t_from=t_from, t_to=t_to, workers=picture_workers()
                )
                pngs = read_pngs(paths)
        _write_file(
            path, out is None, force, run_dir,
            lambda tmp: write_report(run, tmp, title=title, names=names, t_from=t_from,
                                     t_to=t_to, pngs=pngs),
        )  # fmt: skip
    except KvsimError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(os_error_message(exc))
    except DRAW_ERRORS as exc:
        fail(f"{run_dir}: cannot draw its tables (edited by hand?): {type(exc).__name__}: {exc}")
    say("wrote ", path)


def export_trace_command(
    run_dir: RunDir,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="FILE",
            help="Trace JSON.",
            show_default="RUN_DIR/run.perfetto.json",
        ),
    ] = None,
    t_from: FromOption = None,
    t_to: ToOption = None,
    max_requests: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="N",
            help="Keep only the first N requests in the window.",
            show_default="all",
        ),
    ] = None,
    force: ForceOption = False,
) -> None:
    """Export a Chrome trace-event JSON timeline for ui.perfetto.dev or chrome://tracing."""
    from kvsim.outputs.perfetto import build_trace, validate_trace, write_trace

    _check_out(out, force, run_dir)
    run = _read(run_dir, t_from, t_to)
    _needs_events(run, "kvsim export-trace")
    path = out or run_dir / "run.perfetto.json"
    try:
        doc = build_trace(
            run.events,
            run.steps,
            run.requests,
            t_from=t_from,
            t_to=t_to,
            max_requests=max_requests,
            end_s=float(run.summary["sim_duration_s"]),
        )
        validate_trace(doc)
        _write_file(path, out is None, force, run_dir, lambda tmp: write_trace(doc, tmp))
    except KvsimError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(os_error_message(exc))
    except DRAW_ERRORS as exc:
        fail(f"{run_dir}: cannot build its timeline (edited by hand?): {type(exc).__name__}: {exc}")
    say("wrote ", path, f" ({len(doc['traceEvents']):,} trace events)")


def register(app: typer.Typer) -> None:
    app.command("plot", cls=Command)(plot_command)
    app.command("animate", cls=Command)(animate_command)
    app.command("report", cls=Command)(report_command)
    app.command("export-trace", cls=Command)(export_trace_command)
