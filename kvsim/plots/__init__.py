"""Pictures of a run: functions that take DataFrames and return matplotlib Figures.

The CLI, the reports and the notebooks all call these same functions. Large runs are drawn
from at most ``MAX_POINTS`` steps (evenly thinned), so a million-step run plots as fast as a
small one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: the CLI and CI have no display

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

MAX_POINTS = 20_000
COLORS = {
    "filled": "#2b6cb0",
    "internal": "#ed8936",
    "free": "#cbd5e0",
    "prefill": "#c05621",
    "decode": "#2f855a",
}


def _thin(frame: pd.DataFrame) -> pd.DataFrame:
    if len(frame) <= MAX_POINTS:
        return frame
    index = np.linspace(0, len(frame) - 1, MAX_POINTS).astype(int)
    return frame.iloc[index]


def _new(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Any]:
    fig, ax = plt.subplots(figsize=(9, 4), layout="constrained")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def plot_free_blocks(steps: pd.DataFrame, events: pd.DataFrame | None = None) -> Figure:
    """Free KV blocks at each step; preemptions and rejections marked when events are given."""
    fig, ax = _new("Free KV blocks over time", "simulated time (s)", "free blocks")
    s = _thin(steps)
    ax.step(s["time_s"], s["free_blocks"], where="post", color=COLORS["filled"], lw=1)
    if events is not None:
        for kind, marker, color in (("PREEMPT", "v", "#c53030"), ("REJECT", "x", "#553c9a")):
            e = events[events["kind"] == kind]
            if len(e):
                ax.scatter(
                    e["time_s"],
                    e["free_blocks"],
                    marker=marker,
                    color=color,
                    s=18,
                    label=f"{kind.lower()} ({len(e)})",
                    zorder=3,
                )
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right")
    ax.set_ylim(bottom=0)
    return fig


def plot_kv_breakdown(steps: pd.DataFrame, total_slots: int) -> Figure:
    """KV slots over time as a stacked area: filled / internal fragmentation / free."""
    fig, ax = _new("KV memory breakdown", "simulated time (s)", "share of KV slots")
    s = _thin(steps)
    filled = s["filled_slots"] / total_slots
    internal = (s["allocated_slots"] - s["filled_slots"]) / total_slots
    free = 1.0 - filled - internal
    ax.stackplot(
        s["time_s"],
        filled,
        internal,
        free,
        labels=["token states (filled)", "internal fragmentation", "free"],
        colors=[COLORS["filled"], COLORS["internal"], COLORS["free"]],
        step="post",
    )
    ax.set_ylim(0, 1)
    ax.legend(loc="upper right", fontsize="small")
    return fig


def plot_batch_size(steps: pd.DataFrame) -> Figure:
    """Sequences per step (prefill and decode steps apart) and running sequences."""
    fig, ax = _new("Batch size over time", "simulated time (s)", "sequences")
    s = _thin(steps)
    ax.plot(s["time_s"], s["num_running"], color="#4a5568", lw=0.8, label="running")
    for kind in ("decode", "prefill"):
        k = s[s["kind"] == kind]
        ax.scatter(k["time_s"], k["num_seqs"], s=3, color=COLORS[kind], label=f"{kind} batch")
    ax.legend(loc="upper right", fontsize="small")
    ax.set_ylim(bottom=0)
    return fig


def plot_latency_cdfs(requests: pd.DataFrame) -> Figure:
    """CDFs of TTFT, TPOT and end-to-end latency over finished requests."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), layout="constrained")
    for ax, (column, label) in zip(
        axes,
        (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s/token)"), ("e2e_latency_s", "end-to-end (s)")),
    ):
        values = np.sort(requests[column].dropna().to_numpy())
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), color=COLORS["filled"])
            for p in (50, 99):
                ax.axvline(np.percentile(values, p), ls=":", color="#718096", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of requests")
    fig.suptitle("Latency CDFs (dotted: p50, p99)")
    return fig


def write_run_plots(
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    summary: dict[str, Any],
    folder: Path,
    events: pd.DataFrame | None = None,
) -> list[Path]:
    """Draw the run's standard pictures as PNGs into ``folder``; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    total_slots = int(summary["num_blocks"]) * int(summary["block_size"])
    figures = {
        "free_blocks.png": plot_free_blocks(steps, events),
        "kv_breakdown.png": plot_kv_breakdown(steps, total_slots),
        "batch_size.png": plot_batch_size(steps),
        "latency_cdfs.png": plot_latency_cdfs(requests),
    }
    paths = []
    for name, fig in figures.items():
        path = folder / name
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        paths.append(path)
    return paths
