"""A simulation's measurements: requests.parquet's and steps.parquet's tables and summary.json
from its result and the trackers that followed its events (a run's and each fleet replica's)."""

from __future__ import annotations

from typing import Any

from kvsim.analysis.block_states import BlockStateTracker
from kvsim.analysis.kv_breakdown import PagedUsageTracker, add_kv_breakdown
from kvsim.analysis.metrics import requests_table, steps_table, summarize
from kvsim.analysis.offload_metrics import offload_request_columns, offload_summary
from kvsim.analysis.prefix_metrics import (
    Admissions,
    admissions,
    prefix_cache_summary,
    request_columns,
)
from kvsim.analysis.table import Table
from kvsim.config import RunConfig
from kvsim.sim.records import OffloadRecords, SimResult
from workloads.request_columns import request_column


def measure(
    config: RunConfig,
    result: SimResult,
    max_model_len: int | None,
    usage: PagedUsageTracker | None,
    block_states: BlockStateTracker | None,
    *,
    drop_events: bool = False,
) -> tuple[Table, Table, dict[str, Any]]:
    """requests.parquet's and steps.parquet's tables and summary.json of a simulation's
    ``result`` (``usage`` and ``block_states``: the trackers that followed its events).
    ``drop_events``: the recorder's kept events are dropped once the tables are made
    (``EventRecorder.drop_kept``), before the summary's temporaries, and the residency
    samples once the prefix-cache summary has them (``ResidencyCollector.drop_samples``):
    for a caller that needs neither afterwards (a million requests: ~220 MB)."""
    v1 = config.resolved_scheduler() == "v1"
    steps = add_kv_breakdown(
        steps_table(result, v1=v1), result, config.allocator, max_model_len, usage, v1=v1
    )
    adm = prefix_cache = None
    if v1:
        prompt = request_column(result.requests, "prompt_tokens")
        adm = admissions(result.recorder.columns()[0], prompt)
        prefix_cache = prefix_cache_summary(adm, block_states, caching=config.caches_prefixes())
        if drop_events and block_states is not None:
            block_states.residency.drop_samples()
    requests = requests_table(result, steps, adm)
    offload = result.offload
    if offload is not None and adm is not None and prefix_cache is not None:
        _add_offload_columns(result, offload, adm, requests, steps, prefix_cache)
    if drop_events:
        result.recorder.drop_kept()
    summary = summarize(
        result, requests, steps,
        closed_loop=config.concurrency is not None, measured=config.mode == "engine",
        prefix_cache=prefix_cache,
    )  # fmt: skip
    return requests, steps, summary


def _add_offload_columns(
    result: SimResult,
    offload: OffloadRecords,
    adm: Admissions,
    requests: Table,
    steps: Table,
    prefix_cache: dict[str, Any],
) -> None:
    """An offloading run's requests and steps columns and summary section
    (kvsim/analysis/offload_metrics.py)."""
    n = len(result.requests)
    loaded = request_columns(adm, n, offload=True)["offload_hit_tokens"]
    requests.insert_after("prefix_hit_tokens", "offload_hit_tokens", loaded)
    columns = offload_request_columns(result.recorder.columns()[0], offload, n)
    after = "queueing_delay_s"
    for name, values in columns.items():
        requests.insert_after(after, name, values)
        after = name
    steps["offload_tier_chunks"] = offload.step_tier_chunks[: len(steps)]
    steps["offload_tier_evictions"] = offload.step_tier_evictions[: len(steps)]
    for tier in offload.secondary:  # a column pair per secondary tier (none without)
        steps[f"offload_{tier.name}_chunks"] = tier.step_chunks[: len(steps)]
        steps[f"offload_{tier.name}_evictions"] = tier.step_evictions[: len(steps)]
    prefix_cache["offload"] = offload_summary(
        adm, offload, columns["offload_load_wait_s"], result.block_size
    )
