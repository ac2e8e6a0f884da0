"""Prefix caching over time (v1 runs): the hit rate, and prompt tokens served from the cache
against those computed.

Both read requests.parquet's v1 columns (``prefix_hit_tokens`` at each request's first
admission, as vLLM's ``prefix_cache_hits`` counts them) and steps.parquet's
``num_prefill_tokens``; a classic run's tables lack them and draw a note instead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from kvsim.plots._common import COLORS, empty_note, new_axes, set_time_limits, window

DEFAULT_BINS = 60


def _no_prefix_cache(ax: object, fig: Figure) -> Figure:
    empty_note(ax, "no prefix cache (not a --scheduler v1 run)")  # type: ignore[arg-type]
    return fig


def _edges(lo: float, hi: float, bins: int) -> np.ndarray:
    return np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)


def plot_prefix_hit_rate(
    requests: pd.DataFrame,
    *,
    bins: int = DEFAULT_BINS,
    t_from: float | None = None,
    t_to: float | None = None,
) -> Figure:
    """Prefix-cache hit rate over time: per time bin (bars) and cumulative (line), over the
    requests first admitted by then — hit tokens / prompt tokens, vLLM's
    ``prefix_cache_hit_rate`` (the line ends at the summary's value over the whole run). The
    y axis spans what is drawn (a 4% rate is not a sliver at the foot of 0-100%); with no hit
    at all, the picture says so."""
    fig, ax = new_axes("Prefix-cache hit rate", "simulated time (s)", "hit rate")
    if "prefix_hit_tokens" not in requests:
        return _no_prefix_cache(ax, fig)
    admitted = requests.dropna(subset=["admit_time_s"]).sort_values("admit_time_s")
    r = window(admitted, t_from, t_to, "admit_time_s")
    if not len(r):
        empty_note(ax)
        return fig
    t = r["admit_time_s"].to_numpy(float)
    hits, queries = r["prefix_hit_tokens"].to_numpy(float), r["prompt_tokens"].to_numpy(float)
    edges = _edges(t_from if t_from is not None else 0.0, t_to if t_to is not None else t[-1], bins)
    h = np.histogram(t, edges, weights=hits)[0]
    q = np.histogram(t, edges, weights=queries)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(q > 0, h / q, np.nan)
    ax.bar(edges[:-1], rate, width=np.diff(edges), align="edge", color=COLORS["cached"],
           label="per interval")  # fmt: skip
    with np.errstate(invalid="ignore", divide="ignore"):
        cumulative = np.cumsum(hits) / np.cumsum(queries)
    ax.step(t, cumulative, where="post", color=COLORS["filled"], lw=1.5, label="cumulative")
    top = float(np.nanmax(np.concatenate([rate, cumulative, [0.0]])))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, min(1.0, top * 1.15) if top > 0 else 0.01)
    if top > 0:
        ax.set_title(f"Prefix-cache hit rate ({cumulative[-1]:.1%} of prompt tokens)")
    else:
        empty_note(
            ax,
            "no prefix-cache hits: no request shared a cached prefix\n(a trace without hash_ids "
            "or session ids gives no prefix identity: docs/formats.md)",
        )
    fig.legend(loc="outside lower center", ncol=2, fontsize="small")
    set_time_limits(ax, t_from, t_to)
    return fig


def plot_prompt_tokens(
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    *,
    bins: int = DEFAULT_BINS,
    t_from: float | None = None,
    t_to: float | None = None,
) -> Figure:
    """Prompt tokens per second over time, stacked: served from the prefix cache (each
    request's hits at its admissions) and computed (the steps' prefill tokens: uncached
    prompt chunks and recompute after preemption)."""
    fig, ax = new_axes(
        "Prompt tokens: cached vs computed", "simulated time (s)", "tokens per second"
    )
    if "prefix_hit_tokens" not in requests or "num_prefill_tokens" not in steps:
        return _no_prefix_cache(ax, fig)
    s = window(steps, t_from, t_to)
    r = window(requests.dropna(subset=["admit_time_s"]), t_from, t_to, "admit_time_s")
    if not len(s):
        empty_note(ax)
        return fig
    lo = t_from if t_from is not None else 0.0
    hi = t_to if t_to is not None else float(s["time_s"].max())
    edges = _edges(lo, hi, bins)
    width = np.diff(edges)
    cached = np.histogram(r["admit_time_s"], edges, weights=r["prefix_hit_tokens"])[0]
    computed = np.histogram(s["time_s"], edges, weights=s["num_prefill_tokens"])[0]
    ax.stackplot(
        edges[:-1], computed / width, cached / width, step="post",
        labels=["computed (prefill)", "served from the prefix cache"],
        colors=[COLORS["prefill"], COLORS["cached"]],
    )  # fmt: skip
    total_cached, total_computed = cached.sum(), computed.sum()
    share = total_cached / (total_cached + total_computed) if total_cached + total_computed else 0
    ax.set_title(f"Prompt tokens: cached vs computed ({share:.1%} of prefill work served cached)")
    ax.set_ylim(bottom=0)
    fig.legend(loc="outside lower center", ncol=2, fontsize="small")
    set_time_limits(ax, t_from, t_to)
    return fig
