"""kvsim: a discrete-event simulator and visualizer for KV-cache scheduling in LLM serving.

What users and notebooks need, at one short path::

    from kvsim import RunConfig, plot_occupancy, run
    result = run(RunConfig(trace="azure_llm_2023_conv_first_2min", block_size=32))
    fig = plot_occupancy(result.events, result.summary["num_blocks"])

- ``RunConfig`` (every option of a run), ``run`` (simulate it) and ``RunResult``;
- ``write_run`` / ``read_run`` (run folders);
- ``CostModel``, ``resolve_gpu``, ``resolve_model`` (the cost model, also in kvsim.costmodel);
- ``cache_curve`` (offline prefix-cache hit rate against capacity, LRU and optimal);
- the ``plot_*`` functions and ``summaries_frame`` of kvsim.plots.

Names are imported on first use, so ``kvsim --help`` pays for none of pandas, matplotlib or
the simulator. The subpackages and their import direction: docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvsim.analysis.cache_curve import cache_curve
    from kvsim.config import RunConfig
    from kvsim.costmodel import CostModel, resolve_gpu, resolve_model
    from kvsim.outputs.run_folder import read_run, write_run
    from kvsim.plots import (
        plot_batch_size,
        plot_block_pool,
        plot_breakdown_bars,
        plot_cache_curve,
        plot_free_blocks,
        plot_gantt,
        plot_kv_breakdown,
        plot_latency_cdfs,
        plot_metrics_vs,
        plot_occupancy,
        plot_step_times,
        summaries_frame,
    )
    from kvsim.runner import RunResult, run

_EXPORTS = {
    "kvsim.config": ("RunConfig",),
    "kvsim.runner": ("RunResult", "run"),
    "kvsim.outputs.run_folder": ("read_run", "write_run"),
    "kvsim.costmodel": ("CostModel", "resolve_gpu", "resolve_model"),
    "kvsim.analysis.cache_curve": ("cache_curve",),
    "kvsim.plots": (
        "plot_batch_size",
        "plot_block_pool",
        "plot_breakdown_bars",
        "plot_cache_curve",
        "plot_free_blocks",
        "plot_gantt",
        "plot_kv_breakdown",
        "plot_latency_cdfs",
        "plot_metrics_vs",
        "plot_occupancy",
        "plot_step_times",
        "summaries_frame",
    ),
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "CostModel",
    "RunConfig",
    "RunResult",
    "cache_curve",
    "plot_batch_size",
    "plot_block_pool",
    "plot_breakdown_bars",
    "plot_cache_curve",
    "plot_free_blocks",
    "plot_gantt",
    "plot_kv_breakdown",
    "plot_latency_cdfs",
    "plot_metrics_vs",
    "plot_occupancy",
    "plot_step_times",
    "read_run",
    "resolve_gpu",
    "resolve_model",
    "run",
    "summaries_frame",
    "write_run",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'kvsim' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
