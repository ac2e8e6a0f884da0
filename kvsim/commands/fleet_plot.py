"""``kvsim plot`` and ``kvsim report`` over a fleet's run folder (docs/fleet.md).

A fleet's tables hold every replica's steps and requests (a ``replica`` column) and its
events.parquet only the routing decisions (ROUTE events), so the one-replica pictures would
mix the replicas' pools and the ones that need a replica's events have nothing to draw from.
These commands draw the fleet's own pictures instead, as ``kvsim run`` does, and say so in one
line; asking for a one-replica picture, or for a time window (the fleet's pictures span the
whole run), is one red line and exit code 2.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from kvsim.commands.console import fail

# kvsim.plots.fleet.FLEET_PICTURES' names (kept here so that ``kvsim --help`` does not import
# matplotlib; a test holds them equal).
FLEET_PICTURE_NAMES = ("fleet-load", "fleet-hit-rate", "fleet-imbalance")
# kvsim.plots.fleet.PD_PICTURES' names: a P/D fleet's (kvsim run --pd) beside the above
PD_PICTURE_NAMES = ("fleet-pd-transfer",)


def is_fleet(run: Any) -> bool:
    """Whether the run folder ``run`` (kvsim.outputs.run_folder.RunFolder) is a fleet's."""
    return "replica" in run.steps.columns


def _replicas(run: Any) -> int:
    fleet = run.summary.get("fleet", {})
    return int(fleet.get("num_replicas", run.config.replicas))  # a P/D fleet: P + D


def is_pd(run: Any) -> bool:
    """Whether the run folder ``run`` is a P/D fleet's (kvsim run --pd)."""
    return "pd" in run.summary.get("fleet", {})


def available_names(run: Any) -> tuple[str, ...]:
    """The fleet pictures ``run`` has: with the P/D one for a P/D fleet."""
    return FLEET_PICTURE_NAMES + (PD_PICTURE_NAMES if is_pd(run) else ())


def fleet_names(
    run: Any, names: list[str] | None, t_from: float | None, t_to: float | None
) -> list[str]:
    """The fleet pictures to draw for ``--what`` ``names`` (None: all), after the checks."""
    if t_from is not None or t_to is not None:
        fail(
            f"{run.path}: a fleet run's pictures span the whole run (--from/--to window one "
            "replica's run only): drop --from/--to"
        )
    available = available_names(run)
    for name in names or []:
        if name not in available:
            fail(
                f"{run.path}: a fleet run ({_replicas(run)} replicas) has no {name} picture: its "
                "tables mix the replicas and its events.parquet holds only the routing "
                "decisions; its pictures: " + ", ".join(available)
            )
    return list(names or available)


def draw_fleet(run: Any, folder: Path, names: list[str]) -> list[Path]:
    """The fleet pictures ``names`` as PNGs in ``folder`` (kvsim.plots.fleet's files)."""
    from kvsim.plots.fleet import FLEET_PICTURES, PD_PICTURES, write_fleet_plots

    if is_pd(run) and set(FLEET_PICTURE_NAMES) <= set(names):  # all of them: the P/D one too
        names = [*names, *(n for n in PD_PICTURE_NAMES if n not in names)]
    files = {**FLEET_PICTURES, **PD_PICTURES}
    wanted = {files[n] for n in names}
    with tempfile.TemporaryDirectory(prefix="kvsim-fleet-") as scratch:
        drawn = write_fleet_plots(run.steps, run.requests, run.summary, Path(scratch))
        kept = [folder / p.name for p in drawn if p.name in wanted]
        for path in kept:
            shutil.copyfile(Path(scratch) / path.name, path)
    return kept


def fleet_pngs(run: Any) -> dict[str, bytes]:
    """Every fleet picture as PNG bytes by name (for report.html, as kvsim run embeds them)."""
    with tempfile.TemporaryDirectory(prefix="kvsim-fleet-") as folder:
        paths = draw_fleet(run, Path(folder), list(available_names(run)))
        return {p.stem.replace("_", "-"): p.read_bytes() for p in paths}


def skipped_line(run: Any, one_replica_names: tuple[str, ...]) -> str:
    """What ``kvsim plot`` of a fleet did not draw, and why."""
    return (
        f"skipped the one-replica pictures ({', '.join(one_replica_names)}): a fleet's "
        f"tables mix its {_replicas(run)} replicas and its events.parquet holds only the "
        "routing decisions (docs/fleet.md)"
    )


def no_events_line(run: Any, what: str) -> str:
    """Why ``what`` (kvsim animate, export-trace) cannot read a fleet's run folder."""
    return (
        f"{run.path}: {what} needs a replica's events, and a fleet run's events.parquet "
        f"({_replicas(run)} replicas) holds only its routing decisions (ROUTE; docs/fleet.md); "
        "a one-replica run (--replicas 1) keeps its events"
    )
