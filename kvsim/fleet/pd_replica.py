"""A P/D fleet's replica: the Python v1 scheduler with the P/D connector
(engine/pd/connector.py) and its engine loop with the transfers of engine/pd/worker.py on
the fleet's shared clock. The loop is offload's (kvsim/sim/offload_loop.py) without a tier:

    out = scheduler.schedule()                # a decode-side admission may issue a pull
    worker.start_step(meta, now)              # this step's pulls go on the link
    completed = worker.poll(now)              # pulls done, sends the decode side finished
    dt, tokens = executor.execute(out)
    yield env.timeout(dt)
    scheduler.update(out, tokens, completed)

A step that schedules nothing while pulls are in flight, or blocks wait for a pull, takes no
compute time: the clock moves to the next completion, arrival or notification (``wake``).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from engine.pd import PDConnector, PDWorker
from kvsim.fleet.replicas import ReplicaSimulation
from kvsim.sim.simulation import Progress


class PDReplicaSimulation(ReplicaSimulation):
    """A replica of a P/D fleet (its scheduler an OffloadingV1Scheduler with a PDConnector)."""

    pd_worker: PDWorker

    @property
    def connector(self) -> PDConnector:
        connector: PDConnector = self.scheduler.connector  # type: ignore[attr-defined]
        return connector

    def wake(self) -> None:
        """Something for an idle engine to look at (a send reported done)."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _engine_loop(self, progress: Progress | None) -> Generator[simpy.Event, Any, None]:
        env, sched, executor, worker = self.env, self.scheduler, self.executor, self.pd_worker
        while True:
            if not sched.has_unfinished():
                if self._all_submitted:
                    return
                self._wake = env.event()
                yield self._wake
                continue
            out = sched.schedule()
            meta = out.connector_meta
            assert meta is not None
            worker.start_step(meta, env.now)
            if out.is_empty:
                if not out.rejected and not out.preempted and sched.has_unfinished():
                    yield from self._idle_until_next()
                for seq in sched.update(out, [], worker.poll(env.now)):  # type: ignore[call-arg]
                    self._finish_seq(seq)
                continue
            completed = worker.poll(env.now)
            dt, tokens = executor.execute(out, sched)
            self._record_step(out, dt)
            yield from self._advance_clock(dt)
            for seq in sched.update(out, tokens, completed):  # type: ignore[call-arg]
                self._finish_seq(seq)
            if self._on_step_end is not None:
                self._on_step_end(out)
            self._report(progress)

    def _idle_until_next(self) -> Generator[simpy.Event, Any, None]:
        """Nothing runs: wait for the next pull completion, arrival or notification."""
        env = self.env
        if self.pd_worker.has_unreported():  # taken off the link by the fleet's watcher
            return
        self._wake = env.event()
        due = self.pd_worker.next_completion_time()
        if due is None:
            yield self._wake
        else:
            yield env.any_of([self._wake, env.timeout(max(due - env.now, 0.0))])
