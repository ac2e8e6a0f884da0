"""``kvsim animate``, ``kvsim report``, ``kvsim export-trace``: a run folder as an animation,
a self-contained HTML report, a Perfetto timeline.

Each reads the run folder and hands off to one library function (kvsim.plots.animation,
kvsim.outputs.report, kvsim.outputs.perfetto); only this edge turns their exceptions into one
red line and exit code 2 (kvsim/commands/run_folder_args.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.commands.console import Command, fail, say
from kvsim.commands.fleet_plot import fleet_names, fleet_pngs, is_fleet
from kvsim.commands.run_folder_args import (
    ForceOption,
    FromOption,
    RunDir,
    ToOption,
    check_out,
    needs_events,
    one_line_errors,
    read_run_window,
    write_file,
)


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
    check_out(out, force, run_dir)
    run = read_run_window(run_dir, t_from, t_to)
    needs_events(run, "kvsim animate")
    with one_line_errors(run_dir):
        write_file(
            out, False, force, run_dir,
            lambda tmp: animate_occupancy(
                run.events, int(run.summary["num_blocks"]), tmp, t_from=t_from, t_to=t_to,
                frames=frames, fps=fps, by_request=by_request,
                end_s=float(run.summary["sim_duration_s"]),
            ),
        )  # fmt: skip
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

    check_out(out, force, run_dir)
    run = read_run_window(run_dir, t_from, t_to, whole_events=False)
    path = out or run_dir / "report.html"
    title = f"kvsim run: {run.path.name} ({run.config.trace})"
    names = None
    if is_fleet(run):  # its own pictures, as kvsim run's report of a fleet (docs/fleet.md)
        names = fleet_names(run, None, t_from, t_to)
        title = f"kvsim fleet: {run.path.name} ({run.config.trace})"
    with one_line_errors(run_dir):
        if names is not None:
            pngs = fleet_pngs(run)
        else:  # the pictures drawn side by side first (the same bytes the report would draw)
            with tempfile.TemporaryDirectory(prefix="kvsim-report-") as drawn:
                paths = write_pictures(
                    run, Path(drawn), t_from=t_from, t_to=t_to, workers=picture_workers()
                )
                pngs = read_pngs(paths)
        write_file(
            path, out is None, force, run_dir,
            lambda tmp: write_report(run, tmp, title=title, names=names, t_from=t_from,
                                     t_to=t_to, pngs=pngs),
        )  # fmt: skip
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

    check_out(out, force, run_dir)
    run = read_run_window(run_dir, t_from, t_to)
    needs_events(run, "kvsim export-trace")
    path = out or run_dir / "run.perfetto.json"
    with one_line_errors(run_dir, "build its timeline"):
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
        write_file(path, out is None, force, run_dir, lambda tmp: write_trace(doc, tmp))
    say("wrote ", path, f" ({len(doc['traceEvents']):,} trace events)")


def register(app: typer.Typer) -> None:
    app.command("animate", cls=Command)(animate_command)
    app.command("report", cls=Command)(report_command)
    app.command("export-trace", cls=Command)(export_trace_command)
