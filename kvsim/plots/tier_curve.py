"""The two-tier cache curve as heat maps: hit rate of a GPU tier (rows) plus a CPU tier
(columns) of each capacity, LRU as vLLM serves it beside the optimal bound.

Draws the rows of tiers.csv (kvsim.analysis.tier_curve).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvsim.plots._common import COLORS, text_label

_GPU_MARK = {"color": COLORS["preempted"], "linestyle": "--", "linewidth": 1.5}
_CPU_MARK = {"color": COLORS["internal"], "linestyle": "-.", "linewidth": 1.5}
PANELS = (("hit_rate", "LRU, vLLM's offload rules"), ("optimal_hit_rate", "optimal (Belady)"))


def _position(capacity: float, grid: Sequence[float]) -> float | None:
    """Where ``capacity`` (blocks) falls on a categorical axis of ``grid`` capacities: a cell's
    index, between cells interpolated on a log scale; None outside the grid."""
    values = np.asarray(grid, dtype=float)
    for i, value in enumerate(values):
        if value == capacity:
            return float(i)
    order = np.argsort(values)
    finite = [i for i in order if 0 < values[i] < math.inf]
    if capacity <= 0 or math.isinf(capacity) or len(finite) < 2:
        return None
    logs = np.log(values[finite])
    if not logs[0] <= math.log(capacity) <= logs[-1]:
        return None
    return float(np.interp(math.log(capacity), logs, np.asarray(finite, dtype=float)))


def _labels(frame: pd.DataFrame, tier: str, given: Sequence[str] | None) -> list[str]:
    values = frame[f"{tier}_capacity_tokens"].drop_duplicates().tolist()
    if given is not None and len(given) == len(values):
        return [text_label(label) for label in given]
    return ["inf" if math.isinf(v) else f"{v:,.0f}" for v in values]


def plot_tier_curve(
    frame: pd.DataFrame,
    *,
    gpu_labels: Sequence[str] | None = None,
    cpu_labels: Sequence[str] | None = None,
    gpu_mark: tuple[float, str] | None = None,
    cpu_mark: tuple[float, str] | None = None,
    title: str = "Prefix-cache hit rate, GPU + CPU tier",
) -> Figure:
    """Two heat maps (% of prompt tokens): GPU capacity down, CPU capacity across, in the
    order of ``frame``'s rows (tiers.csv's columns). ``gpu_labels`` / ``cpu_labels``: the
    capacities as asked (default: tokens). ``gpu_mark`` / ``cpu_mark``: (blocks, legend label) of a
    capacity to mark with a dashed line (a KV pool, ``--kv-offloading-size``), placed between
    cells on a log scale; outside the grid it is named in the legend only."""
    import matplotlib.pyplot as plt

    gpu = frame["gpu_capacity_blocks"].drop_duplicates().tolist()
    cpu = frame["cpu_capacity_blocks"].drop_duplicates().tolist()
    fig, axes = plt.subplots(1, 2, figsize=(6 + 1.1 * len(cpu), 1.6 + 0.5 * len(gpu)),
                             layout="constrained", squeeze=False)  # fmt: skip
    fig.suptitle(title)
    ylabels, xlabels = _labels(frame, "gpu", gpu_labels), _labels(frame, "cpu", cpu_labels)
    for ax, (column, name) in zip(axes[0], PANELS):
        grid = 100 * frame[column].to_numpy(dtype=float).reshape(len(gpu), len(cpu))
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(float(grid.max()), 1.0),
                          aspect="auto", origin="upper")  # fmt: skip
        for (i, j), value in np.ndenumerate(grid):
            dark = value < 0.6 * image.norm.vmax
            ax.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize="x-small",
                    color="white" if dark else "black")  # fmt: skip
        ax.set_title(name, fontsize="medium")
        ax.set_xticks(range(len(cpu)), xlabels, rotation=30, ha="right", fontsize="small")
        ax.set_yticks(range(len(gpu)), ylabels, fontsize="small")
        ax.set_xlabel("CPU tier capacity")
        ax.set_ylabel("GPU tier capacity")
        for mark, grid_values, draw, style in (
            (gpu_mark, gpu, ax.axhline, _GPU_MARK),
            (cpu_mark, cpu, ax.axvline, _CPU_MARK),
        ):
            if mark is None:
                continue
            where = _position(mark[0], grid_values)
            label = text_label(mark[1], 80)
            if where is None:  # named in the legend only
                ax.plot([], [], label=f"{label} (outside the grid)", **style)
            else:
                draw(where, label=label, **style)
    fig.colorbar(image, ax=axes[0].tolist(), label="hit rate (% of prompt tokens)")
    handles, names = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside lower center", fontsize="small", ncols=2)
    return fig
