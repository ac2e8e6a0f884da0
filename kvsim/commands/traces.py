"""Trace commands: ``kvsim gen``, ``kvsim import``, ``kvsim info``.

Each command hands off to one workloads function; only this edge turns the library's
exceptions into one red line and exit code 2.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from kvsim.commands import gen_sessions as sessions_cli
from kvsim.commands.console import Command, console, fail, plain, say
from kvsim.errors import KvsimError

# Only what the commands' signatures and help need at import time: generating, importing and
# reading traces (numpy, the importers) load in the command that runs (bench_cli.py).
from workloads import DEFAULT_TRACE_NAME, WorkloadError, resolve_trace, shipped_trace_names
from workloads.arrivals import ArrivalKind, ArrivalProcess
from workloads.lengths import SPEC_HELP

if TYPE_CHECKING:
    from workloads import ImportResult

_DEFAULT_LENGTHS = "trace:azure_llm_2023_conv"  # real, paired prompt/output lengths


class ImportFormat(str, Enum):
    """Public trace formats ``kvsim import`` reads (the keys of workloads.IMPORTERS)."""

    AZURE = "azure"
    MOONCAKE = "mooncake"
    LENGTHS = "lengths"
    BURSTGPT = "burstgpt"


OutOption = Annotated[
    Path,
    typer.Option("-o", "--out", metavar="FILE", help="Trace file to write: .jsonl, .json or .csv."),
]
RateOption = Annotated[
    float | None, typer.Option(metavar="REQ/S", help="Mean arrival rate, requests/s (required).")
]
ArrivalOption = Annotated[
    ArrivalKind | None,
    typer.Option(
        help="Inter-arrival distribution: poisson (exponential gaps) or gamma.",
        show_default="poisson",
    ),
]
CvOption = Annotated[
    float | None,
    typer.Option(
        metavar="CV",
        help="Gamma inter-arrival CV (std/mean): 1 like Poisson, > 1 bursty.",
        show_default="1",
    ),
]
SeedOption = Annotated[
    int | None, typer.Option(metavar="INT", help="Random seed.", show_default="0")
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="Replace FILE if it is a trace kvsim wrote.")
]


@contextlib.contextmanager
def _bad_input() -> Iterator[None]:
    """Turn bad-input exceptions into one red line and exit code 2."""
    try:
        yield
    except (WorkloadError, KvsimError) as err:
        fail(str(err))
    except OSError as err:
        from kvsim.commands.run import os_error_message

        fail(os_error_message(err))


def _check_out(path: Path, force: bool, inputs: tuple[Path, ...] = ()) -> None:
    """Refuse, before any work, an output with the wrong suffix, the command's own input, or
    an existing file kvsim cannot prove it wrote (kvsim.atomic.output_file)."""
    from kvsim.atomic import check_output_file
    from workloads.formats import TRACE_SUFFIXES

    if path.suffix.lower() not in TRACE_SUFFIXES:
        fail(f"{path}: unsupported file extension; use {', '.join(TRACE_SUFFIXES)}")
    with _bad_input():
        check_output_file(path, force=force, inputs=inputs)


def _save(trace: Any, out: Path, force: bool, inputs: tuple[Path, ...] = ()) -> None:
    """Write ``trace`` to ``out`` by kvsim's one output rule (kvsim.atomic.output_file)."""
    from kvsim.atomic import output_file
    from workloads import save_trace

    with output_file(out, force=force, inputs=inputs) as tmp:
        save_trace(trace, tmp)


def _spec_files(*specs: str | None) -> tuple[Path, ...]:
    """The trace files that ``trace:FILE`` length SPECs read (a generator's inputs)."""
    return tuple(Path(s[len("trace:") :]) for s in specs if s and s.startswith("trace:"))


def gen(
    out: OutOption,
    rate: RateOption = None,
    arrival: ArrivalOption = None,
    cv: CvOption = None,
    duration: Annotated[
        float | None,
        typer.Option(metavar="SECONDS", help="Generate all arrivals in this many seconds."),
    ] = None,
    num_requests: Annotated[
        int | None, typer.Option(metavar="N", help="Generate exactly N requests.")
    ] = None,
    prompt: Annotated[
        str | None,
        typer.Option(
            metavar="SPEC",
            help=f"Prompt length SPEC: {SPEC_HELP}.",
            show_default=_DEFAULT_LENGTHS,
        ),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option(
            metavar="SPEC",
            help="Output length SPEC, same syntax as --prompt.",
            show_default=_DEFAULT_LENGTHS,
        ),
    ] = None,
    seed: SeedOption = None,
    name: Annotated[
        str | None, typer.Option(metavar="NAME", help="Trace name.", show_default="the file stem")
    ] = None,
    force: ForceOption = False,
    sessions: sessions_cli.Sessions = None,
    session_rate: sessions_cli.SessionRate = None,
    turns: sessions_cli.Turns = None,
    agent_types: sessions_cli.AgentTypes = None,
    system_prompt: sessions_cli.SystemPrompt = None,
    user_tokens: sessions_cli.UserTokens = None,
    output_tokens: sessions_cli.OutputTokens = None,
    think_time: sessions_cli.ThinkTime = None,
    tool_call_prob: sessions_cli.ToolCallProb = None,
    tool_calls: sessions_cli.ToolCalls = None,
    tool_result_tokens: sessions_cli.ToolResultTokens = None,
    tool_call_tokens: sessions_cli.ToolCallTokens = None,
    tool_time: sessions_cli.ToolTime = None,
    est_ttft: sessions_cli.EstTtft = None,
    est_tpot: sessions_cli.EstTpot = None,
    max_context: sessions_cli.MaxContext = None,
    hash_block_size: sessions_cli.HashBlockSize = None,
) -> None:
    """Write a synthetic trace: seeded arrivals (poisson or gamma) and token lengths from SPECs,
    or with --sessions agentic multi-turn sessions (docs/formats.md, "Agentic sessions").

    Same options and seed give a byte-identical file. Examples:
    kvsim gen -o t.jsonl --rate 5 --duration 60 --prompt lognormal:1000:1.0 --output fixed:200
    kvsim gen -o s.jsonl --sessions 200 --session-rate 0.5 --turns uniform:2:10
    """
    from workloads import generate_trace

    session_options = {k: v for k, v in locals().items() if k in sessions_cli.SESSION_OPTIONS}
    inputs = _spec_files(prompt, output, *(v for v in session_options.values() if type(v) is str))
    _check_out(out, force, inputs)
    if sessions is not None:
        sessions_cli.refuse_request_options(
            {"--rate": rate, "--duration": duration, "--num-requests": num_requests,
             "--prompt": prompt, "--output": output}
        )  # fmt: skip
        with _bad_input():
            trace = sessions_cli.session_trace_from_options(
                sessions=sessions, session_rate=session_rate, arrival=arrival, cv=cv,
                seed=0 if seed is None else seed, name=name or out.stem, options=session_options,
            )  # fmt: skip
            _save(trace, out, force, inputs)
        count = len({r.session_id for r in trace.requests})
        say(f"wrote {len(trace)} requests of {count} sessions to ", out)
        return
    sessions_cli.refuse_session_options({"session_rate": session_rate, **session_options})
    if rate is None:
        fail("--rate is required (requests/s)")
    if (duration is None) == (num_requests is None):
        fail("give exactly one of --duration and --num-requests")
    with _bad_input():
        process = ArrivalProcess(
            rate_per_s=rate, kind=arrival or ArrivalKind.POISSON, cv=1.0 if cv is None else cv
        )
        trace = generate_trace(
            arrivals=process,
            prompt=prompt or _DEFAULT_LENGTHS,
            output=output or _DEFAULT_LENGTHS,
            num_requests=num_requests,
            duration_s=duration,
            seed=0 if seed is None else seed,
            name=name or out.stem,
        )
        _save(trace, out, force, inputs)
    last = trace.requests[-1].arrival_time_s
    say(f"wrote {len(trace)} requests over {last:.1f} s to ", out)


def _import_options(
    fmt: ImportFormat,
    rate: float | None,
    arrival: ArrivalKind | None,
    cv: float | None,
    seed: int | None,
    num_requests: int | None,
) -> dict[str, Any]:
    given = {
        "--rate": rate,
        "--arrival": arrival,
        "--cv": cv,
        "--seed": seed,
        "--num-requests": num_requests,
    }
    if fmt is not ImportFormat.LENGTHS:
        for option, value in given.items():
            if value is not None:
                fail(f"{option} applies only to the lengths format")
        return {}
    if rate is None:
        fail("the lengths format needs --rate (requests/s) for its synthetic arrivals")
    process = ArrivalProcess(
        rate_per_s=rate, kind=arrival or ArrivalKind.POISSON, cv=1.0 if cv is None else cv
    )
    return {"arrivals": process, "seed": seed or 0, "num_requests": num_requests}


def _dropped_text(result: ImportResult) -> str:
    if not result.dropped:
        return "none dropped"
    reasons = ", ".join(f"{count} with {reason}" for reason, count in result.dropped.items())
    return f"dropped {result.num_dropped}: {reasons}"


def import_trace(
    fmt: Annotated[ImportFormat, typer.Argument(metavar="FORMAT", help="Source format.")],
    file: Annotated[Path, typer.Argument(metavar="FILE", help="Source trace file.")],
    out: OutOption,
    name: Annotated[
        str | None, typer.Option(metavar="NAME", help="Trace name.", show_default="the output stem")
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(metavar="N", help="Keep only the first N requests (by arrival)."),
    ] = None,
    max_duration: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS", help="Keep only requests arriving within S seconds of the first."
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(metavar="REQ/S", help="lengths (required): mean arrival rate, requests/s."),
    ] = None,
    arrival: ArrivalOption = None,
    cv: CvOption = None,
    seed: SeedOption = None,
    num_requests: Annotated[
        int | None,
        typer.Option(metavar="N", help="lengths: use the first N usable rows.", show_default="all"),
    ] = None,
    force: ForceOption = False,
) -> None:
    """Convert a public trace (azure, mooncake, lengths, burstgpt) to a kvsim trace file.

    --rate/--arrival/--cv/--seed/--num-requests apply to lengths only (rows have no times).
    """
    from workloads import IMPORTERS, truncate

    _check_out(out, force, (file,))
    with _bad_input():
        options = _import_options(fmt, rate, arrival, cv, seed, num_requests)
        result = IMPORTERS[fmt.value](file, name=name or out.stem, **options)
        trace = result.trace
        if limit is not None or max_duration is not None:
            trace = truncate(trace, max_requests=limit, max_duration_s=max_duration)
        _save(trace, out, force, (file,))
    say(
        f"imported {len(trace)} requests from {result.num_rows} rows of {file} "
        f"({_dropped_text(result)}) to {out}"
    )


def _stats_tables(stats: dict[str, Any]) -> tuple[Table, Table]:
    def number(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    overview = Table(show_header=False)
    overview.add_row("trace", plain(stats["name"]))
    overview.add_row("requests", f"{stats['num_requests']:,}")
    overview.add_row("duration", f"{stats['duration_s']:,.1f} s")
    overview.add_row("mean rate", number(stats["mean_rate_per_s"], ".3f") + " req/s")
    overview.add_row("inter-arrival CV", number(stats["interarrival_cv"], ".2f"))
    overview.add_row("with hash_ids", f"{stats['share_with_hash_ids']:.0%}")
    overview.add_row("hash_block_size", str(stats["hash_block_size"] or "-"))
    overview.add_row("sessions", f"{stats['num_sessions']:,}")
    overview.add_row("with cancel_after_s", f"{stats['share_with_cancel_after']:.0%}")
    tokens = Table(title="tokens per request")
    for column in ("", "mean", "p50", "p99", "max", "total"):
        tokens.add_column(column, justify="right" if column else "left")
    for key in ("prompt_tokens", "output_tokens"):
        row = stats[key]
        tokens.add_row(
            key.removesuffix("_tokens"),
            f"{row['mean']:,.1f}",
            *(f"{row[k]:,.0f}" for k in ("p50", "p99", "max", "total")),
        )
    return overview, tokens


def info(
    trace: Annotated[
        str,
        typer.Argument(
            metavar="TRACE", help="Trace file (.jsonl, .json, .csv) or the name of a shipped trace."
        ),
    ] = DEFAULT_TRACE_NAME,
    as_json: Annotated[bool, typer.Option("--json", help="Print the statistics as JSON.")] = False,
) -> None:
    """Show a trace's statistics: count, duration, rate, burstiness, token lengths."""
    from workloads import load_trace, trace_stats

    if "\x00" in trace:
        fail("TRACE must not contain a NUL character")
    with _bad_input():
        stats = trace_stats(load_trace(resolve_trace(trace)))
    if as_json:
        console.print_json(json.dumps(stats))
        return
    for table in _stats_tables(stats):
        console.print(table)


def register(app: typer.Typer) -> None:
    """Add the trace commands to ``app``."""
    app.command("gen", cls=Command)(gen)
    app.command("import", cls=Command)(import_trace)
    shipped = ", ".join(shipped_trace_names())
    app.command("info", epilog=f"Shipped traces: {shipped}.", cls=Command)(info)
