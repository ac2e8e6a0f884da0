"""Requests and traces: the record, kvsim trace files, importers for public traces, synthetic
generators, rescaling, and simpy arrival processes.

This package imports nothing from ``kvsim`` or ``engine``; the simulator imports it.

Names are imported on first use, so ``from workloads import WorkloadError`` (every CLI command
does it) pays for neither numpy nor simpy (with the commands' own lazy imports, ``kvsim --help``
went from 0.71 to 0.53 s: benchmarks/bench_cli.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_EXPORTS = {
    "workloads.arrivals": ("ArrivalKind", "ArrivalProcess"),
    "workloads.errors": ("SpecError", "TraceFormatError", "WorkloadError"),
    "workloads.formats": ("load_trace", "save_trace"),
    "workloads.importers": ("IMPORTERS", "ImportResult"),
    "workloads.lengths": ("LengthSpec", "parse_length_spec"),
    "workloads.processes": ("cancel_after", "closed_loop", "open_loop"),
    "workloads.request": ("Request", "Trace"),
    "workloads.rescale": ("mean_arrival_rate", "rescale_to_rate", "scale_time", "truncate"),
    "workloads.shipped": (
        "DEFAULT_TRACE",
        "DEFAULT_TRACE_NAME",
        "resolve_trace",
        "shipped_trace_names",
        "shipped_trace_path",
    ),
    "workloads.stats": ("trace_stats",),
    "workloads.synthetic": ("generate_trace",),
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'workloads' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
