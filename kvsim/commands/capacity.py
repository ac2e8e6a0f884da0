"""``kvsim capacity`` (``kvsim sweep --metric capacity``): the search's progress, its folder,
and the highest rate each configuration serves within the SLOs, in the terminal."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import typer

from kvsim.commands.console import console, plain, say


def run_capacity(
    spec: Any,
    out: Path,
    executor: str,
    jobs: int | None,
    address: str | None,
    force: bool,
    tolerance: float,
) -> None:
    """Search, write the capacity folder ``out`` and print the answer; exit 1 when some
    probe failed (the folder is written)."""
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    from kvsim.sweep.capacity import capacity_search, write_capacity

    failed = 0
    with Progress(
        TextColumn("[bold]capacity[/bold]"),
        TextColumn("{task.completed} runs  {task.fields[last]}", markup=False),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task("capacity", total=None, last="")

        def on_probe(outcome: Any) -> None:
            nonlocal failed
            failed += not outcome.ok
            bar.update(task, advance=1, last=f"done: {outcome.row.get('label', '')}")
            if not outcome.ok:
                say(f"run {outcome.row.get('label', '')} failed: {outcome.error}", style="red")

        result = capacity_search(
            spec, executor=executor, jobs=jobs, address=address, tolerance=tolerance,
            on_probe=on_probe,
        )  # fmt: skip
    write_capacity(result, out, force=force)
    print_capacity(result)
    say("capacity folder: ", out, " (capacity.csv, probes.csv, capacity.json)")
    say("reproduce: ", shlex.join(result.command))
    if failed:
        raise typer.Exit(1)


def print_capacity(result: Any) -> None:
    """The capacity table (one row per configuration) and a sentence for each."""
    from rich import box
    from rich.table import Table

    from kvsim.sweep.capacity import summary_lines
    from kvsim.sweep.compare import value_text
    from kvsim.sweep.fleet_advice import fleet_advice
    from kvsim.sweep.slo import seconds_text, slo_text

    spec, frame = result.spec, result.table
    say(
        f"{len(result.probes)} runs in {result.wall_s:.1f} s; searched from "
        f"{result.start_rate:.4g} req/s to within {result.tolerance:.0%}"
    )
    table = Table(
        title=f"SLO: {slo_text(spec)}", header_style="bold", title_justify="left",
        box=box.SIMPLE_HEAD,
    )  # fmt: skip
    for name in spec.axis_names:
        longest = max([len(name), *(len(value_text(name, v)) for v in frame[name])])
        table.add_column(plain(name), min_width=min(longest, 24), overflow="fold")
    for name in ("req/s within SLO", "misses at", "load there", "p99 TTFT", "p99 TPOT", "runs"):
        table.add_column(name, justify="right", no_wrap=True)
    for _, r in frame.iterrows():

        def cell(value: Any, fmt: Any = "{:g}") -> str:
            if value is None or (isinstance(value, float) and math.isnan(value)):
                return "-"
            return str(fmt(value) if callable(fmt) else fmt.format(value))

        table.add_row(
            *(plain(value_text(a, r[a])) for a in spec.axis_names),
            cell(r["capacity_rate_per_s"]),
            cell(r["lowest_miss_rate_per_s"]),
            cell(r["saturation"], "{}"),
            cell(r["ttft_s_p99"], seconds_text),
            cell(r["tpot_s_p99"], seconds_text),
            str(r["num_probes"]),
        )
    console.print(table)
    for line in summary_lines(result):
        say(line)
    for line in fleet_advice(result.table, spec):  # a grid of routers or fleet sizes
        say(line)
