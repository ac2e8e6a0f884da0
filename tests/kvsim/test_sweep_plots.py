"""Sweep figures say what they draw: memory bars stack every part of the KV breakdown (each
reaches 100%, the legend names each part), and a hit-rate panel over a sweep without a single
prefix-cache hit says so instead of drawing a flat zero."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvsim.sweep.plots import BREAKDOWN, Layout, plot_memory, plot_prefix_cache


def sweep_table(cached: float | None, hit_rate: float = 0.0) -> pd.DataFrame:
    """Three ok points over block sizes; shares that sum to 1 with ``cached`` (None: a
    classic sweep, no cached column values)."""
    n = 3
    free = 0.2 if cached is None else 0.2 - cached
    return pd.DataFrame(
        {
            "status": ["ok"] * n,
            "block_size": [16, 32, 64],
            "kv_token_state_share_mean": [0.5] * n,
            "kv_reservation_share_mean": [0.2] * n,
            "kv_internal_frag_share_mean": [0.05] * n,
            "kv_external_frag_share_mean": [0.05] * n,
            "kv_cached_share_mean": [np.nan if cached is None else cached] * n,
            "kv_free_share_mean": [free] * n,
            "prefix_cache_queries": [1000] * n,
            "prefix_cache_hit_rate": [hit_rate] * n,
            "ttft_s_p50": [0.1] * n,
            "ttft_s_p99": [0.2] * n,
            "block_walk_share": [0.01] * n,
        }
    )


def bar_tops(fig: plt.Figure) -> np.ndarray:
    heights: dict[float, float] = {}
    for patch in fig.axes[0].patches:
        x = round(patch.get_x(), 6)
        heights[x] = max(heights.get(x, 0.0), patch.get_y() + patch.get_height())
    return np.array(list(heights.values()))


@pytest.mark.parametrize("cached", [0.15, None])
def test_memory_bars_reach_100_percent_and_the_legend_names_every_part(
    cached: float | None,
) -> None:
    fig = plot_memory(sweep_table(cached), Layout.of(["block_size"]))
    assert bar_tops(fig) == pytest.approx([1.0, 1.0, 1.0])
    legend = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    drawn = [label for column, label, _ in BREAKDOWN if cached or column != "kv_cached_share_mean"]
    assert sorted(legend) == sorted(drawn)
    assert ("cached, evictable" in legend) == (cached is not None)
    plt.close(fig)


def test_a_sweep_without_hits_says_so_on_the_hit_rate_panel() -> None:
    fig = plot_prefix_cache(sweep_table(0.0, hit_rate=0.0), Layout.of(["block_size"]))
    assert any("no prefix-cache hit" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)
    fig = plot_prefix_cache(sweep_table(0.1, hit_rate=0.3), Layout.of(["block_size"]))
    assert not fig.axes[0].texts
    plt.close(fig)
