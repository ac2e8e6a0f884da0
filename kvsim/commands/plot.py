"""Picture commands over a run folder: ``kvsim plot``, ``kvsim animate``, ``kvsim report``,
``kvsim export-trace``.

Each reads the run folder and hands off to one library function (kvsim.plots,
kvsim.plots.animation, kvsim.outputs.report, kvsim.outputs.perfetto); only this edge turns their
exceptions into one red line and exit code 2.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.commands.console import console, fail
from kvsim.errors import KvsimError

RunDir = Annotated[Path, typer.Argument(help="A run folder written by kvsim run.")]
FromOption = Annotated[
    float | None, typer.Option("--from", help="Start of the time window (simulated s).")
]
ToOption = Annotated[
    float | None, typer.Option("--to", help="End of the time window (simulated s).")
]


class Picture(str, Enum):
    """Pictures ``kvsim plot`` draws (the keys of kvsim.plots.PICTURES)."""

    OCCUPANCY = "occupancy"
    FREE_BLOCKS = "free-blocks"
    KV_BREAKDOWN = "kv-breakdown"
    GANTT = "gantt"
    LATENCY = "latency"
    BATCH = "batch"


def _read(run_dir: Path, t_from: float | None, t_to: float | None) -> Any:
    """The run folder, after checking the window; any problem is one red line."""
    if t_from is not None and t_to is not None and t_to <= t_from:
        fail(f"--to ({t_to}) must be later than --from ({t_from})")
    if t_from is not None and t_from < 0:
        fail(f"--from must be >= 0, got {t_from}")
    from kvsim.outputs.run_folder import read_run

    try:
        return read_run(run_dir)
    except (KvsimError, OSError, ValueError) as exc:
        fail(str(exc))


def plot_command(
    run_dir: RunDir,
    what: Annotated[
        list[Picture] | None,
        typer.Option("--what", "-w", help="Picture to draw, repeat for several (default: all)."),
    ] = None,
    t_from: FromOption = None,
    t_to: ToOption = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Folder for the PNGs (default: RUN_DIR/plots)."),
    ] = None,
) -> None:
    """Draw pictures of a run as PNGs: occupancy map, free blocks, KV breakdown, Gantt chart,
    latency CDFs, batch size.

    Reads RUN_DIR's tables, so any picture can be redrawn over any time window."""
    from kvsim.plots import write_pictures

    run = _read(run_dir, t_from, t_to)
    names = [w.value for w in what] if what else None
    try:
        paths = write_pictures(run, out or run_dir / "plots", names, t_from=t_from, t_to=t_to)
    except (KvsimError, OSError) as exc:
        fail(str(exc))
    for path in paths:
        console.print(f"wrote [bold]{path}[/bold]")


def animate_command(
    run_dir: RunDir,
    out: Annotated[Path, typer.Option("--out", "-o", help="blocks.gif, or .mp4 (needs ffmpeg).")],
    t_from: FromOption = None,
    t_to: ToOption = None,
    frames: Annotated[int, typer.Option(help="Frames, evenly spaced over the window.")] = 60,
    fps: Annotated[int, typer.Option(min=1, max=60, help="Frames per second.")] = 10,
    by_request: Annotated[
        bool | None,
        typer.Option(
            "--by-request/--by-state",
            help="Colour blocks by owning request or by "
            "state (default: by request up to 1,024 blocks).",
        ),
    ] = None,
) -> None:
    """Animate the block pool over a time window."""
    from kvsim.plots.animation import animate_occupancy

    run = _read(run_dir, t_from, t_to)
    try:
        animate_occupancy(
            run.events,
            int(run.summary["num_blocks"]),
            out,
            t_from=t_from,
            t_to=t_to,
            frames=frames,
            fps=fps,
            by_request=by_request,
            end_s=float(run.summary["sim_duration_s"]),
        )
    except (KvsimError, OSError) as exc:
        fail(str(exc))
    console.print(f"wrote [bold]{out}[/bold] ({frames} frames)")


def report_command(
    run_dir: RunDir,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="HTML file (default: RUN_DIR/report.html).")
    ] = None,
    t_from: FromOption = None,
    t_to: ToOption = None,
) -> None:
    """Write a self-contained report.html: summary, options and every picture."""
    from kvsim.outputs.report import write_report

    run = _read(run_dir, t_from, t_to)
    path = out or run_dir / "report.html"
    title = f"kvsim run: {run.path.name} ({run.config.trace})"
    try:
        write_report(run, path, title=title, t_from=t_from, t_to=t_to)
    except (KvsimError, OSError) as exc:
        fail(str(exc))
    console.print(f"wrote [bold]{path}[/bold]")


def export_trace_command(
    run_dir: RunDir,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Trace JSON (default: RUN_DIR/run.perfetto.json)."),
    ] = None,
    t_from: FromOption = None,
    t_to: ToOption = None,
    max_requests: Annotated[
        int | None, typer.Option(min=1, help="Keep only the first N requests in the window.")
    ] = None,
) -> None:
    """Export a Chrome trace-event JSON timeline for ui.perfetto.dev or chrome://tracing."""
    from kvsim.outputs.perfetto import build_trace, validate_trace, write_trace

    run = _read(run_dir, t_from, t_to)
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
        write_trace(doc, path)
    except (KvsimError, OSError, ValueError) as exc:
        fail(str(exc))
    console.print(f"wrote [bold]{path}[/bold] ({len(doc['traceEvents']):,} trace events)")


def register(app: typer.Typer) -> None:
    app.command("plot")(plot_command)
    app.command("animate")(animate_command)
    app.command("report")(report_command)
    app.command("export-trace")(export_trace_command)
