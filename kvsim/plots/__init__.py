"""Pictures of a run: functions that take DataFrames and return matplotlib Figures.

The CLI, the reports and the notebooks all call these same functions. Long time series are
drawn as envelopes (``envelope``: min / mean / max per time bin) or from at most
``MAX_POINTS`` steps (evenly thinned), and the occupancy map from a pixel grid aggregated with
numpy, so a million-step, 100,000-block run plots as fast as a small one; a run whose events
file is too long to read whole gets a sampled occupancy map and an exact Gantt chart from
the file (``large_runs``). Importing kvsim.plots never selects a matplotlib backend.

Modules: ``cache_curve`` (offline prefix-cache hit rate against capacity), ``timeseries`` (free
blocks, KV breakdown, batch size), ``requests`` (latency CDFs, Gantt chart), ``occupancy_map``
(block x time map), ``prefix_cache`` (v1: hit rate, cached vs computed prompt tokens),
``pool`` (a small pool slot by slot), ``compare`` (several runs side by
side), ``offload`` (a KV offloading run: the CPU tier, prompt tokens by source, the TTFT of
loading requests split, transfer times), ``standard`` (the named pictures of a run folder),
``animation`` (the block pool over a time window, as a GIF or MP4; imported on its own, since
most callers never animate).
"""

from kvsim.plots._common import COLORS, MAX_POINTS, png_bytes, save_png
from kvsim.plots.cache_curve import plot_cache_curve
from kvsim.plots.compare import (
    breakdown_table,
    plot_breakdown_bars,
    plot_metrics_vs,
    plot_step_times,
    summaries_frame,
)
from kvsim.plots.occupancy_map import (
    owner_image,
    plot_occupancy,
    plot_occupancy_grid,
    state_image,
)
from kvsim.plots.pool import plot_block_pool, pool_frame
from kvsim.plots.prefix_cache import plot_prefix_hit_rate, plot_prompt_tokens
from kvsim.plots.requests import plot_gantt, plot_latency_cdfs, select_requests
from kvsim.plots.standard import (
    NEEDS_EVENTS,
    PICTURES,
    V1_PICTURES,
    RunTables,
    draw,
    has_events,
    is_v1,
    read_pngs,
    write_pictures,
    write_run_plots,
)
from kvsim.plots.timeseries import (
    breakdown_shares,
    plot_batch_size,
    plot_free_blocks,
    plot_kv_breakdown,
)

__all__ = [
    "COLORS",
    "MAX_POINTS",
    "NEEDS_EVENTS",
    "PICTURES",
    "V1_PICTURES",
    "RunTables",
    "breakdown_shares",
    "breakdown_table",
    "draw",
    "has_events",
    "is_v1",
    "owner_image",
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
    "plot_occupancy_grid",
    "plot_prefix_hit_rate",
    "plot_prompt_tokens",
    "plot_step_times",
    "png_bytes",
    "pool_frame",
    "read_pngs",
    "save_png",
    "select_requests",
    "state_image",
    "summaries_frame",
    "write_pictures",
    "write_run_plots",
]
