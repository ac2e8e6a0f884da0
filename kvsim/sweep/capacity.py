"""Capacity search: the highest arrival rate (the trace rescaled to it, ``--rate``) each
configuration of a grid serves within the SLOs, found by bisection over runs
(docs/sweeps.md, "Capacity search").

Each configuration's search starts at the trace's own mean rate (or the ``--rate`` given),
brackets the capacity by doubling or halving, then narrows the bracket geometrically until
its ends are within ``tolerance`` of each other. A round probes ``PROBES_PER_ROUND`` rates per
configuration, every configuration at once, through the sweep's executors (process pool,
serial or Ray); the rates probed never depend on how many run in parallel, so the answer is
the same whatever ``--jobs`` (cost mode: byte for byte).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim.atomic import FolderKind, output_folder
from kvsim.sweep import slo
from kvsim.sweep.execute import PointOutcome, Task, default_jobs, execute
from kvsim.sweep.fleet_advice import fleet_advice
from kvsim.sweep.spec import SweepError, SweepPoint, SweepSpec, command_line

# A round probes this many rates per configuration: 2 bracket steps (x2, x4 or /2, /4), or
# 3 points splitting the bracket into 4 equal ratios.
PROBES_PER_ROUND = 3
DEFAULT_TOLERANCE = 0.05  # the bracket's ends within 5% of each other
MAX_PROBES = 30  # per configuration
MAX_FACTOR = 2.0**12  # the search stops 4096x above or below where it started
FORMAT_VERSION = 1
CAPACITY_FOLDER = FolderKind(
    what="capacity folder",
    marker_file="capacity.json",
    marker_key="kvsim_capacity",
    entries=frozenset({"capacity.json", "capacity.csv", "probes.csv"}),
)
# Columns of a probe (probes.csv) and of the configuration's row at its capacity.
PROBE_COLUMNS = (
    "saturation", "ttft_s_p99", "tpot_s_p99", "ttft_s_p90", "tpot_s_p90", "ttft_s_p50",
    "tpot_s_p50", "normalized_latency_s_per_token", "throughput_output_tokens_per_s",
    "throughput_requests_per_s", "offered_rate_per_s",
)  # fmt: skip


# Kept where a run reports them: the hit rate, and a fleet's imbalance (kvsim/sweep/table.py
# FLEET_COLUMNS) that the fleet advice weighs against it (kvsim/sweep/fleet_advice.py).
EXTRA_PROBE_COLUMNS = ("prefix_cache_hit_rate", "requests_cv", "busy_time_cv")


def _round_rate(rate: float) -> float:
    """Four significant figures: rates a user can type again (``--rate 3.162``)."""
    return float(f"{rate:.4g}")


@dataclass(slots=True)
class Search:
    """One configuration's search: the highest rate probed that met the SLOs below every
    miss (``good``), the lowest that missed (``bad``), and every probe."""

    point: SweepPoint
    start: float
    tolerance: float
    good: float | None = None
    bad: float | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stopped(self) -> str | None:
        """Why the search ended without a bracket (None while going, or when bracketed)."""
        if self.bad is None and self.good is not None and self.good >= self.start * MAX_FACTOR:
            return f"meets the SLOs up to {self.good:g} req/s, the search's ceiling"
        if self.good is None and self.bad is not None and self.bad <= self.start / MAX_FACTOR:
            return f"no rate meets the SLOs, down to {self.bad:g} req/s"
        if len(self.probes) >= MAX_PROBES:
            return f"stopped after {MAX_PROBES} probes"
        return None

    @property
    def done(self) -> bool:
        if self.stopped is not None:
            return True
        return (
            self.good is not None
            and self.bad is not None
            and self.bad <= self.good * (1 + self.tolerance)
        )

    def proposals(self) -> list[float]:
        """The next round's rates (none when done)."""
        if self.done:
            return []
        k = PROBES_PER_ROUND
        if self.good is None and self.bad is None:
            rates = [self.start, self.start * 2, self.start / 2]
        elif self.bad is None:
            assert self.good is not None
            rates = [self.good * 2**i for i in range(1, k + 1)]
        elif self.good is None:
            rates = [self.bad / 2**i for i in range(1, k + 1)]
        else:
            ratio = self.bad / self.good
            rates = [self.good * ratio ** (i / (k + 1)) for i in range(1, k + 1)]
        probed = {p["rate"] for p in self.probes}
        return sorted({r for r in map(_round_rate, rates) if r > 0 and r not in probed})

    def record(self, rate: float, row: dict[str, Any], missed: list[str]) -> None:
        """A probe's result: ``missed`` the SLO bounds it missed (empty: it met them)."""
        met = row.get("status") == "ok" and not missed
        why = "; ".join(missed) if row.get("status") == "ok" else f"failed: {row.get('error')}"
        probe = {"rate": rate, "slo_met": met, "why": "" if met else why}
        probe.update({c: row.get(c) for c in PROBE_COLUMNS})
        probe.update({c: row[c] for c in EXTRA_PROBE_COLUMNS if c in row})
        self.probes.append(probe)
        misses = [p["rate"] for p in self.probes if not p["slo_met"]]
        self.bad = min(misses) if misses else None
        # a rate that met above a miss does not count (latency may dip by chance)
        below = [
            p["rate"]
            for p in self.probes
            if p["slo_met"] and (self.bad is None or p["rate"] < self.bad)
        ]
        self.good = max(below) if below else None


@dataclass(slots=True)
class CapacityResult:
    """The search's answer: ``table`` (one row per configuration: its capacity and the
    figures there), ``probes`` (every run), the spec and how long it took."""

    spec: SweepSpec
    table: pd.DataFrame
    probes: pd.DataFrame
    start_rate: float
    tolerance: float
    command: list[str]
    wall_s: float


def start_rate(spec: SweepSpec) -> float:
    """Where every search starts: the ``--rate`` given, else the trace's own mean rate."""
    if spec.base.rate is not None:
        return float(spec.base.rate)
    from kvsim.runner import load_workload
    from workloads import mean_arrival_rate

    return mean_arrival_rate(load_workload(spec.base)[1])


def capacity_search(
    spec: SweepSpec,
    *,
    executor: str = "process",
    jobs: int | None = None,
    address: str | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    on_probe: Any = None,
) -> CapacityResult:
    """Search every configuration of ``spec`` (its axes; the rate is what is searched) for
    the highest rate meeting its SLOs (kvsim/sweep/slo.py: its own or the defaults).
    ``on_probe(outcome)`` is called in the driver after each run."""
    if "rate" in spec.axis_names:
        raise SweepError("a capacity search finds the rate: give --rate once (where to start)")
    if not 0 < tolerance < 1:
        raise SweepError(f"tolerance must be between 0 and 1, got {tolerance!r}")
    jobs = default_jobs() if jobs is None else jobs
    if type(jobs) is not int or jobs < 1:
        raise SweepError(f"--jobs must be an integer >= 1, got {jobs!r}")
    begin = time.perf_counter()
    start = start_rate(spec)
    searches = [Search(p, start, tolerance) for p in spec.points()]
    bounds = slo.bounds(spec)
    index = 0
    while True:
        tasks: list[Task] = []
        owner: dict[int, tuple[Search, float]] = {}
        for search in searches:
            for rate in search.proposals():
                config = search.point.config.replace(rate=rate)
                values = {**search.point.values, "rate": rate}
                tasks.append((index, values, config.to_dict(), False, None))
                owner[index] = (search, rate)
                index += 1
        if not tasks:
            break
        outcomes: list[PointOutcome] = []
        execute(tasks, outcomes.append, executor=executor, jobs=jobs, address=address)
        for outcome in sorted(outcomes, key=lambda o: o.index):  # any executor, one order
            search, rate = owner[outcome.index]
            row = outcome.row
            missed = slo.misses(pd.Series(row), bounds) if row.get("status") == "ok" else []
            search.record(rate, row, missed)
            if on_probe is not None:
                on_probe(outcome)
    table = pd.DataFrame([_row(s) for s in searches])
    probes = pd.DataFrame(
        [{"label": s.point.label, **s.point.values, **p} for s in searches for p in s.probes]
    )
    command = [*command_line(spec), "--metric", "capacity"]
    return CapacityResult(
        spec, table, probes, start, tolerance, command, time.perf_counter() - begin
    )


def _row(search: Search) -> dict[str, Any]:
    at = next((p for p in search.probes if p["rate"] == search.good), {})
    return {
        "label": search.point.label,
        **search.point.values,
        "capacity_rate_per_s": search.good,
        "lowest_miss_rate_per_s": search.bad,
        "status": search.stopped or ("ok" if search.good is not None else "no rate found"),
        "num_probes": len(search.probes),
        **{c: at.get(c) for c in PROBE_COLUMNS},
        **{c: at[c] for c in EXTRA_PROBE_COLUMNS if c in at},
    }


def summary_lines(result: CapacityResult) -> list[str]:
    """One sentence per configuration, best first: its capacity and the miss above it."""
    out = []
    table = result.table.sort_values(
        "capacity_rate_per_s", ascending=False, na_position="last", kind="stable"
    )
    for _, r in table.iterrows():
        label = r["label"]
        rate, bad = r["capacity_rate_per_s"], r["lowest_miss_rate_per_s"]
        if rate is None or pd.isna(rate):
            out.append(f"{label}: {r['status']}.")
            continue
        line = f"{label}: serves {rate:g} req/s within the SLOs"
        if bad is not None and not pd.isna(bad):
            line += f"; misses them at {bad:g} req/s"
        if r["status"] != "ok":
            line += f" ({r['status']})"
        out.append(line + ".")
    return out


def write_capacity(result: CapacityResult, out: Path, *, force: bool = False) -> None:
    """capacity.json (the search and its SLOs), capacity.csv and probes.csv, written as one
    folder (kvsim.atomic: never over a user's files; an earlier one only with ``force``)."""
    spec = result.spec
    describe = {
        "kvsim_capacity": FORMAT_VERSION,
        "command": result.command,
        "base": spec.base.to_dict(),
        "axes": {name: list(values) for name, values in spec.axes},
        "slo": [
            {"metric": b.metric, "percentile": b.percentile, "bound_s": b.bound_s}
            for b in slo.bounds(spec)
        ],
        "slo_is_default": not spec.has_slo,
        "start_rate_per_s": result.start_rate,
        "tolerance": result.tolerance,
        "probes_per_round": PROBES_PER_ROUND,
    }
    advice = fleet_advice(result.table, spec)
    if advice:  # a grid of routers or fleet sizes (kvsim/sweep/fleet_advice.py)
        describe["fleet_advice"] = advice
    with output_folder(Path(out), CAPACITY_FOLDER, force=force) as tmp:
        (tmp / "capacity.json").write_text(json.dumps(describe, indent=2) + "\n")
        result.table.to_csv(tmp / "capacity.csv", index=False)
        result.probes.to_csv(tmp / "probes.csv", index=False)
