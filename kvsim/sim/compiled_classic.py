"""Cost mode's classic-scheduler runs on the compiled core (engine/compiled: ClassicCore).

``CompiledClassicSimulation`` is CompiledV1Simulation (kvsim/sim/compiled_v1.py) with the
classic scheduler (engine/core/scheduler.py, vLLM's 2023 one) and its FIFO block pool in C++
(csrc/classic_scheduler.hpp, classic_pool.hpp) instead of the v1 ones: the same simpy clock,
workload processes, open-loop inline clock, engine loop between two simpy events
(csrc/sim_loop.hpp's SimLoopOf), step prices and KV-usage sums, so a run gives the Python
path's steps, events and run folder byte for byte (tests/kvsim/test_compiled_classic_runs.py).

``compiled_simulation_class`` says which compiled simulation, if any, runs a cost-mode run:
the v1 one where ``compiled_v1_applies``, this one where ``compiled_classic_applies`` (the
classic scheduler, the fast path, the paged BlockManager, a cost-model or linear step
clock, the extension built; ``KVSIM_PURE_PYTHON=1`` turns both off).
"""

from __future__ import annotations

from typing import Any

import simpy

from engine import Scheduler
from kvsim.sim.compiled_v1 import (
    CompiledV1Simulation,
    compiled_core_applies,
    compiled_v1_applies,
)
from kvsim.sim.executor import Executor
from workloads import Request


def compiled_classic_applies(scheduler: Scheduler, executor: Executor, fast: bool) -> bool:
    """Whether a run of ``scheduler`` priced by ``executor`` can run on ClassicCore."""
    return not scheduler.is_v1 and compiled_core_applies(scheduler, executor, fast)


def compiled_simulation_class(
    scheduler: Scheduler, executor: Executor, fast: bool
) -> type[CompiledV1Simulation] | None:
    """The compiled simulation that runs ``scheduler`` priced by ``executor`` (``fast``:
    placeholder tokens allowed), or None where the Python Simulation must."""
    if compiled_v1_applies(scheduler, executor, fast):
        return CompiledV1Simulation
    if compiled_classic_applies(scheduler, executor, fast):
        return CompiledClassicSimulation
    return None


class CompiledClassicSimulation(CompiledV1Simulation):
    """A Simulation whose classic scheduler is the compiled core (see the module docstring).
    ``scheduler`` is the Python scheduler the run would otherwise use: it gives the
    configuration and is never stepped. It takes CompiledV1Simulation's keyword arguments;
    there is no prefix cache, so ``key_source`` is not read and ``on_residency`` must be
    None."""

    # The core clock (csrc/open_loop.hpp) drives a V1Core; an open-loop classic replay keeps
    # the Python heap of kvsim/sim/inline_clock.py (the same steps and events).
    core_clock = False

    def _make_core(
        self,
        core_module: Any,
        scheduler: Scheduler,
        track_residency: bool,
        residency_sample: tuple[int, int],
        track_usage: bool,
    ) -> Any:
        if track_residency:
            raise ValueError("the classic pool caches nothing: no residency to track")
        bm = scheduler.block_manager
        return core_module.ClassicCore.from_config(
            scheduler.config,
            bm.num_blocks,
            bm.block_size,
            watermark=bm.watermark,
            track_usage=track_usage,
        )

    def submit(self, request: Request) -> simpy.Event | None:
        seq_id = self._register(request)
        core = self.core
        if self._final_length_of is not None:
            core.set_final_length(seq_id, self._final_length_of(seq_id))
        core.set_time(self.env._now)
        core.add_request(seq_id, request.prompt_tokens, request.output_tokens)
        return self._submitted_event(seq_id)
