"""Several runs side by side: a table of their summaries, metrics against a swept option, and
their mean KV memory breakdown as stacked bars."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvsim.plots._common import COLORS
from kvsim.plots.timeseries import BREAKDOWN

# summary.json fields of the mean breakdown (kvsim.analysis.kv_breakdown), matching BREAKDOWN's
# classes.
BREAKDOWN_FIELDS = (
    "kv_token_state_share_mean",
    "kv_reservation_share_mean",
    "kv_internal_frag_share_mean",
    "kv_external_frag_share_mean",
    "kv_free_share_mean",
)


def summaries_frame(summaries: Mapping[Any, Mapping[str, Any]], index_name: str) -> pd.DataFrame:
    """One row per run (index: the mapping's keys, named ``index_name``); scalar summary
    fields as they are, each distribution ``{mean, p50, ...}`` as ``<field>_<stat>`` columns."""
    rows = []
    for summary in summaries.values():
        row: dict[str, Any] = {}
        for key, value in summary.items():
            if isinstance(value, Mapping):
                row.update({f"{key}_{stat}": v for stat, v in value.items()})
            else:
                row[key] = value
        rows.append(row)
    return pd.DataFrame(rows, index=pd.Index(list(summaries), name=index_name))


def plot_metrics_vs(
    table: pd.DataFrame, metrics: Sequence[str], *, title: str = "", log_x: bool = False
) -> Figure:
    """One small panel per column of ``table`` in ``metrics``, against its index (the swept
    option, e.g. block size)."""
    cols = min(len(metrics), 3)
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.6 * cols, 2.9 * rows), layout="constrained", squeeze=False
    )
    x = table.index.to_numpy()
    for ax, metric in zip(axes.flat, metrics):
        ax.plot(x, table[metric].to_numpy(dtype=float), marker="o", color=COLORS["filled"])
        ax.set_title(metric, fontsize="small")
        ax.set_xlabel(str(table.index.name))
        ax.grid(alpha=0.3)
        if log_x:
            ax.set_xscale("log", base=2)
            ax.set_xticks(x, [str(v) for v in x])
    for ax in axes.flat[len(metrics) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


def breakdown_table(table: pd.DataFrame) -> pd.DataFrame:
    """Mean share of the KV slots in each class per run (columns: class labels). Uses the
    breakdown fields of summary.json when present, else kv_usage_mean and
    internal_fragmentation_mean (token states = usage - internal fragmentation)."""
    if all(f in table for f in BREAKDOWN_FIELDS):
        labels = [label for _, label, _ in BREAKDOWN]
        return table[list(BREAKDOWN_FIELDS)].set_axis(labels, axis=1).astype(float)
    usage = table["kv_usage_mean"].astype(float)
    internal = table["internal_fragmentation_mean"].astype(float)
    return pd.DataFrame(
        {
            "token states (filled)": usage - internal,
            "internal fragmentation": internal,
            "free": 1.0 - usage,
        },
        index=table.index,
    )


def plot_breakdown_bars(table: pd.DataFrame, *, title: str = "Mean KV memory breakdown") -> Figure:
    """Stacked bars, one per run (row of ``summaries_frame``), of ``breakdown_table``: where
    the KV slots went on average over the busy time."""
    shares = breakdown_table(table)
    colors = {label: color for _, label, color in BREAKDOWN}
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(shares), 4), layout="constrained")
    x = np.arange(len(shares))
    bottom = np.zeros(len(shares))
    for label in shares.columns:
        values = shares[label].to_numpy()
        ax.bar(x, values, bottom=bottom, color=colors[label], label=label, width=0.7)
        bottom += values
    ax.set_xticks(x, [str(i) for i in shares.index])
    ax.set_xlabel(str(shares.index.name))
    ax.set_ylabel("share of KV slots (time mean)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    fig.legend(loc="outside right upper", fontsize="small")
    return fig


def plot_step_times(steps_by_run: Mapping[str, pd.DataFrame]) -> Figure:
    """Duration of every step (ms, log scale) against its step number, one colour per run
    (e.g. cost mode's predictions next to engine mode's measurements); prefill steps as
    triangles, decode steps as dots."""
    fig, ax = plt.subplots(figsize=(9, 4), layout="constrained")
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (label, steps), color in zip(steps_by_run.items(), palette):
        for kind, marker in (("decode", "."), ("prefill", "^")):
            k = steps[steps["kind"] == kind]
            ax.scatter(
                k["step"],
                k["duration_s"] * 1e3,
                s=10,
                marker=marker,
                color=color,
                label=f"{label}: {kind}",
            )
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms, log)")
    ax.set_title("Step times")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small")
    return fig
