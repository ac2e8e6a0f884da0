"""Pictures of the cost model's calibration: predicted against measured times.

``kvsim validate`` draws one scatter per GPU and kind of work from kvsim.costmodel.validate's
error frames; ``kvsim validate-run`` draws the steps of an engine-mode run priced by the
calibrated cost model, and the two runs' step times over time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvsim.plots._common import COLORS, new_axes, thin


def plot_predicted_vs_measured(errors: pd.DataFrame, *, color_by: str, title: str) -> Figure:
    """Log-log scatter of ``predicted_s`` against ``measured_s`` (ms), one colour per value of
    ``color_by``, with the y = x line and ±10% bands (the frames of kvsim.costmodel.validate, or
    any frame with those two columns)."""
    fig, ax = new_axes(title, "measured (ms)", "predicted (ms)", size=(6, 6))
    for name, group in errors.groupby(color_by, sort=True):
        group = thin(group)
        ax.scatter(
            group["measured_s"] * 1e3, group["predicted_s"] * 1e3, s=4, alpha=0.5, label=str(name)
        )
    both = np.concatenate([errors["measured_s"].to_numpy(), errors["predicted_s"].to_numpy()])
    line = np.array([both.min(), both.max()]) * 1e3
    ax.plot(line, line, color="black", linewidth=1, label="predicted = measured")
    ax.plot(line, 1.1 * line, color="gray", linewidth=0.8, linestyle="--", label="±10%")
    ax.plot(line, line / 1.1, color="gray", linewidth=0.8, linestyle="--")
    ax.set(xscale="log", yscale="log")
    ax.legend(fontsize=7, markerscale=3)
    return fig


def plot_step_time_validation(steps: pd.DataFrame, *, title: str) -> Figure:
    """Engine-mode steps: measured and predicted step time (ms) against simulated time, by
    kind; ``steps`` has ``time_s``, ``kind``, ``measured_s`` and ``predicted_s``."""
    fig, ax = new_axes(title, "simulated time (s)", "step time (ms, log)")
    shown = thin(steps)
    for kind, group in shown.groupby("kind", sort=True):
        color = COLORS.get(str(kind), COLORS["running"])
        ax.scatter(
            group["time_s"], group["measured_s"] * 1e3, s=6, color=color, label=f"{kind} measured"
        )
        ax.scatter(
            group["time_s"],
            group["predicted_s"] * 1e3,
            s=6,
            marker="x",
            color="black",
            alpha=0.5,
            label=f"{kind} predicted",
        )
    ax.set_yscale("log")
    ax.legend(fontsize=7, markerscale=2)
    return fig
