"""The offline prefix-cache curve: hit rate against cache capacity, LRU and optimal.

Draws the table kvsim.analysis.cache_curve computes (the rows of curve.csv).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from kvsim.plots._common import COLORS, empty_note, new_axes

POLICY_STYLE: dict[str, dict[str, Any]] = {
    "lru": {"color": COLORS["filled"], "marker": "o", "label": "LRU"},
    "optimal": {"color": COLORS["decode"], "marker": "s", "label": "optimal (Belady)"},
}


def plot_cache_curve(
    curve: pd.DataFrame,
    *,
    pool_tokens: float | None = None,
    pool_label: str = "KV pool",
    title: str = "Prefix-cache hit rate against cache capacity",
) -> Figure:
    """Hit rate (% of prompt tokens) against capacity (tokens, log axis), one line per policy.

    ``curve`` has curve.csv's columns (capacity_tokens, policy, hit_rate, ...). Unlimited
    capacity (``inf`` rows) is drawn as a dotted level per policy; ``pool_tokens`` (a KV pool's
    capacity, tokens) as a vertical line labelled ``pool_label``.
    """
    fig, ax = new_axes(title, "cache capacity (tokens, log scale)", "hit rate (% of prompt tokens)")
    # Fixed margins: the labels are known, and constrained layout would measure every tick
    # label again (half of the picture's 0.5 s, in a command meant to take a few seconds).
    fig.set_layout_engine("none")
    ax.set_position((0.07, 0.13, 0.915, 0.79))  # left, bottom, width, height (figure shares)
    is_finite = np.isfinite(curve["capacity_tokens"].to_numpy(dtype=float))
    finite, unlimited = curve[is_finite], curve[~is_finite]
    if finite.empty:
        empty_note(ax, "no finite capacities to draw")
    for policy, style in POLICY_STYLE.items():
        rows = finite[finite["policy"] == policy].sort_values("capacity_tokens")
        if not rows.empty:
            ax.plot(
                rows["capacity_tokens"].to_numpy(dtype=float),
                100 * rows["hit_rate"].to_numpy(dtype=float),
                markersize=4,
                **style,
            )
    level = unlimited[unlimited["policy"] == "lru"]  # both policies meet there
    if not level.empty:
        rate = 100 * float(level["hit_rate"].iloc[0])
        ax.axhline(rate, color="#718096", linestyle=":", linewidth=1,
                   label=f"unlimited capacity: {rate:.1f}%")  # fmt: skip
    if pool_tokens is not None and math.isfinite(pool_tokens) and pool_tokens > 0:
        ax.axvline(pool_tokens, color=COLORS["preempted"], linestyle="--", linewidth=1.2,
                   label=f"{pool_label}: {pool_tokens:,.0f} tokens")  # fmt: skip
    ax.set_xscale("log")
    # Minor ticks unlabelled: a label per minor tick would be drawn blank anyway over several
    # decades, and measuring them is most of the figure's drawing time.
    ax.xaxis.set_minor_formatter(NullFormatter())
    top = 100 * float(curve["hit_rate"].max()) if not curve.empty else 0.0
    ax.set_ylim(0, max(top * 1.1, 1.0))  # room above the unlimited level
    ax.legend(loc="upper left", fontsize="small")
    return fig
