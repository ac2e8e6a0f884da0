"""A P/D fleet run (``--pd P:D``), from a RunConfig to the tables of a run folder, as
kvsim/fleet/run.py does for an aggregated fleet (docs/fleet.md, "Prefill/decode
disaggregation").

Each replica is the Python v1 scheduler with the P/D connector (OffloadingV1Scheduler with a
PDConnector), its own pool, limits and step-time model, measured by the same code as any
replica. requests.parquet has one row per request in arrival order: a disaggregated request's
row is its decode leg's, with the prefill leg's arrival, admission and prefix hit (latencies
from the request's arrival), and ``replica`` (where it was routed first: its prefill replica,
or its decode replica when the decider kept it whole), ``decode_replica``, ``disaggregated``
and its pull (``pd_transfer_tokens``, ``pd_transfer_bytes``, ``pd_transfer_start_s``,
``pd_transfer_time_s``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from engine.offload.transfer import TransferLink
from engine.pd import PDConnector, PDWorker
from engine.v1.offloading_scheduler import OffloadingV1Scheduler
from kvsim.analysis.block_states import BlockStateTracker
from kvsim.analysis.events_io import METRIC_KINDS
from kvsim.analysis.kv_breakdown import PagedUsageTracker, final_length
from kvsim.analysis.measure import measure
from kvsim.analysis.residency import RESERVOIR_SIZE
from kvsim.analysis.table import Table
from kvsim.config import RunConfig, SchedulingLimits
from kvsim.fleet.kv_index import KvEventTap
from kvsim.fleet.pd import PDFleetResult, PDFleetSimulation, PDRoute
from kvsim.fleet.pd_pools import PDPool, pull_bytes_per_token
from kvsim.fleet.pd_replica import PDReplicaSimulation
from kvsim.fleet.pd_summary import pd_section
from kvsim.fleet.route_events import route_columns, write_route_events
from kvsim.fleet.routers import make_router
from kvsim.fleet.run import MIN_RESERVOIR, _concatenated, _with_replica, prompt_keys
from kvsim.fleet.summary import fleet_summary, router_settings
from kvsim.option_spec import parse_pd, parse_router_weights
from kvsim.sim.allocators import build_allocator
from kvsim.sim.engine_config import prefix_source_of, scheduler_config
from kvsim.sim.executor import Executor
from kvsim.sim.records import SimSettings
from kvsim.sim.simulation import Progress
from workloads import Request, Trace


class _PDReplica:
    """One P/D replica's simulation and the trackers that follow its events."""

    def __init__(
        self,
        config: RunConfig,
        limits: SchedulingLimits,
        num_blocks: int,
        max_model_len: int | None,
        executor: Executor,
        prefix_of: Callable[[Request], Any] | None,
        env: simpy.Environment,
        link: TransferLink | None,
        bytes_per_token: float,
        num_replicas: int,
    ) -> None:
        caching = config.caches_prefixes()
        connector = PDConnector(config.block_size)
        scheduler = OffloadingV1Scheduler(
            scheduler_config(config, limits, max_model_len),
            build_allocator(
                "paged", num_blocks, config.block_size, limits.watermark, max_model_len,
                enable_prefix_caching=caching,
            ),
            connector=connector,
        )  # fmt: skip
        self.usage = PagedUsageTracker(
            config.block_size,
            lambda seq_id: final_length(self.sim.submitted[seq_id], max_model_len),
        )
        capacity = max(RESERVOIR_SIZE // num_replicas, MIN_RESERVOIR)
        self.block_states = (
            BlockStateTracker(num_blocks, track_states=False, residency_capacity=capacity)
            if caching
            else None
        )
        consumers: list[Callable[[Any, np.ndarray], None]] = [self.usage.consume]
        if self.block_states is not None:
            consumers.append(self.block_states.consume)

        def on_chunk(cols: Any, block_ids: np.ndarray) -> None:
            for consume in consumers:
                consume(cols, block_ids)

        self.sim = PDReplicaSimulation(
            [], scheduler, executor, SimSettings(seed=config.seed, until=config.until),
            prefix_of=prefix_of, on_events_chunk=on_chunk, recorder_class=KvEventTap,
            keep_block_ids=False, keep_kinds=METRIC_KINDS, env=env,
        )  # fmt: skip
        self.sim.pd_worker = PDWorker(link, bytes_per_token, connector.job_tokens.__getitem__)


def build_pd_fleet(
    config: RunConfig,
    trace: Trace,
    pools: tuple[PDPool, PDPool],
    max_model_len: int | None,
    bytes_per_token: float | None = None,
) -> tuple[list[_PDReplica], PDFleetSimulation]:
    """``config.pd``'s replicas (prefill first), each with its pool's blocks, limits and
    step-time model, and the fleet that runs ``trace`` through them, pulls moving
    ``bytes_per_token`` bytes per token (default: kvsim.fleet.pd_pools.pull_bytes_per_token)."""
    num_prefill, num_decode = parse_pd(config.pd)
    n = num_prefill + num_decode
    bs = config.block_size
    if bytes_per_token is None:
        bytes_per_token = pull_bytes_per_token(*pools)
    prefix_of = prefix_source_of(trace, bs) if config.caches_prefixes() else None
    weights = parse_router_weights(config.router_weights)
    routers = (
        make_router(config.router, num_prefill, config.seed, prefix_weights=weights),
        make_router(config.router, num_decode, config.seed + 1, prefix_weights=weights),
    )
    env = simpy.Environment()
    rate = config.pd_link_gbps * 1e9
    latency = config.pd_link_latency_us * 1e-6
    replicas = []
    for i in range(n):
        pool = pools[0] if i < num_prefill else pools[1]
        replicas.append(
            _PDReplica(
                config,
                pool.limits,
                pool.num_blocks,
                max_model_len,
                pool.make_executor(),
                prefix_of,
                env,
                None if i < num_prefill else TransferLink(rate, rate, latency),
                bytes_per_token,
                n,
            )
        )
    fleet = PDFleetSimulation(
        trace.requests,
        [r.sim for r in replicas[:num_prefill]],
        [r.sim for r in replicas[num_prefill:]],
        routers,
        prompt_keys(prefix_of, bs),
        block_size=bs,
        threshold=config.pd_threshold,
        event_delay_s=config.router_event_delay_s,
        oracle=config.router_oracle,
        until=config.until,
        speculative_ttl_s=config.router_speculative_ttl_s,
    )
    return replicas, fleet


def simulate_pd_fleet(
    config: RunConfig,
    trace: Trace,
    pools: tuple[PDPool, PDPool],
    max_model_len: int | None,
    progress: Progress | None = None,
    events_path: Path | None = None,
) -> tuple[dict[str, Any], Table, Table, Table]:
    """Run ``trace`` through ``config.pd``'s fleet (``build_pd_fleet``): summary.json,
    requests, steps and routing tables (``progress`` as PDFleetSimulation.run); the ROUTE
    events to ``events_path`` when given (kvsim/fleet/route_events.py)."""
    num_prefill, num_decode = parse_pd(config.pd)
    n = num_prefill + num_decode
    bs = config.block_size
    bytes_per_token = pull_bytes_per_token(*pools)
    replicas, fleet = build_pd_fleet(config, trace, pools, max_model_len, bytes_per_token)
    result = fleet.run(progress)
    summaries, request_tables, step_tables = [], [], []
    for i, (replica, sim_result) in enumerate(zip(replicas, result.replicas)):
        requests, steps, summary = measure(
            config, sim_result, max_model_len, replica.usage, replica.block_states
        )
        summaries.append(summary)
        request_tables.append(_with_replica(requests, i))
        step_tables.append(_with_replica(steps, i))
    requests = pd_requests(request_tables, result)
    samples = [r.block_states.residency.samples() for r in replicas if r.block_states is not None]
    summary = fleet_summary(
        summaries,
        requests,
        step_tables,
        samples,
        router_settings(config, n),
    )
    summary["fleet"]["pd"] = pd_section(
        requests, config, num_prefill, num_decode, bytes_per_token, pools
    )
    routing = pd_routing(requests, result.routes, bs)
    if events_path is not None:
        write_route_events(events_path, pd_route_columns(result.routes, bs))
    return summary, requests, _concatenated(step_tables), routing


def pd_route_columns(routes: list[PDRoute], block_size: int) -> dict[str, np.ndarray]:
    """ROUTE events of a P/D fleet, in the order of the decisions: per request its decode
    replica (seq_id -1 if it never got there), then its prefill replica if disaggregated;
    num_tokens: the prompt tokens the router saw cached on each."""
    rows: list[tuple[float, int, int, int, int, int]] = []
    for r in routes:
        t = r.request.arrival_time_s
        step, free = r.decode_state
        rows.append((t, step, r.decode_replica, r.decode_seq, free,
                     r.decode_prefix_blocks * block_size))  # fmt: skip
        if r.disaggregated:
            step, free = r.prefill_state
            rows.append((t, step, r.prefill_replica, r.prefill_seq, free,
                         r.router_prefix_blocks * block_size))  # fmt: skip
    cols = list(zip(*rows)) if rows else [()] * 6
    return route_columns(*(np.array(c) for c in cols))


def pd_requests(tables: list[Table], result: PDFleetResult) -> Table:
    """One row per request in arrival order (module docstring)."""
    merged = _concatenated(tables)
    offsets = np.cumsum([0] + [len(t) for t in tables[:-1]])
    routes = result.routes
    handed = np.array([r.disaggregated and r.decode_seq >= 0 for r in routes], dtype=bool)
    first = np.array([r.prefill_replica if r.disaggregated else r.decode_replica for r in routes])
    first_seq = np.array([r.prefill_seq if r.disaggregated else r.decode_seq for r in routes])
    at_first = offsets[first] + first_seq if routes else np.zeros(0, dtype=np.int64)
    last = np.where(handed, [r.decode_replica for r in routes], first) if routes else first
    last_seq = np.where(handed, [r.decode_seq for r in routes], first_seq) if routes else first
    at_last = offsets[last] + last_seq if routes else at_first
    columns = {name: values[at_last] for name, values in merged.columns.items()}
    p = {name: values[at_first] for name, values in merged.columns.items()}
    # a handed-over request's row: its decode leg, timed from the request's arrival
    arrival = np.where(handed, p["arrival_time_s"], columns["arrival_time_s"])
    admit = np.where(handed, p["admit_time_s"], columns["admit_time_s"])
    columns["arrival_time_s"], columns["admit_time_s"] = arrival, admit
    columns["queueing_delay_s"] = admit - arrival
    columns["ttft_s"] = columns["first_token_time_s"] - arrival
    columns["e2e_latency_s"] = np.where(
        np.isnan(columns["e2e_latency_s"]), np.nan, columns["finish_time_s"] - arrival
    )
    if "prefill_time_s" in columns:
        columns["prefill_time_s"] = columns["first_token_time_s"] - admit
    for name in ("num_preemptions",):
        columns[name] = columns[name] + np.where(handed, p[name], 0)
    for name in ("prefix_hit_tokens",):
        if name in columns:
            columns[name] = np.where(handed, p[name], columns[name])
    columns["replica"] = first.astype(np.int32)
    transfers = [r.transfer for r in routes]
    extra: dict[str, np.ndarray] = {
        "decode_replica": np.array([r.decode_replica for r in routes], dtype=np.int32),
        "disaggregated": np.array([r.disaggregated for r in routes], dtype=np.int8),
        "pd_transfer_tokens": np.array([t.tokens if t else 0 for t in transfers], np.int64),
        "pd_transfer_bytes": np.array([t.nbytes if t else 0.0 for t in transfers], np.float64),
        "pd_transfer_start_s": np.array(
            [t.submitted_s if t else np.nan for t in transfers], np.float64
        ),
        "pd_transfer_time_s": np.array(
            [
                t.completed_s - t.submitted_s if t and t.completed_s is not None else np.nan
                for t in transfers
            ],
            np.float64,
        ),
    }
    table = Table(columns, dict(merged.categories), merged.text)
    after = "replica"
    for name, values in extra.items():
        table.insert_after(after, name, values)
        after = name
    return table


def pd_routing(requests: Table, routes: list[PDRoute], block_size: int) -> Table:
    """routing.parquet of a P/D fleet: where each request went and what the router saw."""
    return Table(
        {
            "request_id": requests["request_id"],
            "arrival_time_s": np.array([r.request.arrival_time_s for r in routes], np.float64),
            "replica": requests["replica"],
            "seq_id": np.array(
                [r.prefill_seq if r.disaggregated else r.decode_seq for r in routes], np.int64
            ),
            "router_prefix_blocks": np.array([r.router_prefix_blocks for r in routes], np.int64),
            "prompt_blocks": requests["prompt_tokens"].astype(np.int64) // block_size,
            "decode_replica": requests["decode_replica"],
            "decode_seq_id": np.array([r.decode_seq for r in routes], np.int64),
            "decode_prefix_blocks": np.array([r.decode_prefix_blocks for r in routes], np.int64),
            "disaggregated": requests["disaggregated"],
        },
        text=frozenset({"request_id"}),
    )
