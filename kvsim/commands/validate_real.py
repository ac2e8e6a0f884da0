"""``kvsim validate-real SPEC``: kvsim's TTFT / TPOT / E2E against a real deployment's runs.

Hands off to kvsim.outputs.validate_real; only this edge prints and turns bad input into one
red line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kvsim.commands.console import console, fail, plain, say
from kvsim.commands.run import user_errors

Opt = typer.Option


def validate_real_command(
    spec: Annotated[
        str,
        typer.Argument(
            help="SPEC file (format kvsim-real-runs) or a shipped SPEC's name, e.g. "
            "vllm-0.15.1_h100-sxm_llama-2-7b"
        ),
    ],
    coefficients: Annotated[
        str | None,
        Opt(
            help="Step-time coefficient file or shipped name (default: the SPEC's "
            "serving_stack under its GPU, e.g. h100-sxm+vllm-0.15; else the GPU preset)"
        ),
    ] = None,
    workload: Annotated[
        list[str] | None, Opt(help="Only this workload of the SPEC (repeatable)")
    ] = None,
    out: Annotated[
        Path | None, Opt("--out", "-o", help="Also write comparison.json, stages.csv, errors.png")
    ] = None,
    force: Annotated[bool, Opt("--force", help="Replace an existing folder")] = False,
) -> None:
    """Replay a real deployment's workloads under its limits; print predicted vs measured
    TTFT, TPOT and end-to-end means (and p90 / p99) per stage with signed errors."""
    from kvsim.atomic import check_target
    from kvsim.outputs.real_spec import load_real_spec
    from kvsim.outputs.validate_real import VALIDATE_REAL_FOLDER, validate_real, write_validation

    try:
        real = load_real_spec(spec)
        names = {w.recipe.name for w in real.workloads}
        unknown = sorted(set(workload or ()) - names)
        if unknown:
            fail(
                f"{real.source}: no workload {unknown[0]!r} (workloads: {', '.join(sorted(names))})"
            )
        if out is not None:
            check_target(out, VALIDATE_REAL_FOLDER, force=force)  # before the runs, not after
        with console.status("replaying the SPEC's workloads"):
            validation = validate_real(
                real, coefficients=coefficients, workloads=tuple(workload or ())
            )
        if out is not None:
            write_validation(validation, out, force=force)
    except user_errors(ValueError, OSError) as exc:
        fail(str(exc))
    _print(validation.rows(), real.name, real.provenance)
    if out is not None:
        say(f"wrote {out}")


def _pct(value: float) -> str:
    if value != value:
        return "-"
    return f"{value:+,.0f}%" if abs(value) >= 1000 else f"{value:+.1f}%"


def _ms(value: float) -> str:
    if value != value:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


_FIGURES = (("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"), ("e2e_ms", "E2E ms"))


def _print(rows: list[dict[str, Any]], name: str, provenance: str) -> None:
    table = Table(title=plain(f"kvsim against {name}"), header_style="bold")
    for column in ("stage", "mean", "kvsim", "measured", "error", "p90", "p99"):
        table.add_column(column, justify="left" if column in ("stage", "mean") else "right",
                         no_wrap=True)  # fmt: skip
    for row in rows:
        labels = [
            plain(str(row["workload"])),
            f"{row['rate_per_s']:g}/s x {row['duration_s']:g} s",
            "SATURATED" if row["saturated"] else "",
        ]
        for (metric, figure), label in zip(_FIGURES, labels, strict=True):
            table.add_row(
                label, figure, _ms(row[f"{metric}.mean"]), _ms(row[f"measured_{metric}"]),
                _pct(row[f"error_{metric}_pct"]), _ms(row[f"{metric}.p90"]),
                _ms(row[f"{metric}.p99"]),
            )  # fmt: skip
        measured = row["measured_finished"]
        table.add_row(
            "", "finished", f"{row['finished']:,}",
            "-" if measured != measured else f"{measured:,.0f}",
            _pct(row["error_finished_pct"]), f"{row['timed_out']:,} t/o", "",
            end_section=True,
        )  # fmt: skip
    console.print(table)
    say(f"measured: {provenance}")


def register(app: typer.Typer) -> None:
    app.command("validate-real")(validate_real_command)
