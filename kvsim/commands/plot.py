"""``kvsim plot``: a run folder's pictures as PNGs, over any time window.

It reads the run folder and hands off to kvsim.plots; only this edge turns their exceptions
into one red line and exit code 2 (kvsim/commands/run_folder_args.py); animate, report and
export-trace are kvsim/commands/run_exports.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.commands.console import Command, fail, say
from kvsim.commands.fleet_plot import (
    FLEET_PICTURE_NAMES,
    PD_PICTURE_NAMES,
    draw_fleet,
    fleet_names,
    is_fleet,
    skipped_line,
)
from kvsim.commands.run_folder_args import (
    NO_EVENTS_HINT,
    FromOption,
    RunDir,
    ToOption,
    needs_events,
    one_line_errors,
    read_run_window,
    write_file,
)

# The pictures ``kvsim plot`` draws (the keys of kvsim.plots.PICTURES; kept here so that
# ``kvsim --help`` does not import matplotlib).
PICTURE_NAMES = (
    "occupancy", "free-blocks", "kv-breakdown", "gantt", "latency", "batch", "hit-rate",
    "prompt-tokens", "offload-tier", "offload-sources", "offload-ttft", "offload-transfers",
)  # fmt: skip


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
    run = read_run_window(run_dir, t_from, t_to, whole_events=False)
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
            needs_events(run, f"the {name} picture")
    with one_line_errors(run_dir):
        paths = _draw_pictures(run, run_dir, out, names, force, t_from, t_to, fleet)
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


def _same_place(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False


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
            write_file(
                default / path.name,
                True,
                force,
                run_dir,
                lambda tmp, p=path: shutil.copyfile(p, tmp),
            )
    return [default / p.name for p in drawn]


def register(app: typer.Typer) -> None:
    app.command("plot", cls=Command)(plot_command)
