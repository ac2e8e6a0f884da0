"""sweep.csv: one row per point, the SLO verdicts of a rate sweep, and the best points.

Rows are built where the point ran (kvsim/sweep/execute.py) from its RunResult, so only a small
dict travels back to the driver. Column definitions: docs/sweeps.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.analysis.kv_breakdown import CACHED_FIELD
from kvsim.analysis.kv_breakdown import SUMMARY_FIELDS as BREAKDOWN_FIELDS
from kvsim.analysis.load import PERCENTILES
from kvsim.costmodel import BatchShape
from kvsim.runner import RunResult, build_cost_model
from kvsim.sweep import slo
from kvsim.sweep.offload import (
    OFFLOAD_COLUMNS,
    OFFLOAD_INT_COLUMNS,
    fill_tierless,
    has_offload,
    offload_row,
)
from kvsim.sweep.spec import KV_SLOTS, SweepPoint, SweepSpec

DISTRIBUTIONS = ("ttft_s", "tpot_s", "e2e_latency_s", "queueing_delay_s")
SUMMARY_COLUMNS = (
    "num_requests",
    "num_finished",
    "num_rejected",
    "num_aborted",
    "num_unfinished",
    "num_preemptions",
    "throughput_requests_per_s",
    "throughput_output_tokens_per_s",
    "throughput_total_tokens_per_s",
    "sim_duration_s",
    "num_steps",
    "kv_usage_mean",
    "kv_usage_peak",
    *BREAKDOWN_FIELDS,
    "mean_batch_size",
    "max_batch_size",
    "mean_running_seqs",
    "saturated",
    "offered_rate_per_s",
    "served_rate_per_s",
)
# The prefix cache (docs/metrics.md): tokens; the hit rate over first admissions, as vLLM.
PREFIX_COLUMNS = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prefix_cache_hit_rate",
    "prompt_tokens_cached",
    "prompt_tokens_recomputed",
    "prefix_cache_evictions",
)
# What a block size costs per block: the block-table walk the cost model charged (seconds, and
# share of busy time), and the KV memory the pool takes on each GPU.
BLOCK_COST_COLUMNS = ("block_walk_s", "block_walk_share", "kv_cache_gib")
# Integer columns: written as integers (no "16.0" where a failed point leaves a gap).
INT_COLUMNS = (
    "block_size", "num_blocks", "kv_slots", "max_num_seqs", "max_num_batched_tokens",
    "max_model_len", "tp", "concurrency", "seed", "num_requests", "num_finished",
    "num_rejected", "num_aborted", "num_unfinished", "num_preemptions", "num_steps",
    "max_batch_size", *PREFIX_COLUMNS[:2], *PREFIX_COLUMNS[3:],
)  # fmt: skip
# A fleet's load imbalance: coefficients of variation across replicas (empty for one replica).
FLEET_COLUMNS = ("requests_cv", "busy_time_cv")
# Columns that measure the simulator, not the simulated system: they differ between runs.
WALL_COLUMNS = ("sim_wall_s", "point_wall_s")


def _stat_columns() -> list[str]:
    stats = ["mean", *(f"p{p}" for p in PERCENTILES)]
    return [f"{d}_{s}" for d in DISTRIBUTIONS for s in stats]


def point_row(point: SweepPoint, result: RunResult, point_wall_s: float) -> dict[str, Any]:
    """The point's sweep.csv row (without the driver's columns: slo_met)."""
    s = result.summary
    config = point.config
    row: dict[str, Any] = base_row(point)
    row.update(
        status="ok",
        error="",
        allocator=config.allocator,
        block_size=config.block_size,
        num_blocks=result.resolved.get("num_blocks", s["num_blocks"]),
        # a swept capacity stays as asked (the points' series); the pool holds
        # num_blocks x block_size of it
        kv_slots=point.values.get(KV_SLOTS, s["num_blocks"] * s["block_size"]),
        rate=config.rate,
    )
    for name in SUMMARY_COLUMNS:
        row[name] = s[name]
    row["saturation"] = (s.get("saturation") or {}).get("verdict")
    v1 = config.resolved_scheduler() == "v1"  # classic runs have no prefix cache: empty
    for name in PREFIX_COLUMNS:
        value = s[name] if v1 else None
        row[name] = math.nan if value is None else value
    # v1: the KV share cached, evictable (the breakdown's sixth part; memory.png stacks it)
    cached = s.get(CACHED_FIELD) if v1 else None
    row[CACHED_FIELD] = math.nan if cached is None else cached
    row.update(block_costs(result))
    row.update(offload_row(s))  # a CPU tier's columns (kvsim/sweep/offload.py)
    fleet = s.get("fleet") or {}  # a fleet's load imbalance across replicas (docs/fleet.md)
    for name in FLEET_COLUMNS:
        row[name] = fleet.get(name, math.nan)
    for name in DISTRIBUTIONS:
        for stat, value in s[name].items():
            row[f"{name}_{stat}"] = math.nan if value is None else value
    row["normalized_latency_s_per_token"] = normalized_latency(result.requests)
    row["sim_wall_s"] = s["wall_time_s"]
    row["point_wall_s"] = point_wall_s
    return row


def block_costs(result: RunResult) -> dict[str, float]:
    """BLOCK_COST_COLUMNS of a run. The block-table walk is priced as the cost model does
    (kvsim/sim/executor.py): per step, one entry per block in use (``num_blocks -
    free_blocks`` after scheduling, cached-evictable blocks counted free), one per sequence
    for a contiguous allocator, nothing under ``--step-time``. Classic prefill steps read
    only their prefills' tables, so for them this is an upper bound."""
    config = result.config
    s = result.summary
    cost_model = build_cost_model(config)
    gib = s["num_blocks"] * s["block_size"] * cost_model.shard.kv_bytes_per_token_per_gpu / 2**30
    steps = result.steps
    if config.step_time is not None or not len(steps):
        walk = 0.0
    else:
        per_entry = cost_model.breakdown(BatchShape.of(num_blocks_walked=1))["block_walk"]
        if config.allocator == "paged":
            # a fleet's steps are each replica's: its own pool (summary num_blocks is the sum)
            pool = s["replicas"][0]["num_blocks"] if "replicas" in s else s["num_blocks"]
            entries = pool - steps["free_blocks"].to_numpy(dtype=np.int64)
        else:
            entries = steps["num_seqs"].to_numpy(dtype=np.int64)
        walk = float(per_entry * entries.sum())
    busy = float(steps["duration_s"].sum()) if len(steps) else 0.0
    return {
        "block_walk_s": walk,
        "block_walk_share": walk / busy if busy > 0 else math.nan,
        "kv_cache_gib": gib,
    }


def base_row(point: SweepPoint) -> dict[str, Any]:
    row: dict[str, Any] = {"point": point.index, "label": point.label, "folder": point.folder}
    for name, value in point.values.items():
        row[name] = value
    return row


def failed_row(point: SweepPoint, error: str) -> dict[str, Any]:
    row = base_row(point)
    config = point.config
    row.update(
        status="failed",
        error=error,
        allocator=config.allocator,
        block_size=config.block_size,
        rate=config.rate,
    )
    return row


def normalized_latency(requests: pd.DataFrame) -> float:
    """Mean over finished requests of end-to-end latency / output tokens (s/token), as in
    vLLM's paper."""
    done = requests[requests["status"] == "finished"]
    tokens = done["generated_tokens"].to_numpy(dtype=float)
    if len(done) == 0:
        return math.nan
    return float(np.mean(done["e2e_latency_s"].to_numpy(dtype=float) / np.maximum(tokens, 1)))


def rows_frame(rows: list[dict[str, Any]], spec: SweepSpec) -> pd.DataFrame:
    """sweep.csv's table, in point order, with the SLO verdict of each point if asked."""
    fixed = ["point", "label", "status", "error", *spec.axis_names]
    offload = has_offload(rows)
    config = [
        c
        for c in ("allocator", "block_size", "num_blocks", "kv_slots", "rate")
        if c not in spec.axis_names
    ]
    metrics = [
        *SUMMARY_COLUMNS,
        "saturation",
        *PREFIX_COLUMNS,
        CACHED_FIELD,
        *BLOCK_COST_COLUMNS,
        # only where some point is a fleet: a one-replica sweep's table stays as it was
        *(FLEET_COLUMNS if any(_is_number(r.get(FLEET_COLUMNS[0])) for r in rows) else ()),
        # only where some point offloads to a CPU tier: other sweeps' tables stay as they were
        *(OFFLOAD_COLUMNS if offload else ()),
        *_stat_columns(),
        "normalized_latency_s_per_token",
    ]
    columns = [*fixed, *config, *metrics, *WALL_COLUMNS, "folder"]
    frame = pd.DataFrame(sorted(rows, key=lambda r: r["point"]))
    frame = frame.reindex(columns=columns)
    if offload:
        frame = fill_tierless(frame)
    for column in (*INT_COLUMNS, *(OFFLOAD_INT_COLUMNS if offload else ())):
        if column in frame and _integral(frame[column]):
            frame[column] = frame[column].astype("Int64")
    frame.insert(4, "slo_met", slo_met(frame, spec))
    return frame


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def _integral(column: pd.Series) -> bool:
    values = pd.to_numeric(column, errors="coerce")
    given = values.dropna()
    return bool(values.notna().sum() == column.notna().sum() and (given % 1 == 0).all())


def slo_met(frame: pd.DataFrame, spec: SweepSpec) -> pd.Series:
    """Whether each point met the SLO (the sweep's own, or the defaults: kvsim/sweep/slo.py):
    status ok and each latency percentile bounded at most its bound (a missing value, e.g.
    no TPOT, does not meet it)."""
    return slo.met(frame, spec)


def max_rates(frame: pd.DataFrame, spec: SweepSpec) -> pd.DataFrame:
    """Per combination of the other axes: the highest rate such that it and every lower rate
    swept meet the SLO (None when the lowest rate fails already)."""
    if "rate" not in spec.axis_names or "slo_met" not in frame:
        return pd.DataFrame()
    others = [a for a in spec.axis_names if a != "rate"]
    groups = frame.groupby(others, sort=False) if others else [((), frame)]
    out = []
    for key, group in groups:
        best = None
        for _, r in group.sort_values("rate").iterrows():
            if not r["slo_met"]:
                break
            best = r["rate"]
        key = key if isinstance(key, tuple) else (key,)
        out.append({**dict(zip(others, key)), "max_rate": best})
    return pd.DataFrame(out)


@dataclass(frozen=True, slots=True)
class Best:
    objective: str  # what was optimised, in words
    label: str  # the point
    value: str  # its value, formatted with its unit


OBJECTIVES = (
    ("highest throughput", "throughput_output_tokens_per_s", max, "{:,.0f} output tokens/s"),
    ("highest request throughput", "throughput_requests_per_s", max, "{:.3f} requests/s"),
    ("lowest p50 end-to-end latency", "e2e_latency_s_p50", min, "{:.3f} s"),
    ("lowest p99 end-to-end latency", "e2e_latency_s_p99", min, "{:.3f} s"),
    ("lowest p99 TTFT", "ttft_s_p99", min, "{:.3f} s"),
    ("lowest normalized latency", "normalized_latency_s_per_token", min, "{:.4f} s/token"),
    ("most KV memory holding token states", "kv_token_state_share_mean", max, "{:.1%}"),
)


def best_points(frame: pd.DataFrame) -> list[Best]:
    """For each objective, the best successful point (ties: the first in point order)."""
    ok = frame[frame["status"] == "ok"]
    out = []
    for words, column, pick, fmt in OBJECTIVES:
        values = ok[column].astype(float).dropna()
        if values.empty:
            continue
        target = pick(values)
        at = values[values == target].index[0]
        out.append(Best(words, str(ok.loc[at, "label"]), fmt.format(target)))
    return out


@dataclass(slots=True)
class SweepResult:
    """A written sweep folder: its spec, its table (one row per point) and how it was run."""

    path: Path
    spec: SweepSpec
    table: pd.DataFrame
    command: list[str]
    wall_s: float
    report_error: str | None = None  # the report could not be written (the rest was)

    @property
    def num_failed(self) -> int:
        return int((self.table["status"] != "ok").sum())
