"""A fleet on one clock: N replicas (each the v1 engine with its own pool) behind a router.

Every replica is a ``kvsim.sim.Simulation`` sharing one simpy environment; the router process
takes the requests in arrival order and, at each arrival time, builds the replicas' views
(``ReplicaView``), asks the router and submits the request to the replica chosen. The
replicas publish their load every ``stats_interval_s`` and their KV events continuously
(to a ``KvEventIndex`` that applies them ``event_delay_s`` late); with ``oracle`` the router
reads the replicas' caches directly instead.
"""

from __future__ import annotations

import functools
import time
from array import array
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from engine.core.scheduler_output import SchedulerOutput
from kvsim.fleet.kv_index import KvEventIndex, KvEventTap
from kvsim.fleet.routers import ReplicaView, Router, RouteRequest
from kvsim.sim.gc_passes import fewer_gc_passes
from kvsim.sim.simulation import SimResult, Simulation
from workloads import Request

# Replica-side bookkeeping the router keeps per routed request (Dynamo's slot tracker).
_PREFILLING, _DECODING = 0, 1


class ReplicaSimulation(Simulation):
    """A replica: a Simulation that tells the fleet when its sequences finish."""

    on_finish: Callable[[int, int], None] | None = None  # (replica, seq_id)
    replica: int = 0

    def _finish(self, seq_id: int) -> None:
        super()._finish(seq_id)
        if self.on_finish is not None:
            self.on_finish(self.replica, seq_id)


@dataclass(slots=True)
class FleetSimResult:
    """The replicas' results and the routing decisions, one row per request in arrival
    order: the replica chosen, its seq_id there, and what the router saw of the chosen
    replica's cache (prompt blocks it held, by the router's view)."""

    replicas: list[SimResult]
    route_time_s: np.ndarray
    route_replica: np.ndarray
    route_seq_id: np.ndarray
    route_prefix_blocks: np.ndarray
    route_prompt_blocks: np.ndarray
    wall_time_s: float


class FleetSimulation:
    """``requests`` routed by ``router`` to ``replicas`` (fresh, built on ``env``)."""

    def __init__(
        self,
        env: simpy.Environment,
        requests: list[Request],
        replicas: Sequence[ReplicaSimulation],
        router: Router,
        prompt_keys_of: Callable[[Request], list[int]],
        *,
        block_size: int,
        event_delay_s: float = 0.05,
        stats_interval_s: float = 0.1,
        oracle: bool = False,
        until: float | None = None,
    ) -> None:
        """``prompt_keys_of`` gives a request's full prompt blocks' keys as the replicas key
        them (``[]`` for a prompt nobody shares)."""
        if stats_interval_s <= 0:
            raise ValueError(f"stats_interval_s must be > 0 seconds, got {stats_interval_s}")
        self.env = env
        self.requests = requests
        self.replicas = list(replicas)
        self.router = router
        self.block_size = block_size
        self.stats_interval_s = stats_interval_s
        self.oracle = oracle
        self.until = until
        self.index = KvEventIndex(len(self.replicas), event_delay_s)
        self._prompt_keys_of = prompt_keys_of
        n = len(self.replicas)
        self._stats = [(0, 0, 0.0)] * n  # published (waiting, running, kv_usage)
        self._routed_active = [0] * n
        self._prefill_tokens = [0] * n
        self._active_blocks = [0] * n
        # per (replica, seq_id): (phase, uncached prompt tokens, blocks) while unfinished
        self._tracked: list[dict[int, tuple[int, int, int]]] = [{} for _ in range(n)]
        self._route_time = array("d")
        self._route_replica = array("q")
        self._route_seq = array("q")
        self._route_prefix = array("q")
        self._route_blocks = array("q")
        self._arrivals_done = False
        for i, sim in enumerate(self.replicas):
            if sim.env is not env:
                raise ValueError("every replica must run on the fleet's environment")
            sim.replica = i
            sim.on_finish = self._finished
            sim._on_step_end = functools.partial(self._step_ended, i)
            if router.uses_prefix and not oracle:  # only such a router reads the events
                recorder = sim.recorder
                if not isinstance(recorder, KvEventTap):
                    raise ValueError(
                        "a prefix-aware router needs replicas recording with KvEventTap"
                    )
                recorder.index, recorder.replica = self.index, i

    # --- the router's bookkeeping -------------------------------------------------------

    def _finished(self, replica: int, seq_id: int) -> None:
        entry = self._tracked[replica].pop(seq_id, None)
        if entry is None:
            return
        phase, prefill, blocks = entry
        self._routed_active[replica] -= 1
        self._active_blocks[replica] -= blocks
        if phase == _PREFILLING:
            self._prefill_tokens[replica] -= prefill

    def _step_ended(self, replica: int, out: SchedulerOutput) -> None:
        """A request's prefill load leaves the router's count at its first token."""
        tracked = self._tracked[replica]
        for seq in out.seqs:
            entry = tracked.get(seq.seq_id)
            if entry is not None and entry[0] == _PREFILLING and seq.generated_token_ids:
                tracked[seq.seq_id] = (_DECODING, 0, entry[2])
                self._prefill_tokens[replica] -= entry[1]

    # --- processes ----------------------------------------------------------------------

    def _publisher(self) -> Generator[simpy.Event, Any, None]:
        """The replicas' load, published every ``stats_interval_s`` while requests arrive."""
        env = self.env
        while not self._arrivals_done:
            self._stats = [
                (
                    sim.scheduler.num_waiting,
                    sim.scheduler.num_running,
                    1.0 - sim.block_manager.get_num_free_blocks() / sim.block_manager.num_blocks,
                )
                for sim in self.replicas
            ]
            self.router.on_stats()
            yield env.timeout(self.stats_interval_s)

    def _prefix_blocks(self, replica: int, keys: list[int]) -> int:
        if not keys:
            return 0
        if self.oracle:
            return self.replicas[replica].block_manager.cached_prefix_length(keys)  # type: ignore[attr-defined, no-any-return]
        return self.index.prefix_blocks(replica, keys)

    def _views(self, keys: list[int]) -> list[ReplicaView]:
        index, uses_prefix = self.index, self.router.uses_prefix
        views = []
        for i, (waiting, running, usage) in enumerate(self._stats):
            views.append(
                ReplicaView(
                    waiting=waiting,
                    running=running,
                    kv_usage=usage,
                    prefix_blocks=self._prefix_blocks(i, keys) if uses_prefix else 0,
                    cached_blocks=index.num_cached_blocks(i) if uses_prefix else 0,
                    routed_active=self._routed_active[i],
                    active_prefill_tokens=self._prefill_tokens[i],
                    active_blocks=self._active_blocks[i],
                )
            )
        return views

    def _route(self, request: Request) -> None:
        env, bs = self.env, self.block_size
        self.index.advance(env.now)
        keys = self._prompt_keys_of(request) if self.router.uses_prefix else []
        num_blocks = request.prompt_tokens // bs
        views = self._views(keys)
        chosen = self.router.choose(RouteRequest(request.prompt_tokens, num_blocks, bs), views)
        if not 0 <= chosen < len(self.replicas):
            raise RuntimeError(f"router {self.router.name} chose replica {chosen}")
        sim = self.replicas[chosen]
        seq_id = len(sim.submitted)
        held = views[chosen].prefix_blocks
        uncached = max(0, request.prompt_tokens - held * bs)
        blocks = -(-request.prompt_tokens // bs) - held
        self._tracked[chosen][seq_id] = (_PREFILLING, uncached, blocks)
        self._routed_active[chosen] += 1
        self._prefill_tokens[chosen] += uncached
        self._active_blocks[chosen] += blocks
        self._route_time.append(env.now)
        self._route_replica.append(chosen)
        self._route_seq.append(seq_id)
        self._route_prefix.append(held)
        self._route_blocks.append(num_blocks)
        sim.submit(request)
        if request.cancel_after_s is not None:
            deadline = env.timeout(request.cancel_after_s)
            deadline.callbacks.append(lambda _e, r=request, s=sim: s.abort(r.request_id))

    def _arrivals(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        for request in self.requests:
            delay = request.arrival_time_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            self._route(request)
        self._arrivals_done = True
        for sim in self.replicas:
            sim.close_arrivals()

    def run(self) -> FleetSimResult:
        """Replay the requests to the end (or ``until``)."""
        env = self.env
        start = time.perf_counter()
        engines = [sim.start_engine() for sim in self.replicas]
        env.process(self._publisher())
        env.process(self._arrivals())
        stop: simpy.Event = env.all_of(engines)
        if self.until is not None:
            stop = env.any_of([stop, env.timeout(self.until)])
        with fewer_gc_passes():
            env.run(until=stop)
        wall = time.perf_counter() - start
        results = [sim.collect(wall) for sim in self.replicas]

        def column(values: array, dtype: type) -> np.ndarray:
            return np.frombuffer(values, dtype=dtype).copy()

        return FleetSimResult(
            replicas=results,
            route_time_s=column(self._route_time, np.float64),
            route_replica=column(self._route_replica, np.int64),
            route_seq_id=column(self._route_seq, np.int64),
            route_prefix_blocks=column(self._route_prefix, np.int64),
            route_prompt_blocks=column(self._route_blocks, np.int64),
            wall_time_s=wall,
        )
