"""``kvsim validate-real``'s picture: kvsim's signed error against real runs, per stage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from kvsim.plots._common import new_axes

# The figures drawn (row key of kvsim.outputs.validate_real.RealValidation.rows) and the
# acceptance band each is held to (issue 30: E2E and TPOT within 10%, TTFT within 25%).
METRICS = (("error_ttft_ms_pct", "TTFT mean", 25.0),
           ("error_tpot_ms_pct", "TPOT mean", 10.0),
           ("error_e2e_ms_pct", "E2E mean", 10.0),
           ("error_finished_pct", "finished count", 20.0))  # fmt: skip


def plot_real_errors(rows: Sequence[Mapping[str, Any]], *, title: str) -> Figure:
    """Grouped bars: per stage (``workload@rate/s``), the signed error (%) of each mean and of
    the finished count where one was measured; a saturated stage is marked, its means left
    out (they measure the queue)."""
    fig, ax = new_axes(title, "stage", "predicted / measured - 1 (%)", size=(9, 4.5))
    labels = [f"{r['workload']}@{r['rate_per_s']:g}/s" for r in rows]
    x = np.arange(len(rows))
    width = 0.8 / len(METRICS)
    for k, (key, name, band) in enumerate(METRICS):
        values = np.array([np.nan if r["saturated"] else float(r[key]) for r in rows], dtype=float)
        ax.bar(x + (k - 1) * width, np.clip(values, -100, 100), width,
               label=f"{name} (band ±{band:g}%)")  # fmt: skip
    ax.axhspan(-10, 10, color="gray", alpha=0.15)
    ax.axhline(0, color="black", linewidth=0.8)
    for i, r in enumerate(rows):
        if r["saturated"]:
            ax.annotate("saturated", (x[i], 50), ha="center", fontsize=8)
    ax.set_xticks(x, labels, rotation=20, fontsize=8)
    ax.set_ylim(-100, 100)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.legend(fontsize=8)
    return fig
