"""Figures of a sweep: metrics against the swept option, one line per combination of the
other swept options. Each function takes sweep.csv's table and returns a matplotlib Figure.

The x axis is the block size when it is swept, else the rate, else the first swept option;
block sizes (and rates spanning 8x or more) use a log2 axis. Failed points are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kvsim.plots._common import text_label

BREAKDOWN = (
    ("kv_token_state_share_mean", "token states", "#2b6cb0"),
    ("kv_reservation_share_mean", "reservation", "#63b3ed"),
    ("kv_internal_frag_share_mean", "internal fragmentation", "#ed8936"),
    ("kv_external_frag_share_mean", "external fragmentation", "#e53e3e"),
    ("kv_cached_share_mean", "cached, evictable", "#68d391"),  # v1: free, keeping their key
    ("kv_free_share_mean", "free", "#e2e8f0"),
)
LABELS = {
    "block_size": "block size (tokens)",
    "rate": "request rate (requests/s)",
    "allocator": "allocator",
    "kv_slots": "KV capacity (tokens)",
}


@dataclass(frozen=True, slots=True)
class Layout:
    """How to draw a sweep: the x column and the columns that split it into series."""

    x: str | None
    series: tuple[str, ...]

    @classmethod
    def of(cls, axis_names: Sequence[str]) -> Layout:
        names = list(axis_names)
        for x in ("block_size", "rate"):
            if x in names:
                return cls(x, tuple(n for n in names if n != x))
        return cls(names[0], tuple(names[1:])) if names else cls(None, ())

    @property
    def xlabel(self) -> str:
        return LABELS.get(self.x or "", self.x or "")


def _series(table: pd.DataFrame, layout: Layout) -> list[tuple[str, pd.DataFrame]]:
    ok = table[table["status"] == "ok"]
    if not layout.series:
        return [("", ok)]
    out = []
    for key, group in ok.groupby(list(layout.series), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{n}={_value(v)}" for n, v in zip(layout.series, key))
        out.append((text_label(name, 60), group))
    return out


def _value(value: Any) -> str:
    """A series value as typed: ``true``, ``16`` (not ``16.0``), ``200,000`` tokens."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, float, np.integer, np.floating)) and float(value).is_integer():
        return f"{int(value):,}" if abs(value) >= 10_000 else str(int(value))
    return str(value)


def _x_values(table: pd.DataFrame, layout: Layout) -> tuple[dict[Any, float], bool, list[Any]]:
    """Position of each x value, whether the axis is log2, and the tick values."""
    if layout.x is None:
        return {None: 0.0}, False, [None]
    values = [v for v in dict.fromkeys(table[layout.x].tolist()) if not pd.isna(v)]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if not numeric:
        return {v: float(i) for i, v in enumerate(values)}, False, values
    positive = [float(v) for v in values if v is not None and v > 0]
    log = (
        bool(positive)
        and len(positive) == len(values)
        and (layout.x == "block_size" or max(positive) / min(positive) >= 8)
    )
    return {v: float(v) for v in values}, log, sorted(values)


def _setup_x(ax: Axes, table: pd.DataFrame, layout: Layout) -> dict[Any, float]:
    pos, log, ticks = _x_values(table, layout)
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xticks([pos[v] for v in ticks], [text_label(v) if v is not None else "" for v in ticks])
    ax.minorticks_off()
    ax.set_xlabel(layout.xlabel)
    ax.grid(alpha=0.3)
    return pos


def _lines(
    ax: Axes,
    table: pd.DataFrame,
    layout: Layout,
    column: str,
    *,
    style: str = "-",
    labelled: bool = True,
) -> None:
    """One line per series of ``column`` against x, coloured by series (C0, C1, ...); only
    ``labelled`` lines enter the figure's legend."""
    pos = _setup_x(ax, table, layout)
    for i, (name, group) in enumerate(_series(table, layout)):
        group = group.sort_values(layout.x) if layout.x else group
        x = [pos[v] for v in (group[layout.x] if layout.x else [None] * len(group))]
        label = name if labelled and name else None
        ax.plot(x, group[column].astype(float), style, marker="o", color=f"C{i}", label=label)


def _finish(fig: Figure, axes: Sequence[Axes]) -> Figure:
    """y from 0; one legend for the figure (the series), outside the panels on the right."""
    for ax in axes:
        ax.set_ylim(bottom=0)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return fig


def plot_throughput(table: pd.DataFrame, layout: Layout) -> Figure:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    _lines(a, table, layout, "throughput_requests_per_s")
    a.set_title("request throughput")
    a.set_ylabel("requests/s")
    _lines(b, table, layout, "throughput_output_tokens_per_s")
    b.set_title("output token throughput")
    b.set_ylabel("output tokens/s")
    return _finish(fig, (a, b))


def plot_latency(table: pd.DataFrame, layout: Layout) -> Figure:
    """TTFT, TPOT and end-to-end latency: p50 (solid) and p99 (dashed)."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), layout="constrained")
    for ax, (name, title) in zip(
        axes, (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_latency_s", "end-to-end latency"))
    ):
        _lines(ax, table, layout, f"{name}_p50")
        _lines(ax, table, layout, f"{name}_p99", style="--", labelled=False)
        ax.set_title(title)
        ax.set_ylabel("seconds")
    fig.suptitle("latency percentiles: p50 solid, p99 dashed", fontsize="medium")
    return _finish(fig, axes)


def plot_normalized_latency(table: pd.DataFrame, layout: Layout) -> Figure:
    fig, ax = plt.subplots(figsize=(8.5, 3.8), layout="constrained")
    _lines(ax, table, layout, "normalized_latency_s_per_token")
    ax.set_title("normalized latency (mean end-to-end latency / output tokens)")
    ax.set_ylabel("s / token")
    return _finish(fig, (ax,))


def plot_batch(table: pd.DataFrame, layout: Layout) -> Figure:
    """Mean (solid) and max (dashed) batch size, and preemptions."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    _lines(a, table, layout, "mean_batch_size")
    _lines(a, table, layout, "max_batch_size", style="--", labelled=False)
    a.set_title("batch size: mean solid, max dashed")
    a.set_ylabel("sequences")
    _lines(b, table, layout, "num_preemptions", labelled=False)
    b.set_title("preemptions")
    b.set_ylabel("count")
    return _finish(fig, (a, b))


def plot_memory(table: pd.DataFrame, layout: Layout) -> Figure:
    """Time-averaged KV breakdown as stacked bars: one panel per series. Every part in the
    table is stacked and in the legend, so each bar reaches 100%; the cached, evictable part
    only where a point has one (v1 runs)."""
    series = _series(table, layout)
    parts = [p for p in BREAKDOWN if p[0] in table and table[p[0]].notna().any()]
    cols = min(len(series), 2)
    rows = -(-len(series) // cols)
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(6.5 * cols, 3.6 * rows),
        layout="constrained",
        squeeze=False,
        sharey=True,
    )
    for ax, (name, group) in zip(axes.flat, series):
        group = group.sort_values(layout.x) if layout.x else group
        ticks = [text_label(v) for v in group[layout.x]] if layout.x else ["point"]
        x = np.arange(len(group))
        bottom = np.zeros(len(group))
        for column, label, color in parts:
            share = group[column].astype(float).fillna(0).to_numpy()
            ax.bar(x, share, 0.7, bottom=bottom, color=color, label=label, edgecolor="white")
            bottom += share
        tokens = group[BREAKDOWN[0][0]].astype(float).fillna(0).to_numpy()
        for xi, t in zip(x, tokens):
            ax.text(
                xi,
                t / 2,
                f"{t:.0%}",
                ha="center",
                va="center",
                color="white",
                fontsize="small",
                fontweight="bold",
            )
        ax.set_xticks(x, ticks)
        ax.set_xlabel(layout.xlabel)
        ax.set_ylim(0, 1)
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.set_title(name or "KV memory")
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    axes.flat[0].set_ylabel("share of KV slots (time average)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right upper", fontsize="small")
    return fig


NO_HITS_NOTE = (
    "no prefix-cache hit at any point:\nthe trace gives no prefix identity\n(no hash_ids or "
    "session ids: docs/formats.md)\nor no prefix recurs"
)


def has_prefix_cache(table: pd.DataFrame) -> bool:
    """Whether any successful point measured prefix-cache queries (a v1 run)."""
    if "prefix_cache_queries" not in table:
        return False
    ok = table[table["status"] == "ok"]
    return bool(pd.to_numeric(ok["prefix_cache_queries"], errors="coerce").fillna(0).gt(0).any())


def plot_prefix_cache(table: pd.DataFrame, layout: Layout) -> Figure:
    """Prefix-cache hit rate (share of prompt tokens, first admissions), TTFT (p50 solid, p99
    dashed) and the block-table walk's share of busy time, against the x axis: the block
    size trade-off, one line per combination of the other options (capacity, caching, ...)."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), layout="constrained")
    hit, ttft, walk = axes
    _lines(hit, table, layout, "prefix_cache_hit_rate")
    hit.set_title("prefix-cache hit rate")
    hit.set_ylabel("share of prompt tokens")
    hit.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    _lines(ttft, table, layout, "ttft_s_p50", labelled=False)
    _lines(ttft, table, layout, "ttft_s_p99", style="--", labelled=False)
    ttft.set_title("TTFT: p50 solid, p99 dashed")
    ttft.set_ylabel("seconds")
    _lines(walk, table, layout, "block_walk_share", labelled=False)
    walk.set_title("block-table walk (per-block cost)")
    walk.set_ylabel("share of busy time")
    walk.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    fig = _finish(fig, axes)
    ok = table[table["status"] == "ok"]
    top = pd.to_numeric(ok["prefix_cache_hit_rate"], errors="coerce").max()
    hit.set_ylim(0, min(1.0, max(1.15 * float(top), 0.05)) if top == top else 1.0)
    if not top > 0:  # a flat zero would read as a measured 0% for every configuration
        hit.text(
            0.5, 0.55, NO_HITS_NOTE, transform=hit.transAxes, ha="center", va="center",
            color="#4a5568", fontsize="small", wrap=True,
            bbox={"facecolor": "white", "edgecolor": "#a0aec0", "boxstyle": "round"},
        )  # fmt: skip
    return fig


def plot_hit_rate_vs_curve(
    curve: pd.DataFrame, bounds: pd.DataFrame, *, series: Sequence[str] = ()
) -> Figure:
    """The offline cache curve of one block size (curve.csv's rows: LRU and optimal against
    capacity) with the simulated hit rates of a sweep's points at their ``kv_slots`` as large
    markers, one colour per combination of the ``series`` columns (e.g. ``rate``). ``bounds``:
    :func:`kvsim.sweep.cache_bound.hit_rate_bounds` rows of that block size."""
    from kvsim.plots import plot_cache_curve

    sizes = sorted(set(bounds["block_size"].astype(int)))
    title = f"Prefix-cache hit rate: simulated vs the cache curve (block size {sizes[0]})"
    fig = plot_cache_curve(curve, title=title)
    ax = fig.axes[0]
    for i, (name, group) in enumerate(_series(bounds, Layout("kv_slots", tuple(series)))):
        group = group.sort_values("kv_slots")
        ax.plot(
            group["kv_slots"].astype(float),
            100 * group["prefix_cache_hit_rate"].astype(float),
            "D",
            markersize=9,
            color=f"C{(i + 1) % 10}",
            markeredgecolor="black",
            label=f"simulated{' ' + name if name else ''} (pool of kv_slots tokens)",
        )
    ax.legend(loc="upper left", fontsize="small")
    return fig


def plot_slo(
    table: pd.DataFrame, layout: Layout, percentile: int, ttft: float | None, tpot: float | None
) -> Figure:
    """TTFT and TPOT at the SLO percentile against the rate, with the SLO bounds."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    for ax, (name, bound, title) in zip(axes, (("ttft_s", ttft, "TTFT"), ("tpot_s", tpot, "TPOT"))):
        _lines(ax, table, layout, f"{name}_p{percentile}", labelled=ax is axes[0])
        slo = ""
        if bound is not None:
            ax.axhline(bound, color="#c53030", linestyle=":")
            slo = f" (SLO {bound:g} s, dotted)"
        ax.set_title(f"p{percentile} {title}{slo}")
        ax.set_ylabel("seconds (log)")
    _finish(fig, axes)
    for ax in axes:  # latencies past saturation grow by orders of magnitude
        ax.set_yscale("log")
        ax.relim()
        ax.autoscale_view()
    return fig


def sweep_figures(
    table: pd.DataFrame,
    axis_names: Sequence[str],
    *,
    slo: tuple[int, float | None, float | None] | None = None,
) -> dict[str, Figure]:
    """Every figure of the report, by file stem, in reading order."""
    layout = Layout.of(axis_names)
    figures = {
        "throughput": plot_throughput(table, layout),
        "latency": plot_latency(table, layout),
        "normalized_latency": plot_normalized_latency(table, layout),
        "memory": plot_memory(table, layout),
        "batch": plot_batch(table, layout),
    }
    if has_prefix_cache(table):
        figures["prefix_cache"] = plot_prefix_cache(table, layout)
    if slo is not None and layout.x == "rate":
        figures["slo"] = plot_slo(table, layout, *slo)
    return figures
