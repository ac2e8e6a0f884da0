"""Saturation: whether a run's arrivals outpace its service, as a three-level verdict
(``stable`` / ``near saturation`` / ``saturated``) with the figures that decided it and a
sentence saying why (docs/metrics.md, "Saturation").

Three figures, each over the arrival window (first to last arrival, cut at the run's end):

- the **trend of the waiting queue**: the least-squares slope of the number of requests
  waiting for admission, sampled on an even grid, with a 95% confidence interval widened for
  the samples' lag-1 autocorrelation (a queue's length now predicts its length a moment
  later, so its samples are not independent); as a share of the offered rate it is the
  part of the arrivals the engine does not take in;
- the **backlog**: how long the last tenth of arrivals waited for admission, as a share of
  the window (a stable queue's waits do not grow with the run's length) and in median
  service times;
- the **queueing share of TTFT**: whether the latencies measure the queue.

Everything is computed from requests.parquet's columns with numpy alone (a cost-mode run
imports neither pandas nor scipy; tests compare the slope with scipy.stats.linregress).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.analysis.quantiles import median
from kvsim.analysis.table import TableLike, column, is_label

STABLE, NEAR, SATURATED = "stable", "near saturation", "saturated"
VERDICTS = (STABLE, NEAR, SATURATED)

# Saturation is not judged on fewer requests than this (a handful proves nothing).
MIN_REQUESTS = 20
# The waiting queue is sampled at this many evenly spaced moments (at most one per request).
MAX_SAMPLES = 200
# Two-sided 95% normal quantile: the interval of the slope (samples are >= 20).
Z95 = 1.959963984540054
# Lag-1 autocorrelation is capped here when widening the interval (at most sqrt(19) = 4.4x):
# past it the residuals say the queue is not a line, not that the slope is unknown.
MAX_AUTOCORRELATION = 0.9
# saturated: the queue grows, at 95% confidence, by at least this share of the offered rate
GROWTH_SATURATED = 0.02
# ... and by at least this many requests over the window
MIN_GROWTH_REQUESTS = 10
# near saturation: the slope's point estimate is at least this share of the offered rate
GROWTH_NEAR = 0.01
# A backlog that no longer grows but never drains: the last arrivals' wait as a share of the
# window. A queue built up from empty at growth share g makes them wait about g x the window,
# so the same thresholds apply as to the trend (GROWTH_SATURATED, GROWTH_NEAR); it saturates
# only when that wait is also at least this many median service times, with at least
# MIN_GROWTH_REQUESTS waiting at the last arrival.
BACKLOG_SERVICE_TIMES = 2.0
# saturated also needs the latencies to measure the queue: queueing is at least half of TTFT
QUEUEING_SHARE_SATURATED = 0.5
# The backlog is measured on the arrivals of the window's last tenth.
LAST_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class QueueTrend:
    """The least-squares line through the waiting queue's samples: slope (requests/s), its
    standard error (requests/s, widened for autocorrelation) and 95% interval."""

    slope_per_s: float
    stderr_per_s: float
    low_per_s: float
    high_per_s: float
    lag1_autocorrelation: float
    samples: int


def waiting_counts(requests: TableLike, times: np.ndarray) -> np.ndarray:
    """Requests waiting for admission at each of ``times``: arrived by then and not yet
    admitted, nor rejected or aborted from the queue."""
    arrival = np.sort(column(requests, "arrival_time_s", float))
    admit = column(requests, "admit_time_s", float)
    end = column(requests, "finish_time_s", float)
    left = np.isnan(admit) & is_label(requests, "status", ("rejected", "aborted"))
    admitted = np.sort(admit[~np.isnan(admit)])
    dropped = np.sort(end[left & ~np.isnan(end)])
    counts = (
        np.searchsorted(arrival, times, "right")
        - np.searchsorted(admitted, times, "right")
        - np.searchsorted(dropped, times, "right")
    )
    return counts.astype(np.int64)


def queue_trend(times: np.ndarray, counts: np.ndarray) -> QueueTrend:
    """Ordinary least squares of ``counts`` on ``times`` (scipy.stats.linregress' slope and
    standard error), the error then multiplied by ``sqrt((1 + r) / (1 - r))`` for the
    residuals' lag-1 autocorrelation ``r`` (clipped to [0, MAX_AUTOCORRELATION]): the
    variance of a mean of AR(1) samples, the usual effective-sample-size correction."""
    t = times - times.mean()
    y = counts.astype(np.float64)
    sxx = float(t @ t)
    slope = float(t @ (y - y.mean())) / sxx
    residuals = y - y.mean() - slope * t
    n = len(y)
    stderr = math.sqrt(float(residuals @ residuals) / (n - 2) / sxx)
    r = 0.0
    ss = float(residuals @ residuals)
    if ss > 0:
        r = float(residuals[:-1] @ residuals[1:]) / ss
    r = min(max(r, 0.0), MAX_AUTOCORRELATION)
    stderr *= math.sqrt((1 + r) / (1 - r))
    return QueueTrend(
        slope_per_s=slope,
        stderr_per_s=stderr,
        low_per_s=slope - Z95 * stderr,
        high_per_s=slope + Z95 * stderr,
        lag1_autocorrelation=r,
        samples=n,
    )


def _not_judged(reason: str) -> dict[str, Any]:
    return {"verdict": STABLE, "judged": False, "reason": reason}


def saturation(
    requests: TableLike,
    sim_end_s: float,
    *,
    closed_loop: bool,
    service_p50_s: float | None,
    queueing_share: float | None,
) -> dict[str, Any]:
    """summary.json's ``saturation``: ``verdict`` (one of VERDICTS), ``judged``, ``reason``
    (a sentence with the deciding figures) and the figures themselves (rates in requests/s,
    times in s); see the module docstring and docs/metrics.md."""
    arrival = np.sort(column(requests, "arrival_time_s", float))
    if closed_loop:
        return _not_judged("closed loop: users wait for their answers before sending more")
    if len(arrival) < MIN_REQUESTS:
        return _not_judged(f"not judged: {len(arrival)} requests (fewer than {MIN_REQUESTS})")
    start, end = float(arrival[0]), min(float(arrival[-1]), sim_end_s)
    if not end > start:
        return _not_judged("not judged: every request arrived at the same moment")
    length = end - start
    arrived = int(np.searchsorted(arrival, end, "right"))
    offered = arrived / length
    k = min(arrived, MAX_SAMPLES)
    times = start + (np.arange(k) + 0.5) * length / k
    counts = waiting_counts(requests, times)
    trend = queue_trend(times, counts)
    waiting_at_end = int(waiting_counts(requests, np.array([end]))[0])
    served = _left_queue(requests, start, end) / length
    backlog_s = _last_arrivals_wait(requests, end - LAST_SHARE * length, end, sim_end_s)
    backlog = (
        backlog_s / service_p50_s
        if backlog_s is not None and service_p50_s is not None and service_p50_s > 0
        else None
    )
    figures: dict[str, Any] = {
        "offered_rate_per_s": offered,
        "served_rate_per_s": served,
        "served_share": served / offered,
        "queue_slope_per_s": trend.slope_per_s,
        "queue_slope_ci95_per_s": [trend.low_per_s, trend.high_per_s],
        "queue_growth_share": trend.slope_per_s / offered,
        "queue_growth_share_low": trend.low_per_s / offered,
        "queue_growth_requests": trend.slope_per_s * length,
        "queue_samples": trend.samples,
        "queue_lag1_autocorrelation": trend.lag1_autocorrelation,
        "waiting_at_last_arrival": waiting_at_end,
        "last_arrivals_wait_s": backlog_s,
        "service_time_p50_s": service_p50_s,
        "backlog_service_times": backlog,
        "backlog_share_of_window": None if backlog_s is None else backlog_s / length,
        "queueing_share_of_ttft": queueing_share,
        "window_s": [start, end],
    }
    grows = (
        figures["queue_growth_share_low"] >= GROWTH_SATURATED
        and figures["queue_growth_requests"] >= MIN_GROWTH_REQUESTS
    )
    backlog_share = figures["backlog_share_of_window"]
    backed_up = (
        backlog_share is not None
        and backlog_share >= GROWTH_SATURATED
        and (backlog is None or backlog >= BACKLOG_SERVICE_TIMES)
        and figures["waiting_at_last_arrival"] >= MIN_GROWTH_REQUESTS
    )
    queue_is_latency = queueing_share is None or queueing_share >= QUEUEING_SHARE_SATURATED
    if (grows or backed_up) and queue_is_latency:
        verdict = SATURATED
    elif (
        grows
        or backed_up
        or figures["queue_growth_share"] >= GROWTH_NEAR
        or (backlog_share is not None and backlog_share >= GROWTH_NEAR)
    ):
        verdict = NEAR
    else:
        verdict = STABLE
    return {"verdict": verdict, "judged": True, "reason": _reason(figures), **figures}


def _left_queue(requests: TableLike, start: float, end: float) -> int:
    """Requests that left the waiting queue in [start, end]: admitted, or rejected or
    aborted before admission."""
    admit = column(requests, "admit_time_s", float)
    gone = np.where(
        np.isnan(admit) & is_label(requests, "status", ("rejected", "aborted")),
        column(requests, "finish_time_s", float),
        admit,
    )
    return int(((gone >= start) & (gone <= end)).sum())


def _last_arrivals_wait(
    requests: TableLike, since: float, until: float, sim_end_s: float
) -> float | None:
    """Median wait for admission of the requests arriving in [since, until]; one never
    admitted (still waiting when the run stopped) counts its wait until the run's end."""
    arrival = column(requests, "arrival_time_s", float)
    admit = column(requests, "admit_time_s", float)
    waiting = np.isnan(admit) & ~is_label(requests, "status", ("rejected", "aborted"))
    wait = np.where(waiting, sim_end_s - arrival, admit - arrival)
    chosen = wait[(arrival >= since) & (arrival <= until) & ~np.isnan(wait)]
    return median(chosen) if len(chosen) else None


def _figure(value: float, sign: str = "") -> str:
    """Three significant figures without an exponent: ``2.00``, ``0.0497``, ``1,103``."""
    if abs(value) >= 100:
        return f"{value:{sign},.0f}"
    return f"{value:{sign}#.3g}"


def _reason(f: dict[str, Any]) -> str:
    """The figures that decide the verdict, in words."""
    low, high = f["queue_slope_ci95_per_s"]
    parts = [
        f"offered {f['offered_rate_per_s']:.2f} req/s, served {f['served_rate_per_s']:.2f} "
        f"req/s ({f['served_share']:.0%})",
        f"waiting queue {_figure(f['queue_slope_per_s'], '+')} req/s (95% interval "
        f"{_figure(low, '+')} to {_figure(high, '+')}; {f['queue_growth_share']:.1%} of the "
        f"offered rate), {f['waiting_at_last_arrival']:,} waiting at the last arrival",
    ]
    if f["backlog_service_times"] is not None and f["backlog_share_of_window"] is not None:
        parts.append(
            f"the last arrivals wait {_figure(f['last_arrivals_wait_s'])} s for admission "
            f"({f['backlog_share_of_window']:.1%} of the window, "
            f"{_figure(f['backlog_service_times'])} median service times)"
        )
    if f["queueing_share_of_ttft"] is not None:
        parts.append(f"queueing is {f['queueing_share_of_ttft']:.0%} of TTFT")
    return "; ".join(parts)
