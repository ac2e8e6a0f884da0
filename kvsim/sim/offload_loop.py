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

from array import array
from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from engine.offload.worker import OffloadWorker
from kvsim.sim.records import OffloadRecords

Progress = Any  # kvsim.sim.simulation.Progress (that module imports this one)


class TierTrace:
    """The tier's occupancy at each executed step (aligned with the simulation's steps)."""

    def __init__(self) -> None:
        self.chunks = array("q")
        self.evictions = array("q")

    def record(self, sched: Any) -> None:
        manager = sched.connector.manager
        self.chunks.append(manager.num_held)
        self.evictions.append(manager.num_evicted)


def offload_engine_loop(
    sim: Any, worker: OffloadWorker, trace: TierTrace, progress: Progress | None
) -> Generator[simpy.Event, Any, None]:
    """``sim``'s engine loop (a kvsim.sim.simulation.Simulation) when its scheduler offloads
    (module docstring)."""
    env, sched, executor = sim.env, sim.scheduler, sim.executor
    while True:
        if not sched.has_unfinished():
            if sim._all_submitted:
                return
            sim._wake = env.event()
            yield sim._wake
            continue
        out = sched.schedule()
        meta = out.connector_meta
        assert meta is not None
        start = worker.start_step(meta, env.now)
        if start > env.now:
            yield env.timeout(start - env.now)
        if out.is_empty:
            # Stores this step built are submitted by the next step, at once (no idling).
            idle = not out.rejected and not out.preempted and not meta.store_jobs
            # (this step may have ended the connector's last work: then nothing is left)
            if idle and sched.has_unfinished():
                yield from _idle_until_next(sim, worker)
            for seq in sched.update(out, [], worker.poll(env.now)):
                sim._finish_seq(seq)
            continue
        completed = worker.poll(env.now)
        dt, tokens = executor.execute(out, sched)
        sim._record_step(out, dt)
        trace.record(sched)
        yield from sim._advance_clock(dt)
        for seq in sched.update(out, tokens, completed):
            sim._finish_seq(seq)
        if sim._on_step_end is not None:
            sim._on_step_end(out)
        sim._report(progress)


def _idle_until_next(sim: Any, worker: OffloadWorker) -> Generator[simpy.Event, Any, None]:
    """Nothing runs: wait for the next transfer completion or the next arrival."""
    env = sim.env
    sim._wake = env.event()
    due = worker.next_completion_time()
    if due is None:
        yield sim._wake
    else:
        yield env.any_of([sim._wake, env.timeout(max(due - env.now, 0.0))])


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
    )
