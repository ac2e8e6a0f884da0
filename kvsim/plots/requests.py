"""Per-request pictures: latency CDFs and the Gantt chart of request states."""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from kvsim.analysis.occupancy import STATES, request_states
from kvsim.plots._common import COLORS, empty_note, set_time_limits, text_label

LATENCIES = (
    ("queueing_delay_s", "queueing delay (s)"),
    ("ttft_s", "TTFT (s)"),
    ("tpot_s", "TPOT (s/token)"),
    ("e2e_latency_s", "end-to-end latency (s)"),
)
MAX_GANTT_REQUESTS = 40
LOG_SPAN = 20.0  # a CDF whose values span more than this factor gets a log x axis
END_MARKS = (("REJECT", "x", COLORS["reject"]), ("ABORT", "s", "#718096"))


def plot_latency_cdfs(requests: pd.DataFrame) -> Figure:
    """CDFs of queueing delay, TTFT, TPOT and end-to-end latency over the requests where each
    is defined (docs/metrics.md); dotted lines at p50 and p99."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), layout="constrained")
    for ax, (column, label) in zip(axes.flat, LATENCIES):
        values = np.sort(requests[column].dropna().to_numpy())
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), color=COLORS["filled"])
            if values[0] > 0 and values[-1] > LOG_SPAN * values[0]:
                ax.set_xscale("log")
            for p in (50, 99):
                ax.axvline(np.percentile(values, p), ls=":", color="#718096", lw=0.8)
            ax.set_title(
                f"p50 {np.percentile(values, 50):.3g}, p99 {np.percentile(values, 99):.3g}  "
                f"(n={len(values):,})",
                fontsize="small",
            )
        else:
            empty_note(ax, "no values")
        ax.set_xlabel(label + (" (log)" if ax.get_xscale() == "log" else ""))
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    fig.suptitle("Latency CDFs (dotted: p50, p99)")
    return fig


def select_requests(
    states: pd.DataFrame,
    *,
    seq_ids: Iterable[int] | None = None,
    max_requests: int = MAX_GANTT_REQUESTS,
    t_from: float | None = None,
    t_to: float | None = None,
) -> np.ndarray:
    """The seq_ids a Gantt chart shows: those in ``seq_ids`` (default all) whose states overlap
    [t_from, t_to] (s), the first ``max_requests`` of them by seq_id."""
    span = states.groupby("seq_id", sort=True).agg(start=("start_s", "min"), end=("end_s", "max"))
    keep = np.ones(len(span), dtype=bool)
    if seq_ids is not None:
        keep &= span.index.isin(list(seq_ids))
    if t_from is not None:
        keep &= span["end"].to_numpy() > t_from
    if t_to is not None:
        keep &= span["start"].to_numpy() < t_to
    return np.asarray(span.index.to_numpy()[keep][:max_requests])


def plot_gantt(
    events: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    requests: pd.DataFrame | None = None,
    seq_ids: Iterable[int] | None = None,
    max_requests: int = MAX_GANTT_REQUESTS,
    t_from: float | None = None,
    t_to: float | None = None,
    end_s: float | None = None,
    alive: int | None = None,
) -> Figure:
    """One row per request (first ``max_requests`` of those selected, see ``select_requests``),
    coloured by state over time: queued, prefill, decode, preempted; rejections and aborts
    marked. Rows are labelled with ``requests``' request_id when given. The title counts the
    rows against every request alive in the window (the whole run without one): ``alive``
    gives their number where ``events`` holds only the rows of the requests drawn."""
    states = request_states(events, steps, end_s)
    shown = select_requests(
        states, seq_ids=seq_ids, max_requests=max_requests, t_from=t_from, t_to=t_to
    )
    if alive is None:
        alive = len(select_requests(states, max_requests=len(states), t_from=t_from, t_to=t_to))
    height = min(12.0, max(3.0, 0.22 * len(shown) + 1.6))
    fig, ax = plt.subplots(figsize=(10, height), layout="constrained")
    row = pd.Series(np.arange(len(shown)), index=shown)
    sel = states[states["seq_id"].isin(shown)]
    for state in STATES:
        part = sel[sel["state"] == state]
        ax.barh(
            row[part["seq_id"]].to_numpy(),
            (part["end_s"] - part["start_s"]).to_numpy(),
            left=part["start_s"].to_numpy(),
            height=0.75,
            color=COLORS[state],
            linewidth=0,
        )
    handles: list[object] = [Patch(color=COLORS[s], label=s) for s in STATES]
    ends = events[events["kind"].isin([k for k, _, _ in END_MARKS]) & events["seq_id"].isin(shown)]
    for kind, marker, color in END_MARKS:
        e = ends[ends["kind"] == kind]
        if len(e):
            handles.append(
                ax.scatter(
                    e["time_s"],
                    row[e["seq_id"]],
                    marker=marker,
                    color=color,
                    s=30,
                    zorder=3,
                    label=kind.lower(),
                )
            )
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize="small")
    _label_rows(ax, shown, requests)
    ax.set_xlabel("simulated time (s)")
    ax.set_title(_gantt_title(len(shown), alive, t_from is not None or t_to is not None))
    ax.grid(alpha=0.3, axis="x")
    if not len(shown):
        empty_note(ax, "no requests in this window")
    set_time_limits(ax, t_from, t_to)
    return fig


def _gantt_title(shown: int, alive: int, windowed: bool) -> str:
    """ "Request states (12 requests)", or how many of how many when rows were left out."""
    if shown >= alive:
        return f"Request states ({shown:,} requests)"
    where = "alive in this window" if windowed else "of the run"
    return f"Request states: {shown:,} of the {alive:,} requests {where}"


def _label_rows(ax: Axes, shown: np.ndarray, requests: pd.DataFrame | None) -> None:
    ax.set_ylim(max(len(shown), 1) - 0.5, -0.5)  # first request on top
    if len(shown) > 60:
        ax.set_ylabel("requests (by seq_id)")
        return
    labels = [str(s) for s in shown]
    if requests is not None:
        ids = requests.set_index("seq_id")["request_id"]
        labels = [text_label(ids.get(s, s)) for s in shown]
    ax.set_yticks(np.arange(len(shown)), labels, fontsize="x-small")
    ax.set_ylabel("request")
