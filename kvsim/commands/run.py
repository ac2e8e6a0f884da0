"""``kvsim run``: simulate one trace and write a run folder."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine import EngineError
from kvsim.commands.console import Command, console, fail, say
from kvsim.commands.options import with_run_options
from kvsim.config import RunConfig
from kvsim.errors import KvsimError
from workloads import DEFAULT_TRACE_NAME, WorkloadError

USER_ERRORS = (KvsimError, WorkloadError, EngineError)

Opt = typer.Option


def default_out(trace: str, folder: str = "runs") -> Path:
    """``runs/<trace>-<timestamp>``, with ``-2``, ``-3``, ... if that is taken already."""
    stem = Path(trace).stem or folder.rstrip("s")
    base = Path(folder) / f"{stem}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    out, n = base, 1
    while os.path.lexists(out):
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def out_path(out: str | None, trace: str, folder: str) -> Path:
    """The ``--out`` folder (refusing an empty one), or the default under ``folder``."""
    if out is None:
        return default_out(trace, folder)
    if not out.strip():
        fail("--out is empty: name the folder to write, e.g. --out runs/mine")
    return Path(out)


def os_error_message(exc: OSError) -> str:
    """One line for a file-system error: the file and what went wrong."""
    where = exc.filename if exc.filename is not None else ""
    return f"{where}: {exc.strerror}" if where and exc.strerror else str(exc)


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
        result = _run_and_write(config, out_dir, plots=not no_plots, force=force)
    except USER_ERRORS as exc:
        fail(str(exc))
    except OSError as exc:
        fail(os_error_message(exc))
    _print_summary(result.summary, out_dir)


def _run_and_write(config: RunConfig, out_dir: Path, *, plots: bool, force: bool) -> Any:
    """Run with the events streamed into the temporary run folder (so memory stays bounded),
    write the rest there and swap it into place; a failure or an interrupt leaves nothing."""
    from kvsim.atomic import output_folder
    from kvsim.outputs.run_folder import RUN_FOLDER, write_run_files

    with output_folder(out_dir, RUN_FOLDER, force=force) as tmp:
        result = _run_with_progress(config, tmp / "events.parquet")
        write_run_files(result, tmp, plots=plots)
    return result


def _run_with_progress(config: RunConfig, events_path: Path) -> Any:
    from kvsim.runner import run

    with Progress(
        TextColumn("[bold]simulating[/bold]"),
        BarColumn(),
        TextColumn(
            "{task.fields[sim_s]:>10.1f} s simulated  {task.completed:>8,.0f} requests done"
        ),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("run", total=None, sim_s=0.0)

        def progress(sim_s: float, done: int) -> None:
            bar.update(task, completed=done, sim_s=sim_s)

        return run(config, progress, events_path)


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}{unit}"
    return f"{value:,}{unit}"


def _print_summary(s: dict[str, Any], out_dir: Path) -> None:
    from kvsim.analysis.kv_breakdown import SUMMARY_FIELDS as BREAKDOWN_FIELDS

    table = Table(title="kvsim run", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("requests (finished / rejected / aborted)",
         f"{s['num_requests']:,} ({s['num_finished']:,} / {s['num_rejected']:,} / "
         f"{s['num_aborted']:,})"),
        ("KV pool", f"{s['num_blocks']:,} blocks x {s['block_size']} tokens"),
        ("simulated time", _fmt(s["sim_duration_s"], " s")),
        ("throughput", f"{s['throughput_requests_per_s']:.2f} req/s, "
                       f"{s['throughput_output_tokens_per_s']:,.0f} output tok/s"),
        ("TTFT p50 / p99", f"{_fmt(s['ttft_s']['p50'])} / {_fmt(s['ttft_s']['p99'])} s"),
        ("TPOT p50 / p99", f"{_fmt(s['tpot_s']['p50'])} / {_fmt(s['tpot_s']['p99'])} s"),
        ("end-to-end p50 / p99",
         f"{_fmt(s['e2e_latency_s']['p50'])} / {_fmt(s['e2e_latency_s']['p99'])} s"),
        ("KV usage mean / peak", f"{s['kv_usage_mean']:.1%} / {s['kv_usage_peak']:.1%}"),
        ("internal fragmentation (mean)", f"{s['internal_fragmentation_mean']:.2%}"),
        ("KV tokens / reserved / int. / ext. frag / free",
         " / ".join(f"{s[k]:.1%}" for k in BREAKDOWN_FIELDS)),
        ("preemptions", f"{s['num_preemptions']:,}"),
        ("mean running sequences", f"{s['mean_running_seqs']:.1f}"),
        ("simulator wall time",
         f"{s['wall_time_s']:.2f} s ({s['sim_steps_per_wall_s']:,.0f} steps/s)"),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    say("run folder: ", out_dir)


def register(app: typer.Typer) -> None:
    app.command("run", cls=Command)(run_command)
