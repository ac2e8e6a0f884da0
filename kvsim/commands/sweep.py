"""``kvsim sweep``: one run per point of a grid over run options, and a sweep report."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.commands.console import Command, console, fail, plain, say
from kvsim.commands.options import with_run_options
from kvsim.commands.run import os_error_message, out_path, user_errors
from kvsim.config import RunConfig
from workloads import DEFAULT_TRACE_NAME

Opt = typer.Option


@with_run_options("sweep")
def sweep_command(
    trace: Annotated[
        str | None,
        typer.Argument(
            metavar="TRACE",
            help="Trace file or shipped trace name",
            show_default=DEFAULT_TRACE_NAME,
        ),
    ] = None,
    param: Annotated[
        list[str] | None,
        Opt(
            metavar="NAME=V1,V2,...",
            help="Sweep any run option (repeatable), e.g. max_num_seqs=64,128",
        ),
    ] = None,
    kv_slots: Annotated[
        str | None,
        Opt(
            help="KV capacity in tokens, the same bytes at every block size (num_blocks = "
            "slots / block size); a comma list sweeps it, e.g. 100000,400000",
            metavar="TOKENS,...",
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        Opt("--config", metavar="FILE", help="Base run options from a run folder's config.json"),
    ] = None,
    options: dict[str, Any] | None = None,
    slo_ttft: Annotated[
        float | None, Opt(help="Rate sweep SLO: TTFT bound", metavar="SECONDS")
    ] = None,
    slo_tpot: Annotated[
        float | None, Opt(help="Rate sweep SLO: TPOT bound", metavar="SECONDS")
    ] = None,
    slo_percentile: Annotated[
        int, Opt(metavar="50|90|99", help="Percentile the SLO applies to")
    ] = 99,
    jobs: Annotated[
        int | None, Opt(metavar="N", help="Parallel points", show_default="the CPU count")
    ] = None,
    executor: Annotated[
        str, Opt(metavar="NAME", help="process (local pool), serial, or ray")
    ] = "process",
    address: Annotated[
        str | None,
        Opt(metavar="HOST:PORT", help="Ray cluster address", show_default="a local Ray"),
    ] = None,
    out: Annotated[
        str | None,
        Opt(
            help="Sweep folder to create (an existing one only with --force)",
            metavar="DIR",
            show_default="sweeps/<trace>-<timestamp>",
        ),
    ] = None,
    force: Annotated[
        bool, Opt("--force", help="Replace the --out folder if it holds an earlier kvsim sweep")
    ] = False,
    events: Annotated[
        bool,
        Opt(
            "--events/--no-events",
            help="Write each point's events.parquet (off by default: a block-size-1 point "
            "has tens of millions of event rows; rerun a point with kvsim run --config to "
            "get its events)",
        ),
    ] = False,
    dry_run: Annotated[
        bool, Opt("--dry-run", help="List the points and the reproduce command; run nothing")
    ] = False,
) -> None:
    """Run one simulation per point of a grid over run options; write sweep.csv and a report."""
    from kvsim.sweep.spec import AXIS_OPTIONS, KV_SLOTS, make_spec, parse_param, parse_values

    given = dict(options or {})
    axis_values = {name: given.pop(name) for name in AXIS_OPTIONS if name in given}
    if trace is not None:
        given["trace"] = trace
    try:
        if config_file is not None:
            base = RunConfig.load(config_file).replace(**given)
        else:
            base = RunConfig(**{"trace": DEFAULT_TRACE_NAME, **given})
        axes = [(n, parse_values(n, v)) for n, v in axis_values.items() if v]
        if kv_slots is not None:
            axes.append((KV_SLOTS, parse_values(KV_SLOTS, kv_slots)))
        axes += [parse_param(p) for p in param or []]
        spec = make_spec(
            base,
            axes,
            slo_ttft_s=slo_ttft,
            slo_tpot_s=slo_tpot,
            slo_percentile=slo_percentile,
            events=events,
        )
        if dry_run:
            _print_points(spec)
            return
        out_dir = out_path(out, base.trace, "sweeps")
        result = _run_with_progress(spec, out_dir, executor, jobs, address, force)
    except user_errors() as exc:
        fail(str(exc))
    except OSError as exc:
        fail(os_error_message(exc))
    console.print(
        f"{len(result.table)} points in {result.wall_s:.1f} s, {result.num_failed} failed"
    )
    say("sweep folder: ", out_dir, " (report.html, report.md, sweep.csv)")
    say("reproduce: ", shlex.join(result.command))
    if result.report_error:
        say("the report failed: ", result.report_error, style="red")
    if result.num_failed or result.report_error:
        raise typer.Exit(1)  # the sweep folder is written; some points (or the report) failed


def _print_points(spec: Any) -> None:
    from rich.table import Table

    from kvsim.sweep.spec import command_line

    table = Table(title=f"kvsim sweep: {spec.num_points} points", header_style="bold")
    for column in ("#", "point", "block size", "KV blocks"):
        table.add_column(column)
    for p in spec.points():
        blocks = "planned" if p.config.num_blocks is None else f"{p.config.num_blocks:,}"
        table.add_row(str(p.index), plain(p.label), str(p.config.block_size), blocks)
    console.print(table)
    say("reproduce: ", shlex.join(command_line(spec)))


def _run_with_progress(
    spec: Any, out: Path, executor: str, jobs: int | None, address: str | None, force: bool
) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from kvsim.sweep.execute import PointOutcome, run_sweep

    with Progress(
        TextColumn("[bold]sweep[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("points  {task.fields[failed]} failed  {task.fields[last]}", markup=False),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # nothing on stdout but the results when piped
    ) as bar:
        task = bar.add_task("sweep", total=spec.num_points, failed=0, last="")
        failed = 0

        def on_point(outcome: PointOutcome) -> None:
            nonlocal failed
            failed += not outcome.ok
            label = outcome.row.get("label", "")
            bar.update(task, advance=1, failed=failed, last=f"done: {label}")
            if not outcome.ok:
                say(f"point {label} failed: {outcome.error}", style="red")

        return run_sweep(
            spec, out, executor=executor, jobs=jobs, address=address, on_point=on_point,
            force=force,
        )  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("sweep", cls=Command)(sweep_command)
