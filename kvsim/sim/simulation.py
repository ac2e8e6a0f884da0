"""The clock: a simpy Environment with workload processes and one engine-loop process.

    out = scheduler.schedule()            # who runs; the BlockManager allocates
    dt, tokens = executor.execute(out)    # predicted (cost mode) or measured (engine mode)
    yield env.timeout(dt)
    scheduler.update(out, tokens)         # finish, free; events are stamped with env.now

The simulator drives the engine's own Scheduler and BlockManager; it keeps no copy of their
logic and no mirror of KV memory. An idle engine sleeps until the next arrival.

Speed: in cost mode the scheduler is a FastDecodeScheduler (engine/fast/decode.py), whose
decode steps cost O(allocations + finishes) instead of O(running sequences), run back to back
by kvsim/sim/plain_decodes.py; its event stream is identical to the plain Scheduler's (tests
check this).
"""

from __future__ import annotations

import functools
import operator
import sys
import time
from array import array
from collections.abc import Callable, Generator, Iterable
from typing import Any

import numpy as np
import simpy

from engine import BlockManager, EventRecorder, SamplingParams, Scheduler, Sequence
from engine.core.events import ChunkCallback, EventKind, StepKind
from engine.core.scheduler_output import SchedulerOutput
from engine.core.sequence import SequenceStatus
from engine.offload.worker import OffloadWorker
from engine.v1.prefix_keys import PrefixSource
from kvsim.sim.executor import Executor
from kvsim.sim.gc_passes import fewer_gc_passes
from kvsim.sim.offload_loop import TierTrace, offload_engine_loop, offload_records
from kvsim.sim.plain_decodes import plain_decode_steps
from kvsim.sim.records import SimResult, SimSettings
from workloads import Request, closed_loop

Progress = Callable[[float, int], None]  # (simulated seconds, requests done)
PROGRESS_EVERY_STEPS = 4096


FINISHED_REJECTED = SequenceStatus.FINISHED_REJECTED
DECODE = StepKind.DECODE


def prefill_tokens(out: SchedulerOutput) -> int:
    """Tokens of ``out`` that prefill: all but those of sequences computing only their last
    token (engine.core.scheduler_output.step_kind's decodes). A fast v1 step lists its
    non-decoders in ``exact_seqs``; read it before ``update()``."""
    if out.kind is StepKind.PREFILL:
        return out.num_batched_tokens
    pairs = getattr(out, "exact_seqs", None)
    if pairs is None:
        pairs = zip(out.seqs, out.num_new_tokens)
    return sum(
        n
        for seq, n in pairs
        if not (
            n == 1
            and seq.cached_token_count + 1 == seq.num_prompt_tokens + len(seq.generated_token_ids)
        )
    )


class Simulation:
    """One replay of ``requests`` through ``scheduler`` with step times from ``executor``."""

    def __init__(
        self,
        requests: list[Request],
        scheduler: Scheduler,
        executor: Executor,
        settings: SimSettings,
        prompt_tokens_of: Callable[[Request], Any] | None = None,
        *,
        prefix_of: Callable[[Request], PrefixSource] | None = None,
        on_events_chunk: ChunkCallback | None = None,
        keep_block_ids: bool = True,
        keep_block_hashes: bool = False,
        keep_kinds: Iterable[EventKind] | None = None,
        progress_every_steps: int = PROGRESS_EVERY_STEPS,
        env: simpy.Environment | None = None,
        recorder_class: type[EventRecorder] = EventRecorder,
        on_step_end: Callable[[SchedulerOutput], None] | None = None,
        offload_worker: OffloadWorker | None = None,
    ) -> None:
        """``scheduler`` must be fresh (nothing queued); the simulation attaches its event
        recorder to it and to its BlockManager. ``prompt_tokens_of`` gives real prompt token
        ids (engine mode); without it prompts are ``range(prompt_tokens)``, and
        ``prefix_of`` says which prompts share a prefix (prefix caching in cost mode). With
        ``on_events_chunk`` every packed chunk of events goes there (e.g. to a Parquet file).
        The recorder keeps block ids only with ``keep_block_ids`` (else each event's first
        one), prefix-cache keys of CACHE / EVICT blocks with ``keep_block_hashes``, and only
        the events of ``keep_kinds`` if given (what the chunk consumers have already
        accounted for need not stay in memory). ``progress`` (of ``run``) is called
        every ``progress_every_steps`` steps and at the end. ``env`` is a clock shared with
        other simulations (a fleet's replicas, kvsim.fleet), which then feeds the requests
        with ``submit`` and ``close_arrivals`` instead of ``run``; ``recorder_class`` lets
        such a caller watch the events as they are recorded, and ``on_step_end`` each step's
        output once its sequences are updated (not with the multi-step decoding of a fast
        scheduler, whose plain decode steps make no output). ``offload_worker`` times the
        transfers of a scheduler that offloads (kvsim/sim/offload_loop.py)."""
        if scheduler.has_unfinished() or scheduler.step:
            raise ValueError("the scheduler has already been used; give a fresh one")
        self.env = simpy.Environment() if env is None else env
        # partial(attrgetter) reads the clock without a Python-level frame per event: simpy's
        # ``now`` is a property returning ``_now``, which the engine loop also sets directly.
        self.recorder = recorder_class(
            clock=functools.partial(operator.attrgetter("_now"), self.env),
            on_chunk=on_events_chunk,
            keep_block_ids=keep_block_ids,
            keep_kinds=keep_kinds,
            keep_block_hashes=keep_block_hashes,
        )
        scheduler.event_sink = self.recorder
        scheduler.block_manager.event_sink = self.recorder
        self.block_manager: BlockManager = scheduler.block_manager
        self.scheduler = scheduler
        self.executor = executor
        self.settings = settings
        self.requests = requests
        self._prompt_tokens_of = prompt_tokens_of
        self._prefix_of = prefix_of
        self._closed_loop = settings.concurrency is not None
        self._submitted: list[Request] = []
        self._seq_of_request: dict[str, int] = {}
        self._sampling_params: dict[int, SamplingParams] = {}  # by output tokens
        self._done: dict[int, simpy.Event] = {}  # closed loop only: what users wait on
        self._wake: simpy.Event | None = None
        self._all_submitted = False
        self._num_done = 0
        # array, not list: a million-request run has millions of steps.
        self._durations = array("d")
        self._filled = array("q")
        self._running = array("q")
        v1 = scheduler.config.scheduler == "v1"
        self._cached_free = array("q") if v1 else None
        self.offload_worker = offload_worker
        self._tier_trace = TierTrace()
        self._progress_every = progress_every_steps
        self._on_step_end = on_step_end
        self._next_progress = progress_every_steps
        self._decode_step_time: Callable[[int, int, int], float] | None = None
        self._reject_reasons: dict[int, str] = {}
        # Prefill tokens of the steps that have any, by step index: plain decode steps (the
        # hot loop) record nothing.
        self._prefill_at = array("q")
        self._prefill_tokens = array("q")

    @property
    def num_done(self) -> int:
        """Requests finished, aborted or rejected so far."""
        return self._num_done

    @property
    def submitted(self) -> list[Request]:
        """Requests submitted so far; a request's index is its seq_id."""
        return self._submitted

    # --- the two callbacks the workload processes use ---------------------------------------

    def _register(self, request: Request) -> int:
        """Number ``request`` (its seq_id: its index among the submitted)."""
        seq_id = len(self._submitted)
        self._submitted.append(request)
        self._seq_of_request[request.request_id] = seq_id
        return seq_id

    def _submitted_event(self, seq_id: int) -> simpy.Event | None:
        """Wake an idle engine; in a closed loop, the event the user waits on."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        if not self._closed_loop:
            return None
        done = self.env.event()
        self._done[seq_id] = done
        return done

    def submit(self, request: Request) -> simpy.Event | None:
        seq_id = self._register(request)
        prompt = (
            self._prompt_tokens_of(request)
            if self._prompt_tokens_of is not None
            else range(request.prompt_tokens)  # cost mode: token values never matter
        )
        params = self._sampling_params.get(request.output_tokens)
        if params is None:  # frozen, so shared by every request of this length
            params = SamplingParams(max_tokens=request.output_tokens, ignore_eos=True)
            self._sampling_params[request.output_tokens] = params
        prefix = self._prefix_of(request) if self._prefix_of is not None else None
        self.scheduler.add_request(
            Sequence(seq_id, prompt, params, float(self.env.now), request.priority, prefix=prefix)
        )
        return self._submitted_event(seq_id)

    def abort(self, request_id: str) -> None:
        seq_id = self._seq_of_request.get(request_id)
        if seq_id is not None and self.scheduler.abort(seq_id):
            self._finish(seq_id)

    def _cancel(self, request_id: str, _deadline: simpy.Event) -> None:
        self.abort(request_id)

    def _finish_seq(self, seq: Sequence) -> None:
        """A sequence the scheduler returned as finished (rejected ones with their reason)."""
        if seq.status is FINISHED_REJECTED:
            self._reject_reasons[seq.seq_id] = seq.finish_reason or "rejected"
        self._finish(seq.seq_id)

    def _finish(self, seq_id: int) -> None:
        self._num_done += 1
        if self._closed_loop:
            self._done.pop(seq_id).succeed()

    # --- processes ---------------------------------------------------------------------------

    def _open_loop(self) -> Generator[simpy.Event, Any, None]:
        """Submit each request at its arrival time; schedule its cancellation, if any."""
        env = self.env
        for request in self.requests:
            delay = request.arrival_time_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            self.submit(request)
            if request.cancel_after_s is not None:
                deadline = env.timeout(request.cancel_after_s)
                deadline.callbacks.append(functools.partial(self._cancel, request.request_id))
        self.close_arrivals()

    def close_arrivals(self) -> None:
        """Nothing more will be submitted: the engine loop ends once the queue drains."""
        self._all_submitted = True
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _closed_loop_workload(self) -> Generator[simpy.Event, Any, None]:
        s = self.settings
        assert s.concurrency is not None
        yield from closed_loop(
            self.env,
            self.requests,
            self.submit,  # type: ignore[arg-type]  # returns an event in closed loop
            s.concurrency,
            s.think_time_s,
            np.random.default_rng(s.seed),
            abort=self.abort,
        )
        self.close_arrivals()

    def _record_step(self, out: SchedulerOutput, dt: float) -> None:
        """Keep a scheduled step's duration and occupancy (before its update)."""
        if out.kind is not DECODE:
            self._prefill_at.append(len(self._durations))
            self._prefill_tokens.append(prefill_tokens(out))
        self._durations.append(dt)
        self._filled.append(self.scheduler.num_cached_tokens + out.num_batched_tokens)
        self._running.append(self.scheduler.num_running)
        if self._cached_free is not None:
            self._cached_free.append(self.block_manager.num_cached_free_blocks)

    def _engine_loop(self, progress: Progress | None) -> Generator[simpy.Event, Any, None]:
        if self.offload_worker is not None:
            yield from offload_engine_loop(self, self.offload_worker, self._tier_trace, progress)
            return
        env, sched, executor = self.env, self.scheduler, self.executor
        plain_decodes = hasattr(sched, "run_plain_decodes") and hasattr(
            executor, "decode_step_timer"
        )
        while True:
            if not sched.has_unfinished():
                if self._all_submitted:
                    return
                self._wake = env.event()
                yield self._wake
                continue
            if plain_decodes:
                yield from plain_decode_steps(self, progress)
                if not sched.has_unfinished():
                    continue
            out = sched.schedule()
            if out.is_empty:
                for seq in sched.update(out, []):
                    self._finish_seq(seq)
                # Nothing can run until something arrives, unless this step rejected or
                # preempted (a step that preempts skips the waiting pass: the next one must
                # look at the queue again, as vLLM's engine loop would)
                if not out.rejected and not out.preempted:
                    self._wake = env.event()
                    yield self._wake
                continue
            dt, tokens = executor.execute(out, sched)
            self._record_step(out, dt)
            yield from self._advance_clock(dt)
            for seq in sched.update(out, tokens):
                self._finish_seq(seq)
            if self._on_step_end is not None:
                self._on_step_end(out)
            self._report(progress)

    def _advance_clock(self, dt: float) -> Generator[simpy.Event, Any, None]:
        """Let a step of ``dt`` seconds run: a simpy timeout, or, when nothing else is due
        before it ends, a direct move of the clock (a timeout would only move the clock,
        at a third of the loop's simpy cost)."""
        env = self.env
        end = env.now + dt  # what env.timeout(dt) would be scheduled at
        if end < env.peek():
            env._now = end
        else:
            yield env.timeout(dt)

    def _report(self, progress: Progress | None) -> None:
        if progress is not None and len(self._durations) >= self._next_progress:
            self._next_progress += self._progress_every
            progress(self.env.now, self._num_done)

    def _before_flush(self) -> None:
        """Bring what the engine holds back up to date before the events are flushed."""
        sync = getattr(self.scheduler, "sync", None)
        if sync is not None:
            sync()  # leave every Sequence exact for whoever looks at them next

    def start_engine(self, progress: Progress | None = None) -> simpy.Process:
        """The engine loop as a process of ``env`` (a shared clock's caller feeds it)."""
        if progress is None:
            self._next_progress = sys.maxsize  # the per-step check then never fires
        return self.env.process(self._engine_loop(progress))

    def run(self, progress: Progress | None = None) -> SimResult:
        """Replay the workload to its end (or ``settings.until``) and return the result."""
        env = self.env
        start = time.perf_counter()
        engine = self.start_engine(progress)
        workload = self._closed_loop_workload() if self._closed_loop else self._open_loop()
        env.process(workload)
        stop: simpy.Event = engine
        if self.settings.until is not None:
            stop = env.any_of([engine, env.timeout(self.settings.until)])
        with fewer_gc_passes():
            env.run(until=stop)
        return self.collect(time.perf_counter() - start, progress)

    def collect(self, wall_time_s: float, progress: Progress | None = None) -> SimResult:
        """The result once the clock has stopped (``wall_time_s``: what the run took)."""
        env = self.env
        if progress is not None:
            progress(env.now, self._num_done)
        self._before_flush()
        self.recorder.flush()
        steps = self._step_records()
        prefill = np.zeros(len(steps["duration_s"]), dtype=np.int64)
        prefill[steps["prefill_at"]] = steps["prefill_tokens"]
        return SimResult(
            recorder=self.recorder,
            requests=self._submitted,
            block_size=self.block_manager.block_size,
            num_blocks=self.block_manager.num_blocks,
            step_duration_s=steps["duration_s"],
            step_filled_slots=steps["filled_slots"],
            step_num_running=steps["num_running"],
            sim_end_s=float(env.now),
            wall_time_s=wall_time_s,
            reject_reasons=self._reject_reasons,
            step_prefill_tokens=prefill,
            step_cached_free_blocks=steps.get("cached_free_blocks"),
            offload=offload_records(self, self._tier_trace),
        )

    def _step_records(self) -> dict[str, np.ndarray]:
        """The recorded steps' columns (V1Core.take_step_records' names; cached_free_blocks
        only for v1), as numpy arrays of their own."""
        steps = {
            "duration_s": np.frombuffer(self._durations, dtype=np.float64).copy(),
            "filled_slots": np.frombuffer(self._filled, dtype=np.int64).copy(),
            "num_running": np.frombuffer(self._running, dtype=np.int64).copy(),
            "prefill_at": np.frombuffer(self._prefill_at, dtype=np.int64),
            "prefill_tokens": np.frombuffer(self._prefill_tokens, dtype=np.int64),
        }
        if self._cached_free is not None:
            steps["cached_free_blocks"] = np.frombuffer(self._cached_free, dtype=np.int64).copy()
        return steps
