"""Cost mode's v1 runs on the compiled core (engine/compiled: V1Core), same results.

``CompiledV1Simulation`` is the Simulation (kvsim/sim/simulation.py) with its scheduler, block
pool and engine loop in C++: the same simpy clock, workload processes and per-step records,
but the steps between two simpy events (arrivals, cancellations, the ``--until`` stop) run
inside the core (``V1Core.run``, csrc/sim_loop.hpp), each priced from the counts the core
computes exactly as the executor prices a Python step (kvsim/sim/executor.py;
csrc/step_prices.hpp). Python hears only of what its clock must see: a step that ends at or
after the next simpy event, an idle engine, finished requests. The core's events are handed
to the simulation's EventRecorder in chunks (``EventRecorder.add_chunk``), so every consumer
of the event stream sees what the Python path would give it, and the core follows vLLM's
block residency samples itself (csrc/residency.hpp). tests/kvsim/test_compiled_runs.py
compares whole runs.

It runs where ``compiled_v1_applies`` says so: v1, the fast path (placeholder tokens), paged
KV, a cost-model or linear step clock, and the extension built (``engine.compiled.load()``;
``KVSIM_PURE_PYTHON=1`` turns it off).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from engine import BlockManager, Scheduler, SequenceStatus
from engine.compiled import load
from kvsim.sim.core_clock import run_in_core
from kvsim.sim.executor import CostModelExecutor, Executor, LinearStepExecutor
from kvsim.sim.gc_passes import fewer_gc_passes
from kvsim.sim.inline_clock import IDLE, PENDING, WAIT, run_inline
from kvsim.sim.records import SimResult
from kvsim.sim.simulation import Progress, Simulation
from workloads import Request
from workloads.request_columns import requests_with_extras

REJECTED = SequenceStatus.FINISHED_REJECTED.value
KeySource = Callable[[Request], tuple[list[int], int] | None]  # (hash_ids, hash_block_size)


def compiled_v1_applies(scheduler: Scheduler, executor: Executor, fast: bool) -> bool:
    """Whether a run of ``scheduler`` priced by ``executor`` can run on the compiled core."""
    return scheduler.is_v1 and compiled_core_applies(scheduler, executor, fast)


def compiled_core_applies(scheduler: Scheduler, executor: Executor, fast: bool) -> bool:
    """Whether a compiled core (V1Core, or ClassicCore: kvsim/sim/compiled_classic.py) can run
    ``scheduler``'s placeholder-token run priced by ``executor``, whichever its policy."""
    return (
        fast
        and type(scheduler.block_manager) is BlockManager  # not a contiguous allocator
        and type(executor) in (CostModelExecutor, LinearStepExecutor)
        and load() is not None
    )


def step_prices(executor: Executor, config: Any) -> dict[str, Any]:
    """``V1Core.start_loop``'s prices: what ``executor.execute`` prices a step by, for the
    compiled core to price the same step to the same float (csrc/step_prices.hpp)."""
    if isinstance(executor, LinearStepExecutor):
        return {"linear": (executor.base_s, executor.per_token_s)}
    assert isinstance(executor, CostModelExecutor)
    return executor.cost_model.step_price_terms(config.max_num_seqs, config.max_num_batched_tokens)


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
        on_residency: Callable[[dict[str, Any]], None] | None = None,
        residency_sample: tuple[int, int] = (1, 0),
        final_length_of: Callable[[int], int] | None = None,
        final_lengths_of: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
        on_usage: Callable[[dict[str, Any]], None] | None = None,
        **kwargs: Any,
    ) -> None:
        """``on_residency``, if given, receives ``V1Core.take_residency_state()`` once the run
        ends (the eviction count and the block residency reservoirs, for
        BlockStateTracker.restore_compiled); ``residency_sample``: the reservoirs' capacity
        and seed (kvsim/analysis/residency.py's). ``on_usage``, if given, receives
        ``V1Core.usage_state()`` once the run ends (U and the held references at each step,
        for PagedUsageTracker.restore_compiled); ``final_length_of`` gives a seq_id's T for
        it (PagedUsageTracker.final_length_of)."""
        if (on_usage is None) != (final_length_of is None):
            raise ValueError("on_usage and final_length_of go together")
        super().__init__(requests, scheduler, executor, settings, **kwargs)
        self._own_clock = kwargs.get("env") is None  # a fleet's replicas share one
        core_module = load()
        assert core_module is not None, "check compiled_v1_applies first"
        self.core = self._make_core(
            core_module, scheduler, on_residency is not None, residency_sample, on_usage is not None
        )
        self._final_length_of = final_length_of
        self._final_lengths_of = final_lengths_of
        self._on_usage = on_usage
        self._on_residency = on_residency
        self._key_source = key_source
        self._core_steps: dict[str, np.ndarray] | None = None  # _before_flush takes them
        self._start_core(step_prices(executor, scheduler.config))

    def _make_core(
        self,
        core_module: Any,
        scheduler: Scheduler,
        track_residency: bool,
        residency_sample: tuple[int, int],
        track_usage: bool,
    ) -> Any:
        """The compiled scheduler this simulation steps (a subclass's own: CompiledClassic-
        Simulation's ClassicCore)."""
        bm = scheduler.block_manager
        return getattr(core_module, self.core_class).from_config(
            scheduler.config,
            bm.num_blocks,
            bm.block_size,
            bm.enable_prefix_caching,
            watermark=bm.watermark,
            prefix_cache_events=self.recorder.prefix_cache_events,
            track_residency=track_residency,
            residency_capacity=residency_sample[0],
            residency_seed=residency_sample[1],
            track_usage=track_usage,
        )

    # The core's class in engine.compiled._core (a subclass may take another: offload's
    # OffloadV1Core; CompiledClassicSimulation makes its ClassicCore in its own _make_core).
    core_class = "V1Core"

    def _start_core(self, prices: dict[str, Any]) -> None:
        """Start the core's engine loop with the step ``prices`` (before any request)."""
        self.core.start_loop(prices)

    # Whether ``run`` may replay an open-loop trace without simpy (kvsim/sim/inline_clock.py);
    # False makes it take simpy's path always (tests compare the two).
    inline_clock = True

    def inline_clock_applies(self) -> bool:
        """Whether the run has simpy's arrivals and engine processes alone: open loop, no
        cancellations, no ``--until``, its own clock (kvsim/sim/inline_clock.py)."""
        return (
            self.inline_clock
            and self._own_clock
            and not self._closed_loop
            and self.settings.until is None
            and self.offload_worker is None
            and not any(
                r.cancel_after_s is not None for _, r in requests_with_extras(self.requests)
            )
        )

    # Whether such a replay runs its clock in the core (kvsim/sim/core_clock.py) rather than
    # in Python (run_inline); False keeps run_inline (tests compare the two).
    core_clock = True

    def final_lengths(
        self, prompt_tokens: np.ndarray, output_tokens: np.ndarray
    ) -> np.ndarray | None:
        """T of every request (``final_length_of``'s, in seq_id order), None without usage
        tracking; the requests must be ``submitted`` already."""
        if self._final_lengths_of is not None:
            return self._final_lengths_of(prompt_tokens, output_tokens)
        if self._final_length_of is None:
            return None
        n = len(prompt_tokens)
        return np.fromiter(map(self._final_length_of, range(n)), np.int64, n)

    def run(self, progress: Progress | None = None) -> SimResult:
        """``Simulation.run``; an open-loop replay runs its clock without simpy, to the same
        steps and events (kvsim/sim/inline_clock.py: the whole Azure 2023 conversation
        trace's 33,000 simpy events were ~0.1 s of its 1.3 s ``kvsim run``)."""
        if not self.inline_clock_applies():
            return super().run(progress)
        start = time.perf_counter()
        if progress is None:
            self._next_progress = sys.maxsize  # as start_engine: the check never fires
        with fewer_gc_passes():
            (run_in_core if self.core_clock else run_inline)(self, progress)
        return self.collect(time.perf_counter() - start, progress)

    def submit(self, request: Request) -> simpy.Event | None:
        seq_id = self._register(request)
        core = self.core
        if self._final_length_of is not None:
            core.set_final_length(seq_id, self._final_length_of(seq_id))
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
            self.recorder.add_chunk(columns, block_ids, steps, block_hashes)

    def _engine_loop(self, progress: Progress | None) -> Generator[simpy.Event, Any, None]:
        """Simulation._engine_loop with the steps between two simpy events run by the core
        (V1Core.run, csrc/sim_loop.hpp): Python is back only for what the clock must see."""
        env, core = self.env, self.core
        chunk_size = self.recorder.chunk_size
        stop_on_finish = self._closed_loop  # a finish lets a user send the next request
        while True:
            # the next multiple of the progress period (sys.maxsize without a callback): the
            # core stops there, as the Python loop reports every 4,096 steps
            outcome = core.run(
                env._now, env.peek(), self._next_progress, chunk_size, stop_on_finish
            )
            env._now = core.loop_now  # the steps that ended before the next simpy event
            self._after_run()
            if outcome == PENDING:
                yield env.timeout(core.pending_dt)
                core.finish_pending(env._now)
            self._finished(core.take_finished())
            self._take_events(chunk_size)
            self._report(progress)
            if outcome == IDLE:
                if self._all_submitted:
                    return
                self._wake = env.event()
                yield self._wake
            elif outcome == WAIT:
                self._wake = env.event()
                yield self._wake

    def _after_run(self) -> None:
        """The core has just handed control back (a pending step's events included): for
        subclasses that must see the events before anything else happens (a fleet's
        replica, kvsim/fleet/replicas.py)."""

    def _report(self, progress: Progress | None) -> None:
        if progress is not None and self.core.num_steps >= self._next_progress:
            self._next_progress += self._progress_every
            progress(self.env.now, self._num_done)

    def _before_flush(self) -> None:
        self._take_events(1)
        if self._on_residency is not None:
            self._on_residency(self.core.take_residency_state())
        if self._on_usage is not None:
            self._on_usage(self.core.usage_state())
        self.core.release_trackers()  # their states are the trackers' now
        # The core's step columns are taken once, as they are (a million-request run's 2 M
        # steps: ~100 MB that copying through the arrays of Simulation held twice over).
        self._core_steps = self.core.take_step_records()

    def _step_records(self) -> dict[str, np.ndarray]:
        steps, self._core_steps = self._core_steps, None
        assert steps is not None, "collect() takes the step records once"
        return steps
