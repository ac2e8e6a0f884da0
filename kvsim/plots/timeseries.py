"""Per-step time series: free blocks, KV memory breakdown, batch size and batched tokens.

Each function takes ``steps.parquet`` (and ``events.parquet`` for marks), an optional time
window [t_from, t_to] in simulated seconds, and returns a Figure. Steps are thinned to
``MAX_POINTS`` after windowing.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kvsim.plots._common import (
    COLORS,
    empty_note,
    new_axes,
    set_time_limits,
    thin,
    window,
)

MARKS = (("PREEMPT", "v", COLORS["preempted"]), ("REJECT", "x", COLORS["reject"]))
EVICT_MARK = ("EVICT", "|", COLORS["evict"])


def plot_free_blocks(
    steps: pd.DataFrame,
    events: pd.DataFrame | None = None,
    *,
    num_blocks: int | None = None,
    t_from: float | None = None,
    t_to: float | None = None,
) -> Figure:
    """Free KV blocks at each step (after scheduling it); preemptions and rejections marked
    at the free-block count after them when ``events`` is given; the pool size as a dashed
    line when ``num_blocks`` is given. A v1 run (steps with ``cached_blocks``) also shades
    the free blocks that are cached, evictable, and marks its evictions (``EVICT`` events:
    the free queue reused cached blocks)."""
    fig, ax = new_axes("Free KV blocks over time", "simulated time (s)", "free blocks")
    s = thin(window(steps, t_from, t_to))
    ax.step(s["time_s"], s["free_blocks"], where="post", color=COLORS["filled"], lw=1)
    if "cached_blocks" in s:
        ax.fill_between(
            s["time_s"], s["free_blocks"] - s["cached_blocks"], s["free_blocks"], step="post",
            color=COLORS["cached"], alpha=0.6, lw=0, label="of which cached, evictable",
        )  # fmt: skip
        if events is not None:
            _mark_evictions(ax, events, t_from, t_to)
    if num_blocks is not None:
        ax.axhline(num_blocks, ls="--", lw=0.8, color="#718096", label=f"pool ({num_blocks:,})")
    if events is not None:
        marked = window(events[events["kind"].isin([k for k, _, _ in MARKS])], t_from, t_to)
        for kind, marker, color in MARKS:
            e = thin(marked[marked["kind"] == kind])
            if len(e):
                ax.scatter(
                    e["time_s"],
                    e["free_blocks"],
                    marker=marker,
                    color=color,
                    s=18,
                    label=f"{kind.lower()} ({int((marked['kind'] == kind).sum()):,})",
                    zorder=3,
                )
    if ax.get_legend_handles_labels()[0]:
        fig.legend(loc="outside lower center", ncol=3, fontsize="small")
    if not len(s):
        empty_note(ax)
    ax.set_ylim(bottom=0)
    set_time_limits(ax, t_from, t_to)
    return fig


def _mark_evictions(
    ax: Axes, events: pd.DataFrame, t_from: float | None, t_to: float | None
) -> None:
    """EVICT events (one mark per event, thinned) at the free-block count after them."""
    evict = events[events["kind"] == "EVICT"]
    if not len(evict):
        return
    blocks = evict.groupby(["time_s", "free_blocks"], sort=False, observed=True).size()
    marks = thin(window(blocks.reset_index(name="blocks"), t_from, t_to))
    _, marker, color = EVICT_MARK
    ax.scatter(
        marks["time_s"], marks["free_blocks"], marker=marker, color=color, s=14, zorder=3,
        label=f"eviction ({len(evict):,} blocks)",
    )  # fmt: skip


# Slot classes of kvsim.analysis.kv_breakdown (steps columns, when the run has them), bottom to top.
BREAKDOWN = (
    ("filled_slots", "token states (filled)", COLORS["filled"]),
    ("reserved_slots", "reservation", "#63b3ed"),
    ("internal_frag_slots", "internal fragmentation", COLORS["internal"]),
    ("external_frag_slots", "external fragmentation", "#e53e3e"),
    ("free_slots", "free", COLORS["free"]),
)
# A v1 run's class between external fragmentation and free: free blocks keeping their key.
CACHED_CLASS = ("cached_slots", "cached, evictable", COLORS["cached"])


def breakdown_shares(steps: pd.DataFrame, total_slots: int) -> dict[str, pd.Series]:
    """Share of ``total_slots`` in each slot class per step (label -> series). With the
    columns of ``kvsim.analysis.kv_breakdown`` every class is drawn (a v1 run's
    ``cached_slots`` too); otherwise filled, internal fragmentation (allocated - filled) and
    free."""
    if all(column in steps for column, _, _ in BREAKDOWN):
        classes = list(BREAKDOWN)
        if CACHED_CLASS[0] in steps:
            classes.insert(len(classes) - 1, CACHED_CLASS)
        return {label: steps[column] / total_slots for column, label, _ in classes}
    filled = steps["filled_slots"] / total_slots
    internal = (steps["allocated_slots"] - steps["filled_slots"]) / total_slots
    return {
        "token states (filled)": filled,
        "internal fragmentation": internal,
        "free": 1.0 - filled - internal,
    }


def plot_kv_breakdown(
    steps: pd.DataFrame,
    total_slots: int,
    *,
    t_from: float | None = None,
    t_to: float | None = None,
) -> Figure:
    """KV slots over time as a stacked area of shares of ``total_slots`` (see
    ``breakdown_shares``): token states, reservation, internal and external fragmentation,
    free."""
    fig, ax = new_axes("KV memory breakdown", "simulated time (s)", "share of KV slots")
    s = thin(window(steps, t_from, t_to))
    shares = breakdown_shares(s, total_slots)
    colors = {label: color for _, label, color in (*BREAKDOWN, CACHED_CLASS)}
    ax.stackplot(
        s["time_s"],
        *shares.values(),
        labels=list(shares),
        colors=[colors[label] for label in shares],
        step="post",
    )
    if not len(s):
        empty_note(ax)
    ax.set_ylim(0, 1)
    fig.legend(loc="outside lower center", ncol=min(len(shares), 5), fontsize="small")
    set_time_limits(ax, t_from, t_to)
    return fig


def plot_batch_size(
    steps: pd.DataFrame, *, t_from: float | None = None, t_to: float | None = None
) -> Figure:
    """Top: sequences per step (prefill, decode and, under v1, mixed batches apart) and
    running sequences.
    Bottom: tokens computed per step (batched tokens)."""
    fig: Figure
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 5.5), sharex=True, layout="constrained", height_ratios=(1, 1)
    )
    s = thin(window(steps, t_from, t_to))
    top.plot(s["time_s"], s["num_running"], color=COLORS["running"], lw=0.8, label="running")
    kinds = ["decode", "prefill"] + (["mixed"] if (s["kind"] == "mixed").any() else [])
    for kind in kinds:  # v1: mixed steps run decodes and prefill chunks together
        k = s[s["kind"] == kind]
        top.scatter(k["time_s"], k["num_seqs"], s=3, color=COLORS[kind], label=f"{kind} step")
        bottom.scatter(k["time_s"], k["num_batched_tokens"], s=3, color=COLORS[kind])
    top.set_title("Batch size and batched tokens over time")
    top.set_ylabel("sequences")
    top.set_ylim(bottom=0)
    bottom.set_ylabel("batched tokens (log)")
    bottom.set_xlabel("simulated time (s)")
    if len(s):
        bottom.set_yscale("log")  # decode steps batch a few tokens, prefills thousands
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        if not len(s):
            empty_note(ax)
    fig.legend(loc="outside lower center", ncol=3, fontsize="small", markerscale=3)
    set_time_limits(bottom, t_from, t_to)
    return fig
