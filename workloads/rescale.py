"""Pure transformations of traces: stretch time, set the mean rate, cut a prefix."""

from __future__ import annotations

import dataclasses
import math

from workloads.errors import WorkloadError
from workloads.limits import MAX_TIME_S, is_integer, is_number
from workloads.request import Trace


def mean_arrival_rate(trace: Trace) -> float:
    """Mean arrival rate in requests/s: (N - 1) gaps over the span from first to last arrival.

    Raises WorkloadError when the span is zero (one request, or all arrive together).
    """
    if len(trace) < 2:
        raise WorkloadError("a mean arrival rate needs at least two requests")
    span = trace.requests[-1].arrival_time_s - trace.requests[0].arrival_time_s
    if span <= 0:
        raise WorkloadError("all requests arrive at the same time; the mean rate is undefined")
    return (len(trace) - 1) / span


def scale_time(trace: Trace, factor: float) -> Trace:
    """Multiply every arrival time by ``factor`` (> 0): 2.0 halves the rate, 0.5 doubles it.

    ``cancel_after_s`` (a user's patience) is left unchanged.
    """
    if not (is_number(factor) and factor > 0 and math.isfinite(factor)):
        raise WorkloadError(f"time scale factor must be a positive number, got {factor!r}")
    last = trace.requests[-1].arrival_time_s * factor if trace.requests else 0.0
    if last > MAX_TIME_S:
        raise WorkloadError(
            f"scaling arrival times by {factor:.6g} puts the last arrival at {last:.6g} s, past "
            f"the {MAX_TIME_S:.0f} s (2^32 s) a trace may span"
        )
    requests = [
        dataclasses.replace(r, arrival_time_s=r.arrival_time_s * factor) for r in trace.requests
    ]
    return dataclasses.replace(trace, requests=requests)


def rescale_to_rate(trace: Trace, rate_per_s: float) -> Trace:
    """Scale arrival times so :func:`mean_arrival_rate` equals ``rate_per_s`` (requests/s)."""
    if not (is_number(rate_per_s) and rate_per_s > 0 and math.isfinite(rate_per_s)):
        raise WorkloadError(f"rate must be a positive number of requests/s, got {rate_per_s!r}")
    return scale_time(trace, mean_arrival_rate(trace) / rate_per_s)


def truncate(
    trace: Trace, *, max_requests: int | None = None, max_duration_s: float | None = None
) -> Trace:
    """The first ``max_requests`` requests and/or those arriving before ``max_duration_s``
    seconds after the first arrival (both limits apply when both are given)."""
    requests = trace.requests
    if max_duration_s is not None:
        if not (is_number(max_duration_s) and max_duration_s > 0):
            raise WorkloadError(f"max duration must be positive, got {max_duration_s}")
        end = requests[0].arrival_time_s + max_duration_s if requests else 0.0
        requests = [r for r in requests if r.arrival_time_s < end]
    if max_requests is not None:
        if not is_integer(max_requests) or max_requests < 1:
            raise WorkloadError(f"max requests must be >= 1, got {max_requests}")
        requests = requests[:max_requests]
    return dataclasses.replace(trace, requests=requests)
