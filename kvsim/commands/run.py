"""``kvsim run``: simulate one trace and write a run folder."""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine import EngineError
from kvsim.commands.console import console, fail
from kvsim.commands.options import with_run_options
from kvsim.config import RunConfig
from kvsim.errors import KvsimError
from workloads import DEFAULT_TRACE_NAME, WorkloadError

USER_ERRORS = (KvsimError, WorkloadError, EngineError)

Opt = typer.Option


def default_out(trace: str) -> Path:
    stem = Path(trace).stem or "run"
    return Path("runs") / f"{stem}-{dt.datetime.now():%Y%m%d-%H%M%S}"


@with_run_options("run")
def run_command(
    trace: Annotated[
        str | None,
        typer.Argument(
            help="Trace file (.json/.jsonl/.csv) or shipped trace name",
            show_default=DEFAULT_TRACE_NAME,
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        Opt("--config", help="Re-run a run folder's config.json (other options override it)"),
    ] = None,
    options: dict[str, Any] | None = None,
    gpu_spec: Annotated[
        Path | None, Opt(help="GPU spec JSON file instead of a preset (same as --gpu FILE)")
    ] = None,
    out: Annotated[
        Path | None, Opt(help="Run folder", show_default="runs/<trace>-<timestamp>")
    ] = None,
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
        out_dir = out or default_out(config.trace)
        result = _run_and_write(config, out_dir, plots=not no_plots)
    except USER_ERRORS as exc:
        fail(str(exc))
    _print_summary(result.summary, out_dir)


def _run_and_write(config: RunConfig, out_dir: Path, *, plots: bool) -> Any:
    """Run with the events streamed to a temporary file beside the run folder (so memory stays
    bounded), then write the folder; the temporary file never outlives a failure."""
    from kvsim.outputs.run_folder import write_run

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out_dir.name}.events-", suffix=".parquet",
                                dir=out_dir.parent)  # fmt: skip
    os.close(fd)
    events_path = Path(name)
    try:
        result = _run_with_progress(config, events_path)
        write_run(result, out_dir, plots=plots)
    finally:
        events_path.unlink(missing_ok=True)
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
    console.print(f"run folder: [bold]{out_dir}[/bold]")


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
