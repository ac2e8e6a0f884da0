"""One replica's replay of a trace through the engine and its measurement (``simulate``):
the scheduler and the simulation core (compiled where one applies), the event consumers (KV
breakdown, block states, the streamed events file), then the run's tables."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engine import Scheduler, make_scheduler
from engine.core.events import ChunkCallback, Columns
from kvsim.analysis.block_states import BlockStateTracker
from kvsim.analysis.events_io import METRIC_KINDS, EventsParquetWriter, KeyedChunks
from kvsim.analysis.kv_breakdown import PagedUsageTracker, final_length, final_lengths
from kvsim.analysis.measure import measure
from kvsim.analysis.metrics import events_frame, mark_events
from kvsim.analysis.offload_metrics import transfers_table, transfers_with_tiers
from kvsim.analysis.table import Table
from kvsim.config import RunConfig, SchedulingLimits, scheduling_limits
from kvsim.costmodel import resolve_gpu
from kvsim.runner.result import RunResult
from kvsim.sim.allocators import build_allocator
from kvsim.sim.compiled_classic import compiled_simulation_class
from kvsim.sim.compiled_v1 import CompiledV1Simulation
from kvsim.sim.engine_config import key_source_of, prefix_source_of, scheduler_config
from kvsim.sim.executor import Executor
from kvsim.sim.free_heap import LONG_RUN_STEPS, return_free_heap
from kvsim.sim.offload_setup import OffloadSetup
from kvsim.sim.records import SimSettings
from kvsim.sim.simulation import PROGRESS_EVERY_STEPS, Progress, Simulation
from kvsim.sim.unarrived import unarrived_warning
from workloads import Request, Trace


def _offload_option(offload: OffloadSetup | None) -> dict[str, Any]:
    return {} if offload is None else {"offload": offload.engine_config}


def simulate(
    config: RunConfig,
    trace: Trace,
    num_blocks: int,
    max_model_len: int | None,
    executor: Executor,
    resolved: dict[str, Any],
    progress: Progress | None = None,
    *,
    scheduler: Scheduler | None = None,
    prompt_tokens_of: Callable[[Request], Any] | None = None,
    events_path: Path | None = None,
    keep_events: bool = True,
    on_start: Callable[[int], None] | None = None,
    limits: SchedulingLimits | None = None,
    offload: OffloadSetup | None = None,
    finish_events_later: bool = False,
) -> RunResult:
    """Replay ``trace`` with ``executor`` through ``scheduler`` (by default a fresh Scheduler
    and BlockManager built from ``config``, ``limits``, ``num_blocks`` and
    ``max_model_len``, with ``offload``'s tier behind its prefix cache); ``events_path`` and
    ``finish_events_later`` as ``run``'s."""
    placeholder_tokens = getattr(executor, "placeholder_tokens", False)
    compiled_class: type[CompiledV1Simulation] | None = None
    if scheduler is None:
        if limits is None:
            limits = scheduling_limits(config, resolve_gpu(config.gpu), max_model_len)
        scheduler = make_scheduler(
            scheduler_config(config, limits, max_model_len),
            build_allocator(
                config.allocator, num_blocks, config.block_size, limits.watermark, max_model_len,
                enable_prefix_caching=config.caches_prefixes(),
            ),
            fast=config.fast_decode and placeholder_tokens and offload is None,
            **_offload_option(offload),
        )  # fmt: skip
        if offload is None:  # the v1 or the classic core (kvsim/sim/compiled_classic.py)
            compiled_class = compiled_simulation_class(scheduler, executor, config.fast_decode)
        else:  # a run without a CPU tier does not import it (kvsim.sim.offload_setup)
            from kvsim.sim.compiled_offload import (
                CompiledOffloadSimulation,
                compiled_offload_applies,
            )

            if compiled_offload_applies(scheduler, executor, config.fast_decode, offload):
                compiled_class = CompiledOffloadSimulation  # kvsim/sim/compiled_offload.py
    compiled = compiled_class is not None
    prefix_of = None
    if placeholder_tokens and config.caches_prefixes():
        prefix_of = prefix_source_of(trace, config.block_size)

    key_source = key_source_of(trace, caching=config.caches_prefixes())

    settings = SimSettings(
        concurrency=config.concurrency,
        think_time_s=config.think_time_s,
        seed=config.seed,
        until=config.until,
    )
    # A v1 run with prefix caching stores each CACHE / EVICT block's key (events.parquet's
    # block_hash), for `kvsim export-kv-events`.
    keyed = config.caches_prefixes() and (events_path is not None or keep_events)
    writer = (
        EventsParquetWriter(events_path, block_hashes=keyed) if events_path is not None else None
    )
    # Streamed to disk or not kept: memory holds event rows without their block ids, and for
    # paging only the request-level kinds, because the KV breakdown is accounted chunk by chunk.
    streamed = writer is not None or not keep_events
    usage: PagedUsageTracker | None = None
    sim: Simulation | None = None
    if config.allocator == "paged":
        usage = PagedUsageTracker(
            config.block_size,
            # seq ids index the submitted requests; the sim exists before any chunk is packed
            lambda seq_id: final_length(sim.submitted[seq_id], max_model_len),  # type: ignore[union-attr]
        )
    consumers: list[ChunkCallback] = []
    if usage is not None and not compiled:  # the compiled core sums U itself
        consumers.append(usage.consume)
    # The evictions and vLLM's residency samples (the simulation counts the cached blocks
    # of each step itself); without prefix caching there are none.
    block_states = (
        BlockStateTracker(num_blocks, track_states=False) if config.caches_prefixes() else None
    )
    if block_states is not None and not compiled:  # the compiled core follows them itself
        consumers.append(block_states.consume)
    keyed_chunks: KeyedChunks | None = None
    if writer is not None and not keyed:
        consumers.append(writer.write_chunk)

    def on_chunk(cols: Columns, block_ids: np.ndarray) -> None:
        for consume in consumers:
            consume(cols, block_ids)

    options: dict[str, Any] = (
        {
            "key_source": key_source,
            "on_residency": block_states.restore_compiled if block_states is not None else None,
            "residency_sample": (1, 0)
            if block_states is None
            else (block_states.residency.capacity, block_states.residency.seed),
            "on_usage": usage.restore_compiled if usage is not None else None,
            "final_length_of": usage.final_length_of if usage is not None else None,
            "final_lengths_of": functools.partial(final_lengths, max_model_len=max_model_len)
            if usage is not None
            else None,
        }
        if compiled
        else {"prompt_tokens_of": prompt_tokens_of, "prefix_of": prefix_of}
    )
    if offload is not None and compiled:
        options["offload"] = offload
    elif offload is not None:
        options["offload_worker"] = offload.worker()
    sim = (compiled_class or Simulation)(
        trace.requests,
        scheduler,
        executor,
        settings,
        **options,
        on_events_chunk=on_chunk if streamed or consumers else None,
        keep_block_ids=not streamed,
        keep_kinds=METRIC_KINDS if streamed and usage is not None else None,
        keep_block_hashes=keyed,
        # an engine-mode step takes milliseconds to seconds: report each one
        progress_every_steps=1 if config.mode == "engine" else PROGRESS_EVERY_STEPS,
    )
    if writer is not None and keyed:
        keyed_chunks = KeyedChunks(sim.recorder, writer.write_chunk)
        consumers.append(keyed_chunks)
    if on_start is not None:
        on_start(len(trace.requests))
    finished = False
    try:
        result = sim.run(progress)
        if keyed_chunks is not None:
            keyed_chunks.close()
        if len(result.step_duration_s) >= LONG_RUN_STEPS:
            # the free heap goes back to the kernel before the metrics' tables (free_heap.py),
            # and again once the kept events and step rows are merged, so that their chunks'
            # memory goes back too (a million requests: 944 -> 646 MiB before the tables)
            return_free_heap()
            result.recorder.columns()
            result.recorder.step_columns()
            return_free_heap()
        # The metrics are computed while the writer thread encodes the last chunks (the
        # default trace's run waited 40-100 ms for it here); close() still raises its errors.
        marks = mark_events(result)
        # a streamed run's kept events serve the tables alone: dropped before the summary
        requests, steps, summary = measure(
            config, result, max_model_len, usage, block_states, drop_events=streamed
        )
        events = events_frame(result, block_hashes=keyed) if not streamed else None
        unarrived = unarrived_warning(
            trace, int(summary["num_requests"]), config.until, config.rate
        )
        if unarrived is not None:  # --until stopped the run before the trace's last arrival
            resolved.setdefault("warnings", []).append(unarrived)
        extra: dict[str, Table] = {}
        if result.offload is not None:
            tables = transfers_with_tiers if result.offload.secondary else transfers_table
            extra["transfers"] = tables(result.offload, result.block_size)
        out = RunResult(
            config, resolved, summary, requests, steps, events, events_path, marks,
            extra_tables=extra,
        )  # fmt: skip
        if writer is not None and finish_events_later:
            out._finish_events = writer.close
        finished = True
    finally:
        if writer is not None and not (finished and finish_events_later):
            writer.close()
    return out
