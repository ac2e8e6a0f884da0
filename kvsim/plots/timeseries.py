"""Per-step time series: free blocks, KV memory breakdown, batch size and batched tokens.

Each function takes ``steps.parquet`` (and ``events.parquet`` for marks), an optional time
window [t_from, t_to] in simulated seconds, and returns a Figure. Free blocks and the KV
breakdown over a window of more than ``ENVELOPE_MIN_STEPS`` steps are drawn as envelopes
(kvsim/plots/envelope.py: min / mean / max, or the mean shares, per time bin; the title says
so) with their events as markers, at most one per bin and kind; the batch plot's steps are
thinned to ``MAX_POINTS``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
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
from kvsim.plots.envelope import envelope, envelope_note, first_per_bin, wants_envelope

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
    w = window(steps, t_from, t_to)
    edges = None  # time bins of an envelope: marks are then thinned to one per bin
    if wants_envelope(len(w)):
        edges = _free_blocks_envelope(ax, w, t_from, t_to)
    else:
        s = thin(w)
        ax.step(s["time_s"], s["free_blocks"], where="post", color=COLORS["filled"], lw=1,
                label="free blocks")  # fmt: skip
        if "cached_blocks" in s:
            ax.fill_between(
                s["time_s"], s["free_blocks"] - s["cached_blocks"], s["free_blocks"],
                step="post", color=COLORS["cached"], alpha=0.6, lw=0,
                label="of which cached, evictable",
            )  # fmt: skip
    if "cached_blocks" in w and events is not None:
        _mark_evictions(ax, events, t_from, t_to, edges)
    if num_blocks is not None:
        ax.axhline(num_blocks, ls="--", lw=0.8, color="#718096", label=f"pool ({num_blocks:,})")
    if events is not None:
        marked = window(events[events["kind"].isin([k for k, _, _ in MARKS])], t_from, t_to)
        for kind, marker, color in MARKS:
            e = marked[marked["kind"] == kind]
            e = thin(e) if edges is None else e.iloc[first_per_bin(e["time_s"], edges)]
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
    if not len(w):
        empty_note(ax)
    ax.set_ylim(bottom=0)
    set_time_limits(ax, t_from, t_to)
    return fig


def _span(w: pd.DataFrame, t_from: float | None, t_to: float | None) -> tuple[float, float]:
    """The time span (s) an envelope bins: the window asked, else the steps' own."""
    lo = t_from if t_from is not None else float(w["time_s"].iloc[0])
    return lo, t_to if t_to is not None else float(w["time_s"].iloc[-1])


def _free_blocks_envelope(
    ax: Axes, w: pd.DataFrame, t_from: float | None, t_to: float | None
) -> np.ndarray:
    """Free blocks of the steps ``w`` as min-max band and mean line per time bin (a v1 run:
    the mean cached, evictable blocks shaded under the mean); returns the bin edges (s)."""
    lo, hi = _span(w, t_from, t_to)
    t = w["time_s"].to_numpy()
    env = envelope(t, w["free_blocks"].to_numpy(), lo, hi)
    ax.fill_between(
        env.edges, env.post(env.low), env.post(env.high), step="post", color=COLORS["filled"],
        alpha=0.3, lw=0, label="free blocks: min-max per bin",
    )  # fmt: skip
    ax.step(env.edges, env.post(env.mean), where="post", color=COLORS["filled"], lw=1,
            label="free blocks: mean per bin")  # fmt: skip
    if "cached_blocks" in w:
        cached = envelope(t, w["cached_blocks"].to_numpy(), lo, hi).mean
        ax.fill_between(
            env.edges, env.post(env.mean - cached), env.post(env.mean), step="post",
            color=COLORS["cached"], alpha=0.6, lw=0, label="of which cached, evictable (mean)",
        )  # fmt: skip
    ax.set_title(f"Free KV blocks over time ({envelope_note(env)})")
    return env.edges


def _mark_evictions(
    ax: Axes,
    events: pd.DataFrame,
    t_from: float | None,
    t_to: float | None,
    edges: np.ndarray | None = None,
) -> None:
    """EVICT events (one mark per event, thinned; one per bin of ``edges`` when given) at the
    free-block count after them."""
    evict = events[events["kind"] == "EVICT"]
    if not len(evict):
        return
    blocks = evict.groupby(["time_s", "free_blocks"], sort=False, observed=True).size()
    marks = window(blocks.reset_index(name="blocks"), t_from, t_to)
    marks = thin(marks) if edges is None else marks.iloc[first_per_bin(marks["time_s"], edges)]
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
    w = window(steps, t_from, t_to)
    s = w if wants_envelope(len(w)) else thin(w)
    shares = breakdown_shares(s, total_slots)
    times = s["time_s"].to_numpy()
    values = [np.asarray(v, dtype=np.float64) for v in shares.values()]
    if wants_envelope(len(s)):  # the mean share of each class per time bin: still sums to 1
        lo, hi = _span(s, t_from, t_to)
        envs = [envelope(times, v, lo, hi) for v in values]
        times = envs[0].edges
        values = [e.post(e.mean) for e in envs]
        ax.set_title(f"KV memory breakdown ({envs[0].steps:,} steps: mean share per "
                     f"{times[1] - times[0]:.3g} s)")  # fmt: skip
    colors = {label: color for _, label, color in (*BREAKDOWN, CACHED_CLASS)}
    ax.stackplot(
        times,
        *values,
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
