"""A fleet's pictures (docs/fleet.md): load and KV usage per replica over time, prefix-cache
hit rate per replica over time, and the imbalance across replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvsim.plots._common import save_png

FLEET_PICTURES = {
    "fleet-load": "fleet_load.png",
    "fleet-hit-rate": "fleet_hit_rate.png",
    "fleet-imbalance": "fleet_imbalance.png",
}
PD_PICTURES = {"fleet-pd-transfer": "fleet_pd_transfer.png"}  # a P/D fleet's (kvsim/plots/pd.py)
FLEET_CAPTIONS = {
    "fleet-load": "Waiting requests, running sequences and KV usage per replica over time",
    "fleet-hit-rate": "Prefix-cache hit rate per replica and fleet-wide, cumulative by arrival",
    "fleet-imbalance": "Requests, busy time and prefix-cache hit rate per replica",
    "fleet-pd-transfer": "P/D: KV pull times, and against the tokens each pulled",
}
BINS = 200  # time bins of the load picture: a long run stays readable


def _binned_mean(t: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 2)
    total = np.bincount(which, values, minlength=len(edges) - 1)
    count = np.bincount(which, minlength=len(edges) - 1)
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def waiting_at(requests: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Requests arrived and not yet admitted (nor rejected or aborted while waiting) at each
    of ``times`` (s): the waiting queue of new requests (a preempted request waiting again is
    not counted)."""
    arrived = np.sort(requests["arrival_time_s"].to_numpy(float))
    left = requests["admit_time_s"].fillna(requests["finish_time_s"])
    left_sorted = np.sort(left.dropna().to_numpy(float))
    return np.searchsorted(arrived, times, side="right") - np.searchsorted(
        left_sorted, times, side="right"
    )


def draw_load(steps: pd.DataFrame, requests: pd.DataFrame, summary: dict[str, Any]) -> Figure:
    fig, (queue, top, bottom) = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    end = float(summary["sim_duration_s"]) or 1.0
    edges = np.linspace(0.0, end, BINS + 1)
    middle = (edges[:-1] + edges[1:]) / 2
    per_replica_blocks = summary["replicas"][0]["num_blocks"]
    for replica, rows in steps.groupby("replica", sort=True):
        t = rows["time_s"].to_numpy()
        mine = requests[requests["replica"] == replica]
        queue.plot(middle, waiting_at(mine, middle), lw=1, label=f"replica {replica}")
        top.plot(middle, _binned_mean(t, rows["num_running"].to_numpy(float), edges), lw=1)
        used = 1 - rows["free_blocks"].to_numpy(float) / per_replica_blocks
        bottom.plot(middle, 100 * _binned_mean(t, used, edges), lw=1)
    queue.set_ylabel("waiting\n(arrived, not admitted)")
    top.set_ylabel("running sequences")
    bottom.set_ylabel("KV blocks in use (%)")
    bottom.set_xlabel("simulated time (s)")
    bottom.set_ylim(0, 100)
    queue.legend(fontsize="small", ncol=4)
    fig.suptitle(
        f"{summary['fleet']['num_replicas']} replicas, router {summary['fleet']['router']}"
    )
    fig.tight_layout()
    return fig


def draw_hit_rate(requests: pd.DataFrame, summary: dict[str, Any]) -> Figure:
    fig, ax = plt.subplots(figsize=(9, 4))
    admitted = requests[requests["admit_time_s"].notna()]
    highest = 0.0

    def cumulative(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        rows = rows.sort_values("arrival_time_s", kind="stable")
        hits = rows["prefix_hit_tokens"].to_numpy(float).cumsum()
        prompt = rows["prompt_tokens"].to_numpy(float).cumsum()
        return rows["arrival_time_s"].to_numpy(), 100 * hits / np.maximum(prompt, 1)

    for replica, rows in admitted.groupby("replica", sort=True):
        t, rate = cumulative(rows)
        ax.plot(t, rate, lw=1, label=f"replica {replica}")
        highest = max(highest, float(rate.max(initial=0)))
    t, rate = cumulative(admitted)
    ax.plot(t, rate, lw=2, color="black", label="fleet")
    highest = max(highest, float(rate.max(initial=0)))
    ax.set_ylim(0, max(1.0, highest * 1.15))
    ax.set_xlabel("arrival time (s)")
    ax.set_ylabel("prompt tokens from the cache (%)")
    if not summary.get("prefix_cache_queries"):
        ax.text(0.5, 0.5, "no prefix-cache lookups (no prefix identity, or caching off)",
                transform=ax.transAxes, ha="center")  # fmt: skip
    ax.legend(fontsize="small", ncol=4)
    fig.tight_layout()
    return fig


def draw_imbalance(summary: dict[str, Any]) -> Figure:
    replicas = summary["replicas"]
    fleet = summary["fleet"]
    ids = [str(r["replica"]) for r in replicas]
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.5))
    panels = (
        ("requests", [r["num_requests"] for r in replicas], f"CV {fleet['requests_cv']:.2f}"),
        ("busy time (s)", [r["busy_time_s"] for r in replicas], f"CV {fleet['busy_time_cv']:.2f}"),
        (
            "prefix-cache hit rate (%)",
            [100 * (r.get("prefix_cache_hit_rate") or 0.0) for r in replicas],
            f"fleet {100 * (summary.get('prefix_cache_hit_rate') or 0.0):.1f}%",
        ),
    )
    for ax, (label, values, note) in zip(axes, panels):
        ax.bar(ids, values)
        ax.set_title(f"{label}\n{note}", fontsize="medium")
        ax.set_xlabel("replica")
    fig.tight_layout()
    return fig


def write_fleet_plots(
    steps: pd.DataFrame, requests: pd.DataFrame, summary: dict[str, Any], folder: Path
) -> list[Path]:
    """The fleet's pictures as PNGs in ``folder`` (``FLEET_PICTURES``; the P/D one for a P/D
    fleet only)."""
    folder.mkdir(parents=True, exist_ok=True)
    figures = {
        "fleet-load": draw_load(steps, requests, summary),
        "fleet-hit-rate": draw_hit_rate(requests, summary),
        "fleet-imbalance": draw_imbalance(summary),
    }
    if "pd" in summary["fleet"]:
        from kvsim.plots.pd import draw_pd_transfer

        figures["fleet-pd-transfer"] = draw_pd_transfer(requests, summary)
    files = {**FLEET_PICTURES, **PD_PICTURES}
    paths = [save_png(fig, folder / files[name]) for name, fig in figures.items()]
    plt.close("all")
    return paths
