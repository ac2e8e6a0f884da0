"""Multi-step decoding on the Python path: the simulator's hottest loop.

In cost mode the Python path's scheduler is a FastDecodeScheduler or FastV1Scheduler
(engine/fast/), which can run plain decode steps (nothing admitted or preempted) back to back
through ``run_plain_decodes`` without output objects; this loop prices each such step, keeps
its records and moves the simpy clock directly while nothing else is due
(Simulation._advance_clock's rule, inlined), so that every step keeps the duration, events and
time stamp it would have had on the general schedule / execute / update path.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from engine import Sequence
from engine.fast.decode import FastDecodeScheduler
from engine.fast.fast_v1 import FastV1Scheduler

Progress = Callable[[float, int], None]  # kvsim.sim.simulation.Progress (it imports this module)


def plain_decode_steps(sim: Any, progress: Progress | None) -> Generator[simpy.Event, Any, None]:
    """Let ``sim``'s scheduler (``sim``: a kvsim.sim.simulation.Simulation) run decode steps
    back to back while each is plain (nothing is admitted or preempted; arrivals and finishes
    may happen between them), without output objects or the general schedule / execute /
    update path. Every step keeps its own events, duration and time stamp, identical to
    running it the general way. A step that ends at or after the next simpy event is left
    pending and run with a timeout (see ``Simulation._advance_clock``)."""
    env, sched = sim.env, sim.scheduler
    assert isinstance(sched, (FastDecodeScheduler, FastV1Scheduler))
    if sim._decode_step_time is None:
        sim._decode_step_time = sim.executor.decode_step_timer()
    step_time = sim._decode_step_time
    durations, filled, running = sim._durations, sim._filled, sim._running
    bm, cached_free = sim.block_manager, sim._cached_free
    finish, peek = sim._finish_seq, env.peek
    pending_dt = 0.0
    # When the next simpy event is due: inside run_plain_decodes only a finish can bring
    # it closer (a closed-loop user's completion event), so it is read again only then.
    next_due = peek()

    def on_step(num_seqs: int, context_tokens: int, num_used_blocks: int) -> bool:
        nonlocal pending_dt
        dt = step_time(num_seqs, context_tokens, num_used_blocks)
        durations.append(dt)
        filled.append(context_tokens)
        running.append(num_seqs)
        if cached_free is not None:
            cached_free.append(bm.num_cached_free_blocks)
        if len(durations) >= sim._next_progress:  # never, without a progress callback
            sim._report(progress)
        end = env._now + dt  # _advance_clock, inlined: this is the simulator's hottest loop
        if end < next_due:
            env._now = end
            return True
        pending_dt = dt
        return False

    def on_finished(seqs: list[Sequence]) -> None:
        nonlocal next_due
        for seq in seqs:
            finish(seq)
        next_due = peek()

    while sched.run_plain_decodes(on_step, on_finished):
        yield env.timeout(pending_dt)
        on_finished(sched.end_plain_decode())
