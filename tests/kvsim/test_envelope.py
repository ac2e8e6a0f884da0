"""Long time series are drawn as envelopes (min / mean / max per time bin) with their events
as markers, and say so in the title; short ones are drawn step by step as before."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvsim.plots import plot_free_blocks, plot_kv_breakdown
from kvsim.plots.envelope import ENVELOPE_BINS, ENVELOPE_MIN_STEPS, envelope


def long_steps(n: int = 100_000, duration_s: float = 10_400.0) -> pd.DataFrame:
    """``n`` steps over ``duration_s`` whose free blocks swing between 0 and 1,000 around a
    slow wave (a spiky band when drawn one by one)."""
    rng = np.random.default_rng(0)
    t = np.linspace(0.0, duration_s, n)
    level = 500 + 300 * np.sin(t / duration_s * 2 * np.pi)
    free = np.clip(level + rng.normal(0, 150, n), 0, 1000).round().astype(int)
    filled = (1000 - free) * 16
    return pd.DataFrame(
        {
            "time_s": t,
            "free_blocks": free,
            "filled_slots": filled,
            "reserved_slots": np.zeros(n, int),
            "internal_frag_slots": np.zeros(n, int),
            "external_frag_slots": np.zeros(n, int),
            "free_slots": free * 16,
        }
    )


def test_envelope_statistics_per_bin() -> None:
    t = np.array([0.0, 0.5, 1.5, 1.6, 3.5])
    v = np.array([4.0, 2.0, 7.0, 9.0, 1.0])
    env = envelope(t, v, 0.0, 4.0, bins=4)
    assert env.edges.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert env.low.tolist()[:2] == [2.0, 7.0] and env.high.tolist()[:2] == [4.0, 9.0]
    assert env.mean.tolist()[:2] == [3.0, 8.0] and np.isnan(env.mean[2])  # an empty bin
    assert env.low[3] == env.mean[3] == env.high[3] == 1.0


def test_a_long_run_draws_free_blocks_as_an_envelope_with_markers() -> None:
    steps = long_steps()
    events = pd.DataFrame(  # 3,000 preemptions: at most one marker per bin
        {"time_s": np.linspace(0, 10_400, 3000), "kind": "PREEMPT", "free_blocks": 0}
    )
    fig = plot_free_blocks(steps, events, num_blocks=1000)
    ax = fig.axes[0]
    assert "100,000 steps: min / mean / max per" in ax.get_title()
    (mean_line,) = [line for line in ax.get_lines() if "mean" in str(line.get_label())]
    y = np.asarray(mean_line.get_ydata(), float)
    assert len(y) == ENVELOPE_BINS + 1 and 350 < np.nanmean(y) < 650  # the level, not noise
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == steps["free_blocks"].min() and band.max() == steps["free_blocks"].max()
    (marks,) = [c for c in ax.collections if str(c.get_label()).startswith("preempt")]
    assert len(marks.get_offsets()) <= ENVELOPE_BINS
    assert marks.get_label() == "preempt (3,000)"  # the legend counts every event
    plt.close(fig)


def test_a_short_run_is_drawn_step_by_step() -> None:
    steps = long_steps(n=ENVELOPE_MIN_STEPS, duration_s=100.0)
    fig = plot_free_blocks(steps)
    ax = fig.axes[0]
    assert ax.get_title() == "Free KV blocks over time"
    assert len(ax.get_lines()[0].get_ydata()) == len(steps)
    plt.close(fig)


def test_the_long_breakdown_stacks_mean_shares_that_sum_to_one() -> None:
    fig = plot_kv_breakdown(long_steps(), 1000 * 16)
    ax = fig.axes[0]
    assert "mean share per" in ax.get_title()
    tops = ax.collections[-1].get_paths()[0].vertices[:, 1]
    assert tops.max() == pytest.approx(1.0)
    plt.close(fig)
