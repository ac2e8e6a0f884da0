"""Cost mode's KV-offload runs on the compiled core (engine/compiled: OffloadV1Core), same
results.

``CompiledOffloadSimulation`` is CompiledV1Simulation (kvsim/sim/compiled_v1.py) with a CPU
tier behind the core's prefix cache: the offloading scheduler, its connector, the worker and
the engine loop of kvsim/sim/offload_loop.py run in C++ (csrc/offload_connector.hpp,
v1_offload_passes.hpp, offload_loop.hpp), the tier and link being the compiled ones the
Python path uses too. Python's simpy clock stays the one clock: the core hands control back
for what it must see (a flush wait, a step or an idle wait for a transfer that reaches the
next simpy event, an engine with nothing to do), and at the end the job timings and the
tier's per-step trace become the OffloadRecords the Python loop leaves
(tests/kvsim/test_compiled_offload_runs.py compares whole run folders).

It runs where ``compiled_offload_applies`` says so: where the compiled v1 core would run, with
the CPU tier alone (``--kv-offload-tier`` runs stay on the Python path), FCFS and GPU prefix
caching on.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from engine import Scheduler
from engine.core.scheduler_output import TransferJob
from engine.offload.worker import JobTiming
from kvsim.sim.compiled_v1 import CompiledV1Simulation, compiled_v1_applies
from kvsim.sim.executor import Executor
from kvsim.sim.gc_passes import fewer_gc_passes
from kvsim.sim.inline_clock import IDLE, PENDING, WAIT
from kvsim.sim.offload_loop import prefill_time_s
from kvsim.sim.offload_setup import OffloadSetup
from kvsim.sim.records import OffloadRecords, SimResult
from kvsim.sim.simulation import Progress

IDLE_UNTIL = 6  # OffloadV1Core.offload_run's own outcome (OFFLOAD_LOOP_OUTCOMES)


def compiled_offload_applies(
    scheduler: Scheduler, executor: Executor, fast: bool, offload: OffloadSetup
) -> bool:
    """Whether an offloading run of ``scheduler`` can run on the compiled core."""
    cfg = offload.engine_config
    return (
        not cfg.secondary_tiers
        and cfg.offload_prompt_only
        and cfg.policy in ("lru", "arc")
        and scheduler.config.policy == "fcfs"
        and scheduler.block_manager.enable_prefix_caching
        and compiled_v1_applies(scheduler, executor, fast)
    )


class CompiledOffloadSimulation(CompiledV1Simulation):
    """A CompiledV1Simulation whose core offloads to the CPU tier of ``offload`` (see the
    module docstring)."""

    core_class = "OffloadV1Core"

    def __init__(self, *args: Any, offload: OffloadSetup, **kwargs: Any) -> None:
        self._offload = offload
        super().__init__(*args, **kwargs)

    def _start_core(self, prices: dict[str, Any]) -> None:
        cfg, plan = self._offload.engine_config, self._offload.plan
        self.core.enable_offload(cfg.num_chunks, cfg.blocks_per_chunk, cfg.policy)
        link = plan.link
        self.core.start_offload_loop(
            prices,
            link.read_bytes_per_s,
            link.write_bytes_per_s,
            link.latency_s,
            plan.gpu_block_transfer_bytes,
        )

    def inline_clock_applies(self) -> bool:
        return False  # the offload loop's waits need simpy's clock

    def _engine_loop(self, progress: Progress | None) -> Generator[simpy.Event, Any, None]:
        """offload_engine_loop (kvsim/sim/offload_loop.py) with the steps between two simpy
        events run by the core (OffloadV1Core.offload_run, csrc/offload_loop.hpp)."""
        env, core = self.env, self.core
        chunk_size = self.recorder.chunk_size
        stop_on_finish = self._closed_loop
        while True:
            # the next multiple of the progress period (sys.maxsize without a callback), as
            # CompiledV1Simulation._engine_loop
            outcome = core.offload_run(
                env._now, env.peek(), self._next_progress, chunk_size, stop_on_finish
            )
            env._now = core.loop_now
            self._finished(core.take_finished())
            self._take_events(chunk_size)
            self._report(progress)
            if outcome == PENDING:
                yield env.timeout(core.pending_dt)
            elif outcome == IDLE_UNTIL:  # the next completion, unless an arrival comes first
                self._wake = env.event()
                yield env.any_of([self._wake, env.timeout(core.pending_dt)])
            elif outcome == WAIT:
                self._wake = env.event()
                yield self._wake
            elif outcome == IDLE:
                if self._all_submitted:
                    return
                self._wake = env.event()
                yield self._wake

    def collect(self, wall_time_s: float, progress: Progress | None = None) -> SimResult:
        result = super().collect(wall_time_s, progress)
        with fewer_gc_passes():  # thousands of jobs, none in a cycle
            result.offload = self._offload_records()
        return result

    def _offload_records(self) -> OffloadRecords:
        """offload_loop.offload_records from the core's columns: the same JobTiming objects,
        tier trace and recompute prices."""
        rec = self.core.take_offload_records()
        key_ends = np.cumsum(rec["num_keys"]).tolist()
        block_ends = np.cumsum(rec["num_blocks"]).tolist()
        # Each job's keys and blocks are read-only numpy views of the core's columns, not
        # tuples: the whole Mooncake trace moves ~8 M chunks, and their Python ints and
        # tuples took 1.5 s of a 19 s run (what reads them takes their lengths).
        keys, blocks = rec["keys"], rec["gpu_block_ids"]
        keys.flags.writeable = blocks.flags.writeable = False
        jobs = []
        k0 = b0 = 0
        for job_id, seq_id, is_store, nbytes, submitted, completed, k1, b1 in zip(
            rec["job_id"].tolist(),
            rec["seq_id"].tolist(),
            rec["is_store"].tolist(),
            rec["nbytes"].tolist(),
            rec["submitted_s"].tolist(),
            rec["completed_s"].tolist(),
            key_ends,
            block_ends,
        ):
            job = TransferJob(job_id, seq_id, bool(is_store), keys[k0:k1], blocks[b0:b1])
            done = None if completed != completed else completed  # NaN: still in flight
            jobs.append(JobTiming(job, nbytes, submitted, done))
            k0, b0 = k1, b1
        bs = self.block_manager.block_size
        recompute = {
            job: prefill_time_s(self.executor, tokens, cached, bs)
            for job, tokens, cached in zip(
                rec["load_job"].tolist(), rec["load_tokens"].tolist(), rec["load_cached"].tolist()
            )
        }
        cfg = self._offload.engine_config
        return OffloadRecords(
            tier_capacity_chunks=cfg.num_chunks,
            blocks_per_chunk=cfg.blocks_per_chunk,
            bytes_per_block=self._offload.plan.gpu_block_transfer_bytes,
            jobs=jobs,
            step_tier_chunks=rec["tier_chunks"],
            step_tier_evictions=rec["tier_evictions"],
            load_recompute_s=recompute,
        )
