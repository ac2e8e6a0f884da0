"""Cost mode's v1 runs on the compiled core (engine/compiled: V1Core), same results.

``CompiledV1Simulation`` is the Simulation (kvsim/sim/simulation.py) with its scheduler and
block pool in C++: the same simpy clock, workload processes and per-step records, but each
step is one ``V1Core.schedule()`` and one ``update()`` call, and the step is priced from the
eight counts the core returns, exactly as the executor prices a Python step
(kvsim/sim/executor.py). The core's events are handed to the simulation's EventRecorder in
chunks (``EventRecorder.add_chunk``), so every consumer of the event stream sees what the
Python path would give it. tests/kvsim/test_compiled_runs.py compares whole runs.

It runs where ``compiled_v1_applies`` says so: v1, the fast path (placeholder tokens), paged
KV, a cost-model or linear step clock, and the extension built (``engine.compiled.load()``;
``KVSIM_PURE_PYTHON=1`` turns it off).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from engine import BlockManager, Scheduler, SequenceStatus, StepKind
from engine.compiled import load
from kvsim.sim.executor import CostModelExecutor, Executor, LinearStepExecutor
from kvsim.sim.simulation import Progress, Simulation
from workloads import Request

DECODE = int(StepKind.DECODE)
REJECTED = SequenceStatus.FINISHED_REJECTED.value
KeySource = Callable[[Request], tuple[list[int], int] | None]  # (hash_ids, hash_block_size)
StepTuple = tuple[int, ...]


def compiled_v1_applies(scheduler: Scheduler, executor: Executor, fast: bool) -> bool:
    """Whether a run of ``scheduler`` priced by ``executor`` can run on the compiled core."""
    return (
        fast
        and scheduler.is_v1
        and type(scheduler.block_manager) is BlockManager  # not a contiguous allocator
        and type(executor) in (CostModelExecutor, LinearStepExecutor)
        and load() is not None
    )


def step_pricer(executor: Executor) -> Callable[[StepTuple, Any], float]:
    """``price(step, core)``: the step's seconds, as ``executor.execute`` gives them for the
    same step of the Python scheduler (the same calls, so the same floats)."""
    if isinstance(executor, LinearStepExecutor):
        base, per_token = executor.base_s, executor.per_token_s

        def linear(step: StepTuple, core: Any) -> float:
            return base + per_token * step[1]

        return linear
    assert isinstance(executor, CostModelExecutor)
    step_time_of, decode_step_time = executor._step_time_of, executor.decode_step_time

    def cost_model(step: StepTuple, core: Any) -> float:
        n = step[0]
        if step[8] == DECODE and n == core.num_running:
            # CostModelExecutor.step_time: every running sequence decodes
            return decode_step_time(n, core.num_cached_tokens + n, step[7])
        return step_time_of(*step[:8])

    return cost_model


class CompiledV1Simulation(Simulation):
    """A Simulation whose scheduler is the compiled core (see the module docstring).
    ``scheduler`` is the Python scheduler the run would otherwise use: it gives the
    configuration and is never stepped. ``key_source`` gives a request's (hash_ids,
    hash_block_size) for prefix caching, or None for a prompt no other can share."""

    def __init__(
        self,
        requests: list[Request],
        scheduler: Scheduler,
        executor: Executor,
        settings: Any,
        *,
        key_source: KeySource,
        on_residency: Callable[..., None] | None = None,
        **kwargs: Any,
    ) -> None:
        """``on_residency``, if given, receives ``V1Core.take_residency()`` (the block
        residency samples and evictions, BlockStateTracker.add_folded's arguments) each
        time the core's events are taken."""
        super().__init__(requests, scheduler, executor, settings, **kwargs)
        core_module = load()
        assert core_module is not None, "check compiled_v1_applies first"
        bm = scheduler.block_manager
        self.core = core_module.V1Core.from_config(
            scheduler.config,
            bm.num_blocks,
            bm.block_size,
            bm.enable_prefix_caching,
            watermark=bm.watermark,
            prefix_cache_events=self.recorder.prefix_cache_events,
            track_residency=on_residency is not None,
        )
        self._on_residency = on_residency
        self._key_source = key_source
        self._price = step_pricer(executor)

    def submit(self, request: Request) -> simpy.Event | None:
        seq_id = self._register(request)
        core = self.core
        core.set_time(self.env._now)
        keys = self._key_source(request)
        arrival = float(self.env._now)
        if keys is None:
            core.add_unique_request(
                seq_id, request.prompt_tokens, request.output_tokens, arrival, request.priority
            )
        else:
            core.add_hash_id_request(
                seq_id, request.prompt_tokens, keys[0], keys[1], request.output_tokens,
                arrival, request.priority,
            )  # fmt: skip
        return self._submitted_event(seq_id)

    def abort(self, request_id: str) -> None:
        seq_id = self._seq_of_request.get(request_id)
        if seq_id is None:
            return
        self.core.set_time(self.env._now)
        if self.core.abort(seq_id):
            self._finish(seq_id)

    def _finished(self, finished: list[tuple[int, str, str]]) -> None:
        for seq_id, status, reason in finished:
            if status == REJECTED:
                self._reject_reasons[seq_id] = reason or "rejected"
            self._finish(seq_id)

    def _take_events(self, at_least: int) -> None:
        if self.core.num_events >= at_least:
            columns, block_ids, block_hashes, steps = self.core.take_events()
            if self._on_residency is not None:
                self._on_residency(*self.core.take_residency())
            self.recorder.add_chunk(columns, block_ids, steps, block_hashes)

    def _engine_loop(self, progress: Progress | None) -> Generator[simpy.Event, Any, None]:
        env, core, price = self.env, self.core, self._price
        durations, filled, running = self._durations, self._filled, self._running
        cached_free = self._cached_free
        prefill_at, prefill_tokens = self._prefill_at, self._prefill_tokens
        chunk_size = self.recorder.chunk_size
        while True:
            if not core.has_unfinished():
                if self._all_submitted:
                    return
                self._wake = env.event()
                yield self._wake
                continue
            core.set_time(env._now)
            step = core.schedule()
            if step[0] == 0:  # nothing scheduled (Simulation._engine_loop's is_empty)
                self._finished(core.update())
                if not step[10] and not step[11]:  # neither preempted nor rejected
                    self._wake = env.event()
                    yield self._wake
                continue
            dt = price(step, core)
            if step[8] != DECODE:
                prefill_at.append(len(durations))
                prefill_tokens.append(step[9])
            durations.append(dt)
            filled.append(core.num_cached_tokens + step[1])
            running.append(core.num_running)
            if cached_free is not None:
                cached_free.append(core.num_cached_free_blocks)
            yield from self._advance_clock(dt)
            core.set_time(env._now)
            self._finished(core.update())
            self._take_events(chunk_size)
            self._report(progress)

    def _before_flush(self) -> None:
        self._take_events(1)
