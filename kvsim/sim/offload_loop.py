"""The engine loop with KV offloading: the plain loop (kvsim/sim/simulation.py) plus the
transfers of engine/offload/worker.py on the clock.

    out = scheduler.schedule()                  # admissions may issue loads; stores too
    start = worker.start_step(meta, now)        # deferred stores go; a flush may hold the step
    completed = worker.poll(start)              # what vLLM's get_finished sees after launch
    dt, tokens = executor.execute(out)
    yield env.timeout(dt)
    scheduler.update(out, tokens, completed)

A step that schedules nothing while transfers are in flight takes no compute time: the clock
moves to the next completion or arrival, whichever is first (vLLM keeps stepping while its
connector has pending work), and that step reports what completed by then.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from engine.offload.worker import OffloadWorker
from kvsim.costmodel.model import BatchShape
from kvsim.sim.records import OffloadRecords, SecondaryTierRecords

Progress = Any  # kvsim.sim.simulation.Progress (that module imports this one)


class TierTrace:
    """The tier's occupancy at each executed step (aligned with the simulation's steps), and
    for each load what recomputing its tokens instead would have taken."""

    def __init__(self) -> None:
        self.chunks = array("q")
        self.evictions = array("q")
        self.tier_chunks: list[array[int]] = []  # per secondary tier, as chunks
        self.tier_evictions: list[array[int]] = []
        self.recompute_s: dict[int, float] = {}  # load job id -> seconds

    def price_loads(self, executor: Any, loads: list[Any], sched: Any) -> None:
        """Each load's tokens as one prefill of its request alone, after its GPU hit, on the
        run's own step-time model (what computing them instead of loading would cost)."""
        bs = sched.block_manager.block_size
        for job in loads:
            seq = sched._unfinished[job.seq_id]
            self.recompute_s[job.job_id] = prefill_time_s(
                executor, seq.offload_hit_tokens, seq.prefix_hit_tokens, bs
            )

    def record(self, sched: Any) -> None:
        manager = sched.connector.manager
        self.chunks.append(manager.num_held)
        self.evictions.append(manager.num_evicted)
        tiering = sched.connector.tiering
        if tiering is not None:
            if not self.tier_chunks:
                self.tier_chunks = [array("q") for _ in tiering.tiers]
                self.tier_evictions = [array("q") for _ in tiering.tiers]
            for i, tier in enumerate(tiering.tiers):
                self.tier_chunks[i].append(tier.num_held)
                self.tier_evictions[i].append(tier.stats.evictions)


def offload_engine_loop(
    sim: Any, worker: OffloadWorker, trace: TierTrace, progress: Progress | None
) -> Generator[simpy.Event, Any, None]:
    """``sim``'s engine loop (a kvsim.sim.simulation.Simulation) when its scheduler offloads
    (module docstring)."""
    env, sched, executor = sim.env, sim.scheduler, sim.executor
    # Secondary tiers run on the scheduler's clock: it reads it at schedule() and update().
    tiering = sched.connector.tiering
    while True:
        if not sched.has_unfinished():
            if sim._all_submitted:
                return
            sim._wake = env.event()
            yield sim._wake
            continue
        if tiering is not None:
            tiering.now = env.now
        out = sched.schedule()
        meta = out.connector_meta
        assert meta is not None
        if meta.load_jobs:
            trace.price_loads(executor, meta.load_jobs, sched)
        start = worker.start_step(meta, env.now)
        if start > env.now:
            yield env.timeout(delay_until(env.now, start))
        if out.is_empty:
            # Stores this step built are submitted by the next step, at once (no idling);
            # completions the flush or the step's start collected are reported at once (an
            # aborted request's last stores may be all the connector waits for).
            idle = not out.rejected and not out.preempted and not meta.store_jobs
            idle = idle and not worker.has_unreported()
            # (this step may have ended the connector's last work: then nothing is left)
            if idle and sched.has_unfinished():
                yield from _idle_until_next(sim, worker, tiering)
            if tiering is not None:
                tiering.now = env.now
            for seq in sched.update(out, [], worker.poll(env.now)):
                sim._finish_seq(seq)
            continue
        completed = worker.poll(env.now)
        dt, tokens = executor.execute(out, sched)
        sim._record_step(out, dt)
        trace.record(sched)
        yield from sim._advance_clock(dt)
        if tiering is not None:
            tiering.now = env.now
        for seq in sched.update(out, tokens, completed):
            sim._finish_seq(seq)
        if sim._on_step_end is not None:
            sim._on_step_end(out)
        sim._report(progress)


def _idle_until_next(
    sim: Any, worker: OffloadWorker, tiering: Any = None
) -> Generator[simpy.Event, Any, None]:
    """Nothing runs: wait for the next transfer completion (any tier's) or the next
    arrival; not at all while a secondary tier's lookup answers wait for the next step."""
    env = sim.env
    sim._wake = env.event()
    due = worker.next_completion_time()
    if tiering is not None:
        tier_due = tiering.next_event_time()
        if tier_due is not None:
            due = tier_due if due is None else min(due, tier_due)
    if due is None:
        yield sim._wake
    else:
        yield env.any_of([sim._wake, env.timeout(delay_until(env.now, due))])


def delay_until(now: float, t: float) -> float:
    """The delay (s) a timeout at ``now`` needs to land at or after ``t`` (s): simpy's clock
    moves to ``now + delay``, which for ``delay = t - now`` can fall one float step short of
    ``t``, and a link whose clock reached ``t`` refuses the earlier time (the flush wait's
    "time is before the link's clock"). 0 when ``t`` is not after ``now``."""
    if t <= now:
        return 0.0
    delay = t - now
    while now + delay < t:
        delay = math.nextafter(delay, math.inf)
    return delay


def offload_records(sim: Any, trace: TierTrace) -> OffloadRecords | None:
    """What ``sim``'s transfers and tier did (None without offloading)."""
    worker = sim.offload_worker
    connector = getattr(sim.scheduler, "connector", None)
    if worker is None or connector is None:
        return None
    return OffloadRecords(
        tier_capacity_chunks=connector.config.num_chunks,
        blocks_per_chunk=connector.config.blocks_per_chunk,
        bytes_per_block=worker.bytes_per_block,
        jobs=list(worker.timings.values()),
        step_tier_chunks=np.frombuffer(trace.chunks, dtype=np.int64).copy(),
        step_tier_evictions=np.frombuffer(trace.evictions, dtype=np.int64).copy(),
        load_recompute_s=trace.recompute_s,
        secondary=_secondary_records(connector.tiering, trace),
    )


def _secondary_records(tiering: Any, trace: TierTrace) -> list[SecondaryTierRecords]:
    if tiering is None:
        return []
    out = []
    for i, tier in enumerate(tiering.tiers):
        chunks = trace.tier_chunks[i] if trace.tier_chunks else array("q")
        evictions = trace.tier_evictions[i] if trace.tier_evictions else array("q")
        out.append(
            SecondaryTierRecords(
                name=tier.name,
                capacity_chunks=tier.config.num_chunks,
                chunk_bytes=tier.config.chunk_bytes,
                jobs=tier.history,
                stats=tier.stats,
                promoted_chunks=tiering.promoted_chunks[i],
                loaded_chunks=tiering.loaded_chunks[i],
                step_chunks=np.frombuffer(chunks, dtype=np.int64).copy(),
                step_evictions=np.frombuffer(evictions, dtype=np.int64).copy(),
            )
        )
    return out


def prefill_time_s(executor: Any, tokens: int, cached: int, block_size: int) -> float:
    """Seconds of one step prefilling ``tokens`` tokens of a request after ``cached`` cached
    ones, alone, on ``executor``'s step-time model (the cost model, or a linear step time)."""
    cost_model = getattr(executor, "cost_model", None)
    if cost_model is None:
        return float(executor.base_s + executor.per_token_s * tokens)
    shape = BatchShape(
        num_seqs=1,
        num_batched_tokens=tokens,
        num_decode_seqs=0,
        decode_context_tokens=0,
        prefill_causal_pairs=tokens * (tokens + 1) // 2,
        prefill_cached_pairs=tokens * cached,
        prefill_cached_tokens=cached,
        num_blocks_walked=-(-(cached + tokens) // block_size),
    )
    return float(cost_model.step_time(shape))
