"""``kvsim sweep``: one run per point of a grid over run options, and a sweep report."""

from __future__ import annotations

import inspect
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
    slo: Annotated[
        str | None,
        Opt(
            metavar="METRIC_PN=DURATION,...",
            help="SLOs a point must meet to be recommended, e.g. ttft_p99=2s,tpot_p99=100ms "
            "(metrics ttft, tpot; one percentile)",
            show_default="ttft_p99=2s,tpot_p99=200ms",
        ),
    ] = None,
    objective: Annotated[
        str,
        Opt(
            metavar="NAME",
            help="What the recommendation optimises among the points meeting the SLOs: "
            "normalized_latency (lowest) or throughput (highest)",
        ),
    ] = "normalized_latency",
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
    metric: Annotated[
        str,
        Opt(
            metavar="NAME",
            help="latency: one run per point, compared at each rate; capacity: search each "
            "configuration for the highest --rate it serves within the SLOs (bisection "
            "over runs; --rate, if given, is where the search starts)",
        ),
    ] = "latency",
    tolerance: Annotated[
        float,
        Opt(
            metavar="SHARE",
            help="--metric capacity: stop when the rates that meet and miss the SLOs are "
            "within this share of each other",
        ),
    ] = 0.05,
) -> None:
    """Run one simulation per point of a grid over run options; write sweep.csv and
    report.html, and print the recommendation (--metric capacity: the highest rate each
    configuration serves within the SLOs)."""
    from kvsim.sweep.slo import parse_slo
    from kvsim.sweep.spec import (
        AXIS_OPTIONS,
        KV_SLOTS,
        SweepError,
        make_spec,
        parse_param,
        parse_values,
    )

    given = dict(options or {})
    axis_values = {name: given.pop(name) for name in AXIS_OPTIONS if name in given}
    if trace is not None:
        given["trace"] = trace
    try:
        if config_file is not None:
            base = RunConfig.load(config_file).replace(**given)
        else:
            base = RunConfig(**{"trace": DEFAULT_TRACE_NAME, **given})
        # an empty --block-size '' is refused (parse_values), not taken for "not given"
        axes = [(n, parse_values(n, v)) for n, v in axis_values.items() if v is not None]
        if kv_slots is not None:
            axes.append((KV_SLOTS, parse_values(KV_SLOTS, kv_slots)))
        axes += [parse_param(p) for p in param or []]
        bounds: dict[str, Any] = {
            "slo_ttft_s": slo_ttft, "slo_tpot_s": slo_tpot, "slo_percentile": slo_percentile,
        }  # fmt: skip
        if slo is not None:
            if slo_ttft is not None or slo_tpot is not None:
                raise SweepError("give --slo or --slo-ttft / --slo-tpot, not both")
            bounds = parse_slo(slo)
        spec = make_spec(base, axes, events=events, objective=objective, **bounds)
        if metric not in ("latency", "capacity"):
            raise SweepError(f"--metric must be latency or capacity, got {metric!r}")
        _check_contexts(spec)
        if dry_run:
            _print_points(spec, metric)
            return
        if metric == "capacity":
            from kvsim.commands.capacity import run_capacity

            out_dir = out_path(out, base.trace, "capacity")
            run_capacity(spec, out_dir, executor, jobs, address, force, tolerance)
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
    _print_result(result)
    say("sweep folder: ", out_dir, " (report.html, report.md, sweep.csv)")
    say("reproduce: ", shlex.join(result.command))
    if result.report_error:
        say("the report failed: ", result.report_error, style="red")
    if result.num_failed or result.report_error:
        raise typer.Exit(1)  # the sweep folder is written; some points (or the report) failed


def _check_contexts(spec: Any) -> None:
    """A point whose --max-model-len is past its model's context is refused before any point
    runs, as kvsim run refuses it (vLLM too, without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)."""
    from kvsim.costmodel import CostModelError, resolve_model
    from kvsim.option_spec import ConfigError
    from kvsim.runner import resolve_max_model_len
    from kvsim.sweep.spec import SweepError

    contexts: dict[str, int | None] = {}
    for point in spec.points():
        config = point.config
        if config.max_model_len is None or config.allow_long_max_model_len:
            continue
        if config.model not in contexts:
            try:
                contexts[config.model] = resolve_model(config.model).max_model_len
            except CostModelError:  # the point itself says what is wrong with its model
                contexts[config.model] = None
        try:
            resolve_max_model_len(config, contexts[config.model], [])
        except ConfigError as exc:
            where = f"point {point.label}: " if point.values else ""
            raise SweepError(f"{where}{exc}") from None


def _print_points(spec: Any, metric: str = "latency") -> None:
    from rich.table import Table

    from kvsim.sweep.spec import command_line

    table = Table(title=f"kvsim sweep: {spec.num_points} points", header_style="bold")
    for column in ("#", "point", "block size", "KV blocks"):
        table.add_column(column)
    for p in spec.points():
        blocks = "planned" if p.config.num_blocks is None else f"{p.config.num_blocks:,}"
        table.add_row(str(p.index), plain(p.label), str(p.config.block_size), blocks)
    console.print(table)
    extra = ["--metric", "capacity"] if metric == "capacity" else []
    say("reproduce: ", shlex.join([*command_line(spec), *extra]))


def _print_result(result: Any) -> None:
    """The table's key columns, then the recommendation per offered load and why each other
    point lost: what report.md says first (user text verbatim)."""
    from rich import box
    from rich.table import Table

    from kvsim.sweep.compare import recommendations, value_text
    from kvsim.sweep.slo import bounds, slo_text

    spec, frame = result.spec, result.table
    table = Table(
        title=f"SLO: {slo_text(spec)}", header_style="bold", title_justify="left",
        box=box.SIMPLE_HEAD,
    )  # fmt: skip
    measures = [
        ("load", "saturation", "{}"),
        *((b.name, b.column, "s") for b in bounds(spec)),
        ("s/token", "normalized_latency_s_per_token", "{:.4f}"),
        ("tok/s", "throughput_output_tokens_per_s", "{:,.0f}"),
    ]
    table.add_column("#", justify="right")
    for name in spec.axis_names:  # one column per swept option: the label, unbroken
        longest = max([len(name), *(len(value_text(name, v)) for v in frame[name])])
        table.add_column(plain(name), overflow="fold", min_width=min(longest, 24))
    table.add_column("SLO", overflow="fold", min_width=6)
    for name, column, _ in measures:
        table.add_column(name, justify="left" if column == "saturation" else "right", no_wrap=True)
    for _, row in frame.iterrows():
        status = str(row["status"])
        if status == "ok":
            status = "met" if row.get("slo_met") else "missed"
        cells = [str(row["point"]), *(plain(value_text(a, row[a])) for a in spec.axis_names)]
        cells.append(plain(status))
        cells += [_cell(row.get(column), fmt) for _, column, fmt in measures]
        table.add_row(*cells)
    console.print(table)
    for r in recommendations(frame, spec, spec.objective):
        say(r.sentence, style="bold")
        for name, why in r.lost:
            say("  ", name, ": ", why)
    from kvsim.sweep.offload_advice import TABLE_HEAD, table_rows, tier_advice

    for advice in tier_advice(frame, spec):  # a kv_offloading_size axis (docs/sweeps.md)
        say(advice.sentence, style="bold")
        for row in table_rows(advice):
            say("  ", plain(", ".join(f"{h} {c}" for h, c in zip(TABLE_HEAD, row, strict=True))))


def _cell(value: Any, fmt: str | None) -> str:
    import math

    from kvsim.sweep.slo import seconds_text

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "s":
        return seconds_text(float(value))
    if value == "near saturation":
        return "near sat."
    return plain(fmt.format(value) if fmt else value)


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


def capacity_command(**kwargs: Any) -> None:
    sweep_command(**kwargs)


def _capacity_signature() -> inspect.Signature:
    """``kvsim sweep``'s parameters with ``--metric capacity`` the default."""
    signature = inspect.signature(sweep_command)
    return signature.replace(
        parameters=[
            p.replace(default="capacity") if p.name == "metric" else p
            for p in signature.parameters.values()
        ]
    )


capacity_command.__signature__ = _capacity_signature()  # type: ignore[attr-defined]
capacity_command.__doc__ = (
    "Find the highest arrival rate (--rate: the trace rescaled) each configuration of a grid "
    "serves within the SLOs, by bisection over runs (kvsim sweep --metric capacity)."
)


def register(app: typer.Typer) -> None:
    app.command("sweep", cls=Command)(sweep_command)
    app.command("capacity", cls=Command)(capacity_command)
