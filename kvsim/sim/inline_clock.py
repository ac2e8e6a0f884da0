"""An open-loop run of the compiled core without simpy: the same clock, event for event.

A CompiledV1Simulation (kvsim/sim/compiled_v1.py) of an open-loop trace without cancellations,
without ``--until`` and on its own clock has two simpy processes and nothing else: the
arrivals (``Simulation._open_loop``) and the engine loop (``CompiledV1Simulation._engine_loop``).
Under simpy every arrival costs a Timeout object, a heap entry and two generator resumes, and so
does every step the core leaves pending: about 33,000 events for the whole Azure 2023
conversation trace. ``run_inline`` runs the same two processes as plain code over one heap of
``(time, order, what)`` entries, which is simpy's own rule for what happens next: the earliest
time first and, at one time, the entry scheduled first (simpy's event id; no event here has
another priority). So every arrival is submitted, every step scheduled and every pending step
finished at the same time and in the same order as under simpy, and the core records the same
events. tests/kvsim/test_inline_clock.py holds the two drivers equal, ties included (steps that
end exactly at an arrival, arrivals at one time); tests/kvsim/test_compiled_runs.py holds whole
runs equal to the Python path.

The entries, and the simpy events they stand for:

- ARRIVE: the arrival process resumes (its start, then each ``env.timeout(delay)`` before the
  next request): it submits every request due by now, then waits for the next one; after the
  last it closes arrivals and ends. (Its end is a simpy event too, at the last arrival's time;
  it can only make the core leave a step pending that it would have finished itself, at the
  same float time, so it is left out);
- WAKE: an idle or waiting engine is woken by a submission (``Simulation._submitted_event``) or
  by the close of arrivals;
- STEP: the step the core left pending (``env.timeout(core.pending_dt)``) has ended.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any, Protocol

import simpy

from engine.core.events import EventRecorder
from kvsim.sim.simulation import Progress
from workloads import Request

ARRIVE, WAKE, STEP = 0, 1, 2
# V1Core.run's outcomes (csrc/sim_loop.hpp's LoopOutcome, _core.LOOP_OUTCOMES) that ask
# the clock for something: sleep until an arrival, until woken, or wait for a pending step.
IDLE, WAIT, PENDING = 0, 1, 2


class InlineSimulation(Protocol):
    """What ``run_inline`` uses of a CompiledV1Simulation (kvsim/sim/compiled_v1.py, which
    imports this module)."""

    env: simpy.Environment
    core: Any  # engine.compiled's V1Core
    requests: list[Request]
    recorder: EventRecorder
    _next_progress: int
    _all_submitted: bool

    def submit(self, request: Request) -> simpy.Event | None: ...
    def _after_run(self) -> None: ...
    def _finished(self, finished: list[tuple[int, str, str]]) -> None: ...
    def _take_events(self, at_least: int) -> None: ...
    def _report(self, progress: Progress | None) -> None: ...


def run_inline(sim: InlineSimulation, progress: Progress | None) -> None:
    """Replay ``sim``'s requests to the end, as ``Simulation.run`` would under simpy (see the
    module docstring for when that holds: ``CompiledV1Simulation.inline_clock_applies``)."""
    env, core, requests = sim.env, sim.core, sim.requests
    chunk_size = sim.recorder.chunk_size
    heap: list[tuple[float, int, int]] = []
    order = itertools.count()  # simpy's event ids: at one time, the first scheduled goes first
    push, pop = heapq.heappush, heapq.heappop
    now = env._now
    next_request, num_requests = 0, len(requests)
    waiting = False  # the engine waits for a WAKE that nothing has scheduled yet
    finish_pending = False  # the engine resumes from its pending step
    # Simulation.run starts the engine's process before the arrivals': the engine runs first,
    # and the arrival process's start is the one event in the queue meanwhile.
    push(heap, (now, next(order), ARRIVE))
    resume_engine = True
    while True:
        if resume_engine:  # the engine loop, from its resumption to its next yield
            if finish_pending:
                core.finish_pending(now)
                sim._finished(core.take_finished())
                sim._take_events(chunk_size)
                sim._report(progress)
            while True:
                report_at = sim._next_progress  # CompiledV1Simulation._engine_loop's
                next_due = heap[0][0] if heap else math.inf  # env.peek()
                outcome = core.run(now, next_due, report_at, chunk_size, False)
                now = env._now = core.loop_now
                sim._after_run()
                if outcome == PENDING:
                    push(heap, (now + core.pending_dt, next(order), STEP))
                    finish_pending = True
                    break
                sim._finished(core.take_finished())
                sim._take_events(chunk_size)
                sim._report(progress)
                if outcome == IDLE and sim._all_submitted:
                    return  # the engine process ends, and with it the run
                if outcome in (IDLE, WAIT):
                    waiting, finish_pending = True, False
                    break
        at, _, what = pop(heap)
        now = env._now = at
        resume_engine = what in (WAKE, STEP)
        if what != ARRIVE:
            continue
        # Simulation._open_loop from its resumption to its next yield
        while next_request < num_requests:
            request = requests[next_request]
            delay = request.arrival_time_s - now
            if delay > 0:
                push(heap, (now + delay, next(order), ARRIVE))  # env.timeout(delay)
                break
            sim.submit(request)
            next_request += 1
            if waiting:  # the first submission wakes the engine
                waiting = False
                push(heap, (now, next(order), WAKE))
        else:  # close_arrivals(), then the process ends
            sim._all_submitted = True
            if waiting:
                waiting = False
                push(heap, (now, next(order), WAKE))
