"""What a simulation is told beyond the engine (SimSettings) and what it leaves behind
(SimResult): the records kvsim.analysis reads, apart from the clock that makes them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import EventRecorder
from engine.offload.worker import JobTiming
from workloads import Request


@dataclass(frozen=True, slots=True, kw_only=True)
class SimSettings:
    """What the clock needs beyond the engine: the workload shape and when to stop."""

    concurrency: int | None = None  # closed loop with this many users; None: open loop
    think_time_s: float = 0.0
    seed: int = 0
    until: float | None = None  # stop at this simulated time (seconds)


@dataclass(slots=True)
class SimResult:
    """What one simulation leaves behind: the event stream and per-step measurements."""

    recorder: EventRecorder
    requests: list[Request]  # in seq_id order, with the arrival times actually used
    block_size: int
    num_blocks: int
    step_duration_s: np.ndarray  # one entry per non-empty step, in step order
    step_filled_slots: np.ndarray  # tokens whose K/V is in the cache during the step
    step_num_running: np.ndarray
    sim_end_s: float
    wall_time_s: float
    # Why each rejected request was rejected (the engine's Sequence.finish_reason), by seq_id.
    reject_reasons: dict[int, str] = dataclasses.field(default_factory=dict)
    # Tokens of each step that prefill (prompt or recompute chunks); the rest decode.
    step_prefill_tokens: np.ndarray | None = None
    # v1: free blocks keeping their prefix-cache key (cached, evictable) as each step was
    # scheduled, the BlockManager's count (what replaying the block events gives,
    # kvsim/analysis/block_states.py, at a fraction of the cost); 0 without prefix caching.
    step_cached_free_blocks: np.ndarray | None = None
    # With KV offloading: every transfer and the tier's occupancy per step.
    offload: OffloadRecords | None = None


@dataclass(slots=True)
class OffloadRecords:
    """What an offloading run's transfers did (kvsim/sim/offload_loop.py): each job with its
    times, and the CPU tier per executed step (aligned with steps.parquet's rows)."""

    tier_capacity_chunks: int
    blocks_per_chunk: int
    bytes_per_block: int  # KV bytes of one GPU block
    # every job submitted, in submission order (a compiled run's job keys and GPU block ids
    # are read-only numpy arrays, kvsim/sim/compiled_offload.py, the Python path's tuples)
    jobs: list[JobTiming]
    step_tier_chunks: np.ndarray  # chunks the tier held as each step was scheduled
    step_tier_evictions: np.ndarray  # chunks evicted from the tier by then (cumulative)
    # load job id -> seconds a lone prefill of its tokens would take instead (the run's model)
    load_recompute_s: dict[int, float] = dataclasses.field(default_factory=dict)
    # the secondary tiers behind the CPU tier (--kv-offload-tier), in lookup order
    secondary: list[SecondaryTierRecords] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SecondaryTierRecords:
    """What one secondary tier did (engine/offload/secondary_tier.py): its jobs (promotions:
    tier -> CPU, cascades: CPU -> tier), totals, and its chunks per executed step."""

    name: str
    capacity_chunks: int
    chunk_bytes: int
    jobs: list[Any]  # engine.offload.secondary_tier.TierJob, in submission order
    stats: Any  # engine.offload.secondary_tier.TierStats
    promoted_chunks: int  # chunks promoted into the CPU tier for a request's lookup
    loaded_chunks: int  # of those, chunks the requests then loaded into the GPU
    step_chunks: np.ndarray  # chunks it held as each step was scheduled
    step_evictions: np.ndarray  # chunks it evicted by then (cumulative)
