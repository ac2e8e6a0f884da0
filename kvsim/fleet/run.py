"""A fleet run, from a RunConfig to the tables of a run folder (kvsim.runner's counterpart).

Each replica is built as a one-replica cost-mode run builds its engine (same pool, limits and
step-time model; the Python v1 scheduler, its placeholder-token variant unless
``fast_decode`` is off), records its events with a ``KvEventTap`` and
is measured by the same code (``kvsim.runner.measure``). The run folder holds the fleet's
requests and steps (a ``replica`` column added), ``routing.parquet`` (one row per request:
where it went and what the router saw), summary.json (``kvsim.fleet.summary``) and an
events.parquet of the routing decisions (ROUTE events: kvsim/fleet/route_events.py), not of
the replicas' own events (docs/fleet.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engine import make_scheduler
from engine.v1.prefix_keys import UniquePrefix
from kvsim.analysis.block_states import BlockStateTracker
from kvsim.analysis.events_io import METRIC_KINDS, EventsParquetWriter
from kvsim.analysis.kv_breakdown import PagedUsageTracker, final_length
from kvsim.analysis.measure import measure
from kvsim.analysis.residency import RESERVOIR_SIZE
from kvsim.analysis.table import Table
from kvsim.config import RunConfig, SchedulingLimits
from kvsim.fleet.kv_index import KvEventTap
from kvsim.fleet.replicas import CompiledReplicaSimulation, ReplicaSimulation
from kvsim.fleet.route_events import route_columns, write_route_events
from kvsim.fleet.routers import make_router
from kvsim.fleet.simulation import FleetSimulation
from kvsim.fleet.summary import fleet_summary, router_settings
from kvsim.option_spec import parse_router_weights
from kvsim.sim.allocators import build_allocator
from kvsim.sim.compiled_v1 import KeySource, compiled_v1_applies
from kvsim.sim.engine_config import key_source_of, prefix_source_of, scheduler_config
from kvsim.sim.executor import Executor
from kvsim.sim.records import SimSettings
from kvsim.sim.simulation import Progress
from workloads import Request, Trace

MIN_RESERVOIR = 1 << 12  # residency samples kept per metric and replica, at least


class _Replica:
    """One replica's simulation and the trackers that follow its events: on the compiled
    core where a one-replica run would use it (``compiled_v1_applies``) and ``compiled`` is
    allowed, else on the Python scheduler."""

    def __init__(
        self,
        config: RunConfig,
        limits: SchedulingLimits,
        num_blocks: int,
        max_model_len: int | None,
        executor: Executor,
        prefix_of: Callable[[Request], Any] | None,
        key_source: KeySource,
        *,
        compiled: bool = True,
        write_events: Callable[[Any, np.ndarray], None] | None = None,
    ) -> None:
        """``write_events``: every chunk of the replica's events goes there too."""
        self.write_events = write_events
        caching = config.caches_prefixes()
        scheduler = make_scheduler(
            scheduler_config(config, limits, max_model_len),
            build_allocator(
                "paged", num_blocks, config.block_size, limits.watermark, max_model_len,
                enable_prefix_caching=caching,
            ),
            # the placeholder-token variant: its events are the readable scheduler's, recorded
            # as they happen (tests/kvsim/fleet/test_kv_index.py holds the routing equal)
            fast=config.fast_decode,
        )  # fmt: skip
        self.usage = PagedUsageTracker(
            config.block_size,
            lambda seq_id: final_length(self.sim.submitted[seq_id], max_model_len),
        )
        # the replicas share one run's residency sample budget (64 replicas of 2 M samples
        # each held 6 GiB of a 1 M-request run)
        capacity = max(RESERVOIR_SIZE // config.replicas, MIN_RESERVOIR)
        self.block_states = (
            BlockStateTracker(num_blocks, track_states=False, residency_capacity=capacity)
            if caching
            else None
        )
        settings = SimSettings(seed=config.seed, until=config.until)
        common: dict[str, Any] = {"keep_block_ids": False, "keep_kinds": METRIC_KINDS}
        self.compiled = compiled and compiled_v1_applies(scheduler, executor, config.fast_decode)
        self.sim: ReplicaSimulation | CompiledReplicaSimulation
        if self.compiled:  # the core follows residency and usage itself
            states = self.block_states
            self.sim = CompiledReplicaSimulation(
                [], scheduler, executor, settings, key_source=key_source,
                on_residency=states.restore_compiled if states is not None else None,
                residency_sample=(1, 0) if states is None
                else (states.residency.capacity, states.residency.seed),
                on_usage=self.usage.restore_compiled,
                final_length_of=self.usage.final_length_of, on_events_chunk=write_events,
                **common,
            )  # fmt: skip
            return
        consumers: list[Callable[[Any, np.ndarray], None]] = [self.usage.consume]
        if self.block_states is not None:
            consumers.append(self.block_states.consume)
        if write_events is not None:
            consumers.append(write_events)

        def on_chunk(cols: Any, block_ids: np.ndarray) -> None:
            for consume in consumers:
                consume(cols, block_ids)

        self.sim = ReplicaSimulation(
            [], scheduler, executor, settings, prefix_of=prefix_of, on_events_chunk=on_chunk,
            recorder_class=KvEventTap, **common,
        )  # fmt: skip


def prompt_keys(
    prefix_of: Callable[[Request], Any] | None, block_size: int
) -> Callable[[Request], list[int]]:
    """A request's full prompt blocks' keys as every replica keys them (``[]`` for a prompt
    that shares nothing: its keys are salted per replica and nobody else can hit them)."""

    def keys_of(request: Request) -> list[int]:
        if prefix_of is None:
            return []
        source = prefix_of(request)
        if isinstance(source, UniquePrefix):
            return []
        return source.prompt_block_keys(0, 0, request.prompt_tokens // block_size, block_size)  # type: ignore[no-any-return]

    return keys_of


def simulate_fleet(
    config: RunConfig,
    trace: Trace,
    num_blocks: int,
    max_model_len: int | None,
    make_executor: Callable[[], Executor],
    limits: SchedulingLimits,
    progress: Progress | None = None,
    events_path: Path | None = None,
) -> tuple[dict[str, Any], Table, Table, Table]:
    """Run ``trace`` through ``config.replicas`` replicas of ``num_blocks`` blocks each:
    summary.json, requests, steps and routing tables (``progress`` as FleetSimulation.run);
    the ROUTE events to ``events_path`` (kvsim/fleet/route_events.py) when given."""
    prefix_of = prefix_source_of(trace, config.block_size) if config.caches_prefixes() else None
    key_source = key_source_of(trace, caching=config.caches_prefixes())
    router = make_router(
        config.router,
        config.replicas,
        config.seed,
        prefix_weights=parse_router_weights(config.router_weights),
    )
    writer = None
    if events_path is not None and config.fleet_events == "all":
        writer = EventsParquetWriter(events_path, replica_column=True)
    replicas = [
        _Replica(
            config,
            limits,
            num_blocks,
            max_model_len,
            make_executor(),
            prefix_of,
            key_source,
            write_events=None if writer is None else _ReplicaEvents(writer, i),
        )
        for i in range(config.replicas)
    ]
    fleet = FleetSimulation(
        trace.requests,
        [r.sim for r in replicas],
        router,
        prompt_keys(prefix_of, config.block_size),
        block_size=config.block_size,
        event_delay_s=config.router_event_delay_s,
        oracle=config.router_oracle,
        until=config.until,
        speculative_ttl_s=config.router_speculative_ttl_s,
        route_events=writer is not None,
    )
    try:
        result = fleet.run(progress)  # each replica's collect() flushes its recorder
        for replica in replicas:
            if isinstance(replica.write_events, _ReplicaEvents):
                replica.write_events.flush()
    finally:
        if writer is not None:
            writer.close()
    summaries, request_tables, step_tables = [], [], []
    for i, (replica, sim_result) in enumerate(zip(replicas, result.replicas)):
        requests, steps, summary = measure(
            config, sim_result, max_model_len, replica.usage, replica.block_states
        )
        summaries.append(summary)
        request_tables.append(_with_replica(requests, i))
        step_tables.append(_with_replica(steps, i))
    samples = [r.block_states.residency.samples() for r in replicas if r.block_states is not None]
    requests = _in_arrival_order(request_tables, result.route_replica, result.route_seq_id)
    summary = fleet_summary(
        summaries,
        requests,
        step_tables,
        samples,
        router_settings(config, config.replicas),
    )
    routing = Table(
        {
            "request_id": requests["request_id"],
            "arrival_time_s": result.route_time_s,
            "replica": result.route_replica,
            "seq_id": result.route_seq_id,
            "router_prefix_blocks": result.route_prefix_blocks,
            "prompt_blocks": result.route_prompt_blocks,
        },
        text=frozenset({"request_id"}),
    )
    if events_path is not None and writer is None:
        assert result.route_step is not None and result.route_free_blocks is not None
        write_route_events(
            events_path,
            route_columns(
                result.route_time_s, result.route_step, result.route_replica,
                result.route_seq_id, result.route_free_blocks,
                result.route_prefix_blocks * config.block_size,
            ),
        )  # fmt: skip
    return summary, requests, _concatenated(step_tables), routing


# Events a replica's chunks are gathered into before they go to the writer (its recorder's
# chunk size): a compiled replica hands over a small chunk at every arrival when the router
# reads KV events (and one per ROUTE), each a round trip through the writer's queue, and
# the file would interleave the replicas a few rows at a time. The time it saves is within
# the noise of a shared machine (8 replicas of Mooncake's first 600 s, --fleet-events all:
# +4.9 s -> +4.7 s over no events); each replica's rows come in runs of 65,536 events or more.
GATHER_EVENTS = 1 << 16


class _ReplicaEvents:
    """A replica's event chunks on their way to the fleet's events.parquet, gathered into
    chunks of at least ``GATHER_EVENTS`` events (in order; ``flush`` sends the rest)."""

    def __init__(self, writer: EventsParquetWriter, replica: int) -> None:
        self.writer, self.replica = writer, replica
        self._parts: list[tuple[Any, np.ndarray]] = []
        self._num_events = 0

    def __call__(self, cols: Any, block_ids: np.ndarray) -> None:
        self._parts.append((cols, block_ids))  # a recorder never changes a chunk it handed out
        self._num_events += len(cols["kind"])
        if self._num_events >= GATHER_EVENTS:
            self.flush()

    def flush(self) -> None:
        parts = self._parts
        if not parts:
            return
        if len(parts) == 1:
            cols, block_ids = parts[0]
        else:
            cols = {name: np.concatenate([c[name] for c, _ in parts]) for name in parts[0][0]}
            block_ids = np.concatenate([ids for _, ids in parts])
        self.writer.write_chunk(cols, block_ids, None, self.replica)
        self._parts, self._num_events = [], 0


def _with_replica(table: Table, replica: int) -> Table:
    columns = {"replica": np.full(len(table), replica, dtype=np.int32), **table.columns}
    return Table(columns, dict(table.categories), table.text)


def _concatenated(tables: list[Table]) -> Table:
    """Rows of ``tables`` (same columns and categories: one run's code wrote each) in turn."""
    first = tables[0]
    columns = {n: np.concatenate([t[n] for t in tables]) for n in first.columns}
    return Table(columns, dict(first.categories), first.text)


def _in_arrival_order(
    tables: list[Table], route_replica: np.ndarray, route_seq_id: np.ndarray
) -> Table:
    """The replicas' request rows in the order the requests arrived (routing order)."""
    merged = _concatenated(tables)
    offsets = np.cumsum([0] + [len(t) for t in tables[:-1]])
    order = offsets[route_replica] + route_seq_id
    columns = {n: values[order] for n, values in merged.columns.items()}
    return Table(columns, merged.categories, merged.text)
