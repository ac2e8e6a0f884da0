"""Pictures of a KV offloading run (``kvsim run --kv-offloading-size GiB``; docs/offload.md):
the CPU tier's occupancy and evictions, prompt tokens by source, the TTFT of the requests that
loaded split into queueing, loading and computing, and the transfers' times.

They read the offload columns of steps.parquet and requests.parquet, summary.json's ``offload``
section and the ``OFFLOAD_*`` events (docs/metrics.md, "KV offloading"); a run without offload
draws none of them (``is_offload``).
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from kvsim.analysis.offload_tables import DIRECTIONS, transfer_jobs, ttft_split
from kvsim.plots._common import COLORS, empty_note, new_axes, set_time_limits, thin, window

# Picture name -> file name in a run folder's plots/.
OFFLOAD_PICTURES = {
    "offload-tier": "offload_tier.png",
    "offload-sources": "offload_sources.png",
    "offload-ttft": "offload_ttft.png",
    "offload-transfers": "offload_transfers.png",
}
OFFLOAD_CAPTIONS = {
    "offload-tier": "CPU offload tier: chunks held after each step against its capacity, and "
    "chunks evicted from it (cumulative).",
    "offload-sources": "Prompt tokens by source at each request's first admission (vLLM's "
    "prompt-token metrics): computed, GPU prefix-cache hit, loaded from the CPU tier; per "
    "interval and for the run.",
    "offload-ttft": "TTFT of the requests that loaded from the CPU tier, split into queueing "
    "(arrival to load issued), loading (to admission) and computing (to the first token), "
    "requests sorted by TTFT.",
    "offload-transfers": "Loads and stores: how long each held its GPU blocks (issue to the "
    "completion the scheduler sees, at step granularity); the link's own transfer time "
    "p50 / p99 (summary.json) marked.",
}
# Where each source's tokens come from, in the order they are stacked.
SOURCES = (
    ("local_compute", "computed", COLORS["prefill"]),
    ("local_cache_hit", "GPU prefix-cache hit", COLORS["cached"]),
    ("external_kv_transfer", "loaded from CPU tier", COLORS["offload"]),
)
TTFT_PARTS = (
    ("queueing", COLORS["queued"]),
    ("loading", COLORS["offload"]),
    ("computing", COLORS["prefill"]),
)
DIRECTION_COLORS = {"load": COLORS["offload"], "store": COLORS["store"]}
DEFAULT_BINS = 60


def is_offload(requests: pd.DataFrame) -> bool:
    """Whether a run's requests table is an offloading run's (it has offload columns)."""
    return "offload_hit_tokens" in requests


def plot_offload_tier(
    steps: pd.DataFrame,
    offload: dict[str, Any],
    *,
    t_from: float | None = None,
    t_to: float | None = None,
) -> Figure:
    """Chunks the CPU tier held after each step (steps.parquet ``offload_tier_chunks``) against
    its capacity (summary ``offload.capacity_chunks``), and on a second axis the chunks it
    evicted by then (``offload_tier_evictions``, where the table has it)."""
    fig, ax = new_axes("CPU offload tier", "simulated time (s)", "chunks held")
    s = thin(window(steps, t_from, t_to))
    capacity = int(offload.get("capacity_chunks") or 0)
    if not len(s) or "offload_tier_chunks" not in s:
        empty_note(ax)
        return fig
    t = s["time_s"].to_numpy(float)
    ax.fill_between(t, s["offload_tier_chunks"].to_numpy(float), step="post",
                    color=COLORS["offload"], alpha=0.6, label="chunks held")  # fmt: skip
    if capacity:
        ax.axhline(capacity, color="black", lw=1, ls="--", label=f"capacity {capacity:,}")
    ax.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    if "offload_tier_evictions" in s:
        ev = ax.twinx()
        ev.plot(t, s["offload_tier_evictions"].to_numpy(float), color=COLORS["evict"], lw=1.5,
                drawstyle="steps-post", label="evicted (cumulative)")  # fmt: skip
        ev.set_ylabel("chunks evicted (cumulative)")
        ev.set_ylim(bottom=0)
        more = ev.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="upper left", fontsize="small")
    chunk = offload.get("chunk_tokens")
    if chunk:
        ax.set_title(f"CPU offload tier ({chunk} tokens per chunk)")
    set_time_limits(ax, t_from, t_to)
    return fig


def source_tokens(requests: pd.DataFrame) -> pd.DataFrame:
    """Per request first admitted: admit_time_s and its prompt tokens by source (the
    ``SOURCES`` keys: computed, GPU hit, loaded), as summary ``prompt_tokens_by_source``."""
    r = requests.dropna(subset=["admit_time_s"])
    gpu = r["prefix_hit_tokens"].to_numpy(np.int64)
    loaded = r["offload_hit_tokens"].to_numpy(np.int64)
    return pd.DataFrame(
        {"admit_time_s": r["admit_time_s"].to_numpy(float),
         "local_compute": r["prompt_tokens"].to_numpy(np.int64) - gpu - loaded,
         "local_cache_hit": gpu, "external_kv_transfer": loaded}
    )  # fmt: skip


def plot_prompt_sources(
    requests: pd.DataFrame,
    offload: dict[str, Any],
    *,
    bins: int = DEFAULT_BINS,
    t_from: float | None = None,
    t_to: float | None = None,
) -> Figure:
    """Prompt tokens by source: the share of each per time bin (by first admission) and, on
    the right, the run's totals (summary ``offload.prompt_tokens_by_source``)."""
    fig, (ax, total) = plt.subplots(
        1, 2, figsize=(10, 4), layout="constrained", gridspec_kw={"width_ratios": [4, 1]}
    )
    ax.set_title("Prompt tokens by source")
    ax.set_xlabel("simulated time (s), by first admission")
    ax.set_ylabel("share of prompt tokens")
    ax.grid(alpha=0.3)
    tokens = window(source_tokens(requests), t_from, t_to, "admit_time_s")
    if len(tokens):
        t = tokens["admit_time_s"].to_numpy(float)
        lo = t_from if t_from is not None else 0.0
        hi = t_to if t_to is not None else float(t.max())
        edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
        per_bin = np.array(
            [np.histogram(t, edges, weights=tokens[k].to_numpy(float))[0] for k, _, _ in SOURCES]
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            share = per_bin / per_bin.sum(axis=0)
        bottom = np.zeros(bins)
        for (_, label, color), values in zip(SOURCES, np.nan_to_num(share), strict=True):
            ax.bar(edges[:-1], values, width=np.diff(edges), bottom=bottom, align="edge",
                   color=color, label=label)  # fmt: skip
            bottom += values
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.legend(loc="lower left", fontsize="small")
        set_time_limits(ax, t_from, t_to)
    else:
        empty_note(ax)
    by_source = offload.get("prompt_tokens_by_source") or {}
    whole = float(sum(by_source.values()))
    total.set_title("whole run")
    total.set_xticks([])
    total.yaxis.set_major_formatter(PercentFormatter(1.0))
    bottom_total = 0.0
    for key, _, color in SOURCES:
        share_total = by_source.get(key, 0) / whole if whole else 0.0
        total.bar(0, share_total, bottom=bottom_total, color=color, width=0.6)
        if share_total >= 0.04:
            total.text(0, bottom_total + share_total / 2, f"{share_total:.1%}", ha="center",
                       va="center", fontsize="small")  # fmt: skip
        bottom_total += share_total
    total.set_ylim(0, 1)
    return fig


def plot_offload_ttft(
    requests: pd.DataFrame, *, t_from: float | None = None, t_to: float | None = None
) -> Figure:
    """The TTFT of the requests that loaded (those arriving in the window), sorted: stacked
    queueing, loading and computing in seconds (left) and as shares of each TTFT (right)."""
    fig, (ax, share_ax) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    split = ttft_split(window(requests, t_from, t_to, "arrival_time_s"))
    fig.suptitle(f"TTFT of the {len(split):,} requests that loaded from the CPU tier")
    for a, ylabel in ((ax, "seconds"), (share_ax, "share of TTFT")):
        a.set_xlabel("requests, by TTFT (percentile)")
        a.set_ylabel(ylabel)
        a.grid(alpha=0.3)
    if not len(split):
        empty_note(ax, "no request loaded from the CPU tier")
        empty_note(share_ax, "no request loaded from the CPU tier")
        return fig
    split = thin(split)
    rank = (np.arange(len(split)) + 0.5) / len(split) * 100
    parts = np.array([split[name].to_numpy(float) for name, _ in TTFT_PARTS])
    parts = np.clip(parts, 0.0, None)  # a load issued at arrival has no queueing
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.nan_to_num(parts / parts.sum(axis=0))
    labels = [name for name, _ in TTFT_PARTS]
    colors = [color for _, color in TTFT_PARTS]
    if len(split) == 1:  # one request: a bar, not an area of zero width
        for a, values in ((ax, parts), (share_ax, shares)):
            a.bar([50] * 3, values[:, 0], bottom=np.r_[0, np.cumsum(values[:-1, 0])],
                  color=colors, width=20, label=labels)  # fmt: skip
    else:
        ax.stackplot(rank, parts, labels=labels, colors=colors, step="mid")
        share_ax.stackplot(rank, shares, labels=labels, colors=colors, step="mid")
    share_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    share_ax.set_ylim(0, 1)
    ax.set_xlim(0, 100)
    share_ax.set_xlim(0, 100)
    ax.legend(loc="upper left", fontsize="small")
    return fig


def plot_offload_transfers(
    events: pd.DataFrame,
    offload: dict[str, Any],
    *,
    t_from: float | None = None,
    t_to: float | None = None,
    end_s: float | None = None,
) -> Figure:
    """CDFs of how long each load and store issued in the window held its GPU blocks (issue
    to the completion the scheduler sees: ``kvsim.analysis.offload_tables.transfer_jobs``),
    log x; dashed lines mark the link's transfer time p50 and p99 of each direction from the
    summary (``offload.loads`` / ``offload.stores`` ``transfer_s``)."""
    fig, ax = new_axes("KV offload transfers", "seconds (log)", "share of transfers")
    jobs = window(transfer_jobs(events, end_s), t_from, t_to, "start_s")
    drawn = False
    for direction in DIRECTIONS:
        held = np.sort(jobs.loc[jobs["direction"] == direction, "held_s"].to_numpy(float))
        held = held[held > 0]
        color = DIRECTION_COLORS[direction]
        if len(held):
            y = np.arange(1, len(held) + 1) / len(held)
            points = thin(pd.DataFrame({"x": held, "y": y}))
            ax.step(points["x"], points["y"], where="post", color=color, lw=1.5,
                    label=f"{direction}s: blocks held ({len(held):,})")  # fmt: skip
            drawn = True
        link = (offload.get(f"{direction}s") or {}).get("transfer_s") or {}
        for q, style in (("p50", "--"), ("p99", ":")):
            if link.get(q):
                ax.axvline(link[q], color=color, ls=style, lw=1,
                           label=f"{direction} link time {q} {link[q] * 1e3:.3g} ms")  # fmt: skip
                drawn = True
    if not drawn:
        empty_note(ax, "no transfer in this window")
        return fig
    ax.set_xscale("log")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower right", fontsize="small")
    return fig
