"""Engine-mode calibration commands: ``kvsim profile --mode engine`` (time the torch engine into a
profile folder) and ``kvsim validate-run`` (engine mode against calibrated cost mode on a trace).

Each hands off to one library function (kvsim.sim.engine_profile, kvsim.outputs.validate_run);
only this edge turns their exceptions into one red line and exit code 2.
"""

from __future__ import annotations

import datetime as dt
import enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kvsim.commands.console import Command, console, fail, say
from kvsim.commands.options import with_run_options
from kvsim.commands.run import os_error_message, user_errors
from kvsim.config import DEFAULT_THREADS, RunConfig
from workloads import DEFAULT_TRACE_NAME

Opt = typer.Option


class Timer(str, enum.Enum):
    """How engine steps are timed (kvsim.sim.engine_timing.CLOCKS)."""

    WALL = "wall"
    THREAD = "thread"


TimerOption = Annotated[
    Timer,
    Opt(metavar="[wall|thread]",
        help="wall: the wall clock (engine mode's); thread: the thread's CPU time, which other "
        "processes taking the core cannot inflate (needs --threads 1)"),
]  # fmt: skip


class ProfileMode(str, enum.Enum):
    """What ``kvsim profile`` measures (GPU kernel profiles come from Vidur: profiles/vidur)."""

    ENGINE = "engine"


def profile_command(
    mode: Annotated[
        ProfileMode, Opt(metavar="[engine]", help="engine: the torch engine on this machine")
    ] = (ProfileMode.ENGINE),
    model: Annotated[
        str, Opt(metavar="NAME|DIR", help="Engine model preset or checkpoint folder")
    ] = "tiny-llama",
    out: Annotated[
        Path | None,
        Opt(
            "-o",
            "--out",
            metavar="DIR",
            help="Profile folder to write",
            show_default="profiles/engine-MODEL-TIMESTAMP",
        ),
    ] = None,
    threads: Annotated[
        int, Opt(min=1, metavar="THREADS", help="torch threads, pinned")
    ] = DEFAULT_THREADS,
    repeats: Annotated[
        int, Opt(min=3, metavar="N", help="Timed calls per point (medians fitted)")
    ] = 15,
    dtype: Annotated[str, Opt(metavar="DTYPE", help="float32 or bfloat16")] = "float32",
    quick: Annotated[bool, Opt("--quick", help="A small grid (a smoke test, not a fit)")] = False,
    timer: TimerOption = Timer.WALL,
    force: Annotated[bool, Opt("--force", help="Replace an existing folder")] = False,
) -> None:
    """Time the torch engine into a profile folder that kvsim calibrate fits.

    Operators, paged attention and whole steps over a grid of token counts, batches, contexts,
    chunks and block sizes; prints how noisy the machine was."""
    from kvsim.sim.engine_profile import QUICK_GRID, EngineProfileGrid, write_engine_profile

    if dtype not in ("float32", "bfloat16"):
        fail(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    out_dir = (
        out or Path("profiles") / f"engine-{Path(model).name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    )
    if out_dir.exists() and not force:
        fail(f"{out_dir}: already exists; pass --force to replace it")
    grid = QUICK_GRID if quick else EngineProfileGrid()
    with console.status(f"profiling {model} on {mode.value} ({threads} thread(s))"):
        try:
            record = write_engine_profile(
                out_dir, model, threads=threads, repeats=repeats, dtype=dtype, grid=grid,
                timer=timer.value, force=force,
            )  # fmt: skip
        except user_errors(ValueError) as exc:
            fail(f"profile {model!r}: {exc}")
        except OSError as exc:
            fail(os_error_message(exc))
    noise = record["noise"]
    table = Table(title=f"kvsim profile ({record['seconds']} s)", header_style="bold")
    table.add_column("noise")
    table.add_column("value", justify="right")
    for kind, value in noise["spread_by_file"].items():
        table.add_row(f"{kind}: median (p90 - p10) / median", f"{value:.1%}")
    for key, value in noise["peak_drift"].items():
        table.add_row(f"drift of {key} over the run", f"{value:+.1%}")
    table.add_row("load average before / after", f"{record['load_average']['before'][0]} / "
                  f"{record['load_average']['after'][0]}")  # fmt: skip
    console.print(table)
    from kvsim.costmodel.calibrate import noise_refusal

    reason = noise_refusal(record)
    if reason:
        say(f"warning: {reason}: kvsim calibrate will refuse it", style="yellow")
    device = out_dir / "device.json"
    say(f"wrote {out_dir}; next: kvsim calibrate {out_dir} --gpu {device} -o cpu.json")


# validate-run runs the trace in both modes (no --mode), on the engine's tiny model by default.
VALIDATE_RUN_DEFAULTS = {"model": "tiny-llama"}


@with_run_options("run", leave_out=("mode",), defaults=VALIDATE_RUN_DEFAULTS)
def validate_run_command(
    trace: Annotated[
        str | None,
        typer.Argument(
            metavar="[TRACE]",
            help="Trace file or shipped trace name (held out of the fit)",
            show_default=DEFAULT_TRACE_NAME,
        ),
    ] = None,
    options: dict[str, Any] | None = None,
    out: Annotated[
        Path | None,
        Opt(metavar="DIR", help="Output folder", show_default="validation/run-TRACE-TIMESTAMP"),
    ] = None,
    force: Annotated[bool, Opt("--force", help="Replace an existing folder")] = False,
    timer: TimerOption = Timer.WALL,
) -> None:
    """Compare engine mode with calibrated cost mode on one trace.

    Cost mode uses --coefficients (a cpu fit) on --gpu (the engine profile's device.json);
    reports step-time MAPE, throughput and TTFT/TPOT error, with plots."""
    from kvsim.atomic import check_target
    from kvsim.costmodel import load_coefficients, resolve_gpu
    from kvsim.outputs.validate_run import VALIDATE_RUN_FOLDER, compare_runs, write_comparison

    given = dict(options or {})
    if trace is not None:
        given["trace"] = trace
    try:
        config = RunConfig(**{"trace": DEFAULT_TRACE_NAME, **VALIDATE_RUN_DEFAULTS, **given})
        if config.coefficients is None:
            fail("pass --coefficients FILE: a cpu fit (kvsim calibrate PROFILE --gpu DEVICE.json)")
        out_dir = (
            out
            or Path("validation")
            / f"run-{Path(config.trace).stem}-{dt.datetime.now():%Y%m%d-%H%M%S}"
        )
        check_target(out_dir, VALIDATE_RUN_FOLDER, force=force)  # before the runs, not after
        coefficients = load_coefficients(config.coefficients)
        gpu = resolve_gpu(config.gpu)
        with console.status("engine mode, then cost mode"):
            comparison = compare_runs(config, gpu, coefficients, timer.value)
        write_comparison(comparison, out_dir, force=force)
    except user_errors(ValueError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(os_error_message(exc))
    _print_comparison(comparison.summary)
    say(f"wrote {out_dir}")


def _print_comparison(summary: dict[str, Any]) -> None:
    table = Table(title="kvsim validate-run: cost mode vs engine mode", header_style="bold")
    for column in ("figure", "engine", "cost", "error"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    table.add_row("step time MAPE (engine steps priced)", "", "",
                  f"{summary['step_time_mape_pct']:.2f}%")  # fmt: skip
    for key, engine in summary["engine"].items():
        error = summary["relative_error"].get(key)
        table.add_row(
            key, f"{engine:.4g}", f"{summary['cost'][key]:.4g}",
            "-" if error is None else f"{error:+.2%}",
        )  # fmt: skip
    console.print(table)
    for row in summary["step_time_by_kind"]:
        console.print(f"  {row['kind']}: {row['rows']} steps, MAPE {row['mape_pct']}%, "
                      f"worst {row['worst_pct']}%")  # fmt: skip
    load = summary["load_average"]
    console.print(f"  load average before / after: {load['before'][0]} / {load['after'][0]}; "
                  f"timer {summary['timer']}, {summary['threads']} thread(s)")  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("profile", cls=Command)(profile_command)
    app.command("validate-run", cls=Command)(validate_run_command)
