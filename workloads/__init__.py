"""Requests and traces: the record, kvsim trace files, importers for public traces, synthetic
generators, rescaling, and simpy arrival processes.

This package imports nothing from ``kvsim`` or ``engine``; the simulator imports it.
"""

from workloads.arrivals import ArrivalKind, ArrivalProcess
from workloads.errors import SpecError, TraceFormatError, WorkloadError
from workloads.formats import load_trace, save_trace
from workloads.importers import IMPORTERS, ImportResult
from workloads.lengths import LengthSpec, parse_length_spec
from workloads.processes import cancel_after, closed_loop, open_loop
from workloads.request import Request, Trace
from workloads.rescale import mean_arrival_rate, rescale_to_rate, scale_time, truncate
from workloads.shipped import (
    DEFAULT_TRACE,
    DEFAULT_TRACE_NAME,
    resolve_trace,
    shipped_trace_names,
    shipped_trace_path,
)
from workloads.stats import trace_stats
from workloads.synthetic import generate_trace

__all__ = [
    "DEFAULT_TRACE",
    "DEFAULT_TRACE_NAME",
    "IMPORTERS",
    "ArrivalKind",
    "ArrivalProcess",
    "ImportResult",
    "LengthSpec",
    "Request",
    "SpecError",
    "Trace",
    "TraceFormatError",
    "WorkloadError",
    "cancel_after",
    "closed_loop",
    "generate_trace",
    "load_trace",
    "mean_arrival_rate",
    "open_loop",
    "parse_length_spec",
    "rescale_to_rate",
    "resolve_trace",
    "save_trace",
    "scale_time",
    "shipped_trace_names",
    "shipped_trace_path",
    "trace_stats",
    "truncate",
]
