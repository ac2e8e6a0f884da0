"""A fleet: N replicas (each the v1 engine with its own pool) behind a router, one timeline.

Every replica is a ``kvsim.sim.Simulation`` with its own simpy environment. Replicas touch
each other only through the router, and the router acts only at arrivals, so between two
arrivals each replica runs on its own: the fleet takes the requests in arrival order and, for
each, brings every replica's clock to the last load publication before it (every
``stats_interval_s``, at k x ``stats_interval_s``: the load figures the router reads), then to
the arrival time, builds the replicas' views (``ReplicaView``), asks the router and submits
the request to the replica chosen. This is the same timeline as one shared clock, without
interleaving the replicas' steps (each replica's steps mostly skip simpy: nothing else is
due before them). The replicas' KV events go to a ``KvEventIndex`` as they are recorded,
applied ``event_delay_s`` late; with ``oracle``, with no delay (the caches as they are).

A replica's own events at exactly an arrival's time (a step ending then) come after the
arrival; with a shared clock their order would follow simpy's scheduling order.
"""

from __future__ import annotations

import functools
import math
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.scheduler_output import SchedulerOutput
from kvsim.fleet.kv_index import KvEventIndex
from kvsim.fleet.replicas import CompiledReplicaSimulation, ReplicaSimulation
from kvsim.fleet.routers import ReplicaView, Router, RouteRequest
from kvsim.sim.gc_passes import fewer_gc_passes
from kvsim.sim.records import SimResult
from kvsim.sim.simulation import Progress
from workloads import Request

PROGRESS_EVERY_ARRIVALS = 256


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
    # the chosen replica at the routing: its last step begun and its free blocks (ROUTE events)
    route_step: np.ndarray | None = None
    route_free_blocks: np.ndarray | None = None


class FleetSimulation:
    """``requests`` routed by ``router`` to ``replicas`` (fresh, each on its own clock)."""

    def __init__(
        self,
        requests: list[Request],
        replicas: Sequence[ReplicaSimulation | CompiledReplicaSimulation],
        router: Router,
        prompt_keys_of: Callable[[Request], list[int]],
        *,
        block_size: int,
        event_delay_s: float = 0.05,
        stats_interval_s: float = 0.1,
        oracle: bool = False,
        until: float | None = None,
        route_events: bool = False,
        speculative_ttl_s: float = 0.0,
    ) -> None:
        """``prompt_keys_of`` gives a request's full prompt blocks' keys as the replicas key
        them (``[]`` for a prompt nobody shares). With ``route_events`` each decision is also
        a ROUTE event in the chosen replica's own stream (``--fleet-events all``). With
        ``speculative_ttl_s`` each routed prompt's keys count as held by its replica for that
        long (llm-d's speculative indexing, ``KvEventIndex.speculate``)."""
        if stats_interval_s <= 0:
            raise ValueError(f"stats_interval_s must be > 0 seconds, got {stats_interval_s}")
        self.requests = requests
        self.replicas = list(replicas)
        self.router = router
        self.block_size = block_size
        self.stats_interval_s = stats_interval_s
        self.until = until
        self.route_events = route_events
        # the oracle reads each cache as it is: the index with no delay (a property test holds
        # it equal to the caches at every routing)
        self.index = KvEventIndex(
            len(self.replicas), 0.0 if oracle else event_delay_s, speculative_ttl_s
        )
        self._prompt_keys_of = prompt_keys_of
        n = len(self.replicas)
        self._stats = [(0, 0, 0.0)] * n  # published (waiting, running, kv_usage)
        # The router's own bookkeeping (Dynamo's slot tracker), per replica: each routed,
        # unfinished request's (uncached prompt tokens, blocks), those still prefilling, and
        # the sums the routers read.
        self._tracked: list[dict[int, tuple[int, int]]] = [{} for _ in range(n)]
        self._prefilling: list[set[int]] = [set() for _ in range(n)]
        self._prefill_tokens = [0] * n
        self._active_blocks = [0] * n
        self._route_time = array("d")
        self._route_replica = array("q")
        self._route_seq = array("q")
        self._route_prefix = array("q")
        self._route_blocks = array("q")
        self._route_step = array("q")
        self._route_free = array("q")
        self.now = 0.0  # the fleet's clock: the last arrival routed
        if len({id(sim.env) for sim in self.replicas}) != n:
            raise ValueError("every replica needs its own simpy environment")
        # replicas on the compiled core make no step outputs: their prefills are looked up
        self._polled = [
            i for i, sim in enumerate(self.replicas) if isinstance(sim, CompiledReplicaSimulation)
        ]
        for i, sim in enumerate(self.replicas):
            sim.replica = i
            sim.on_finish = self._finished
            if router.follows_prefills:  # each step's output costs a Python loop: only then
                sim._on_step_end = functools.partial(self._step_ended, i)
            if router.uses_prefix:  # only such a router reads the events
                sim.attach_index(self.index)

    # --- the router's bookkeeping -------------------------------------------------------

    def _finished(self, replica: int, seq_id: int) -> None:
        entry = self._tracked[replica].pop(seq_id, None)
        if entry is None:
            return
        self._active_blocks[replica] -= entry[1]
        if seq_id in self._prefilling[replica]:
            self._prefilled(replica, seq_id, entry[0])

    def _step_ended(self, replica: int, out: SchedulerOutput) -> None:
        """A request's prefill load leaves the router's count at its first token."""
        prefilling = self._prefilling[replica]
        for seq in out.seqs:
            if seq.seq_id in prefilling and seq.generated_token_ids:
                self._prefilled(replica, seq.seq_id, self._tracked[replica][seq.seq_id][0])

    def _prefilled(self, replica: int, seq_id: int, uncached_tokens: int) -> None:
        self._prefilling[replica].discard(seq_id)
        self._prefill_tokens[replica] -= uncached_tokens

    def _poll_prefills(self) -> None:
        """``_step_ended`` for the compiled replicas, at routing time: the requests whose
        first token has come out by now (steps that ended before it)."""
        for replica in self._polled:
            sim = self.replicas[replica]
            assert isinstance(sim, CompiledReplicaSimulation)
            tracked = self._tracked[replica]
            for seq_id in [s for s in self._prefilling[replica] if sim.has_first_token(s)]:
                self._prefilled(replica, seq_id, tracked[seq_id][0])

    # --- processes ----------------------------------------------------------------------

    def _publish(self) -> None:
        """The replicas' load as the router will read it until the next publication."""
        self._stats = [sim.load() for sim in self.replicas]
        self.router.on_stats()

    def _advance(self, t: float) -> None:
        """Run every replica up to ``t`` (simulated seconds; what is due at ``t`` stays)."""
        for sim in self.replicas:
            if t > sim.env.now:
                sim.env.run(until=t)

    def _views(self, keys: list[int]) -> list[ReplicaView]:
        index, uses_prefix = self.index, self.router.uses_prefix
        views = []
        for i, (waiting, running, usage) in enumerate(self._stats):
            views.append(
                ReplicaView(
                    waiting=waiting,
                    running=running,
                    kv_usage=usage,
                    prefix_blocks=index.prefix_blocks(i, keys) if keys else 0,
                    cached_blocks=index.num_cached_blocks(i) if uses_prefix else 0,
                    routed_active=len(self._tracked[i]),
                    active_prefill_tokens=self._prefill_tokens[i],
                    active_blocks=self._active_blocks[i],
                )
            )
        return views

    def _route(self, request: Request) -> None:
        bs = self.block_size
        self.index.advance(self.now)
        keys = self._prompt_keys_of(request) if self.router.uses_prefix else []
        num_blocks = request.prompt_tokens // bs
        if self.router.follows_prefills:
            self._poll_prefills()
        views = self._views(keys)
        chosen = self.router.choose(RouteRequest(request.prompt_tokens, num_blocks, bs), views)
        if not 0 <= chosen < len(self.replicas):
            raise RuntimeError(f"router {self.router.name} chose replica {chosen}")
        self.index.speculate(self.now, chosen, keys)
        sim = self.replicas[chosen]
        seq_id = len(sim.submitted)
        held = views[chosen].prefix_blocks
        uncached = max(0, request.prompt_tokens - held * bs)
        blocks = -(-request.prompt_tokens // bs) - held
        self._tracked[chosen][seq_id] = (uncached, blocks)
        self._prefilling[chosen].add(seq_id)
        self._prefill_tokens[chosen] += uncached
        self._active_blocks[chosen] += blocks
        self._route_time.append(self.now)
        self._route_replica.append(chosen)
        self._route_seq.append(seq_id)
        self._route_prefix.append(held)
        self._route_blocks.append(num_blocks)
        step, free = sim.routing_state()
        self._route_step.append(step)
        self._route_free.append(free)
        if self.route_events:
            sim.record_route(seq_id, step, free, held * bs)
        sim.submit(request)
        if request.cancel_after_s is not None:
            deadline = sim.env.timeout(request.cancel_after_s)
            deadline.callbacks.append(functools.partial(_cancel, sim, request.request_id))

    def _num_done(self) -> int:
        return sum(sim.num_done for sim in self.replicas)

    def _route_all(self, progress: Progress | None) -> None:
        interval, last_tick = self.stats_interval_s, -1
        for i, request in enumerate(self.requests):
            if progress is not None and i % PROGRESS_EVERY_ARRIVALS == 0:
                progress(self.now, self._num_done())
            t = request.arrival_time_s
            if self.until is not None and t >= self.until:
                break
            tick = math.floor(t / interval)  # the last publication at or before t
            if tick > last_tick:
                self._advance(tick * interval)
                self._publish()
                last_tick = tick
            self._advance(t)
            self.now = t
            self._route(request)
        for sim in self.replicas:
            sim.close_arrivals()

    def run(self, progress: Progress | None = None) -> FleetSimResult:
        """Replay the requests to the end (or ``until``); ``progress`` (simulated seconds,
        requests done) is called every ``PROGRESS_EVERY_ARRIVALS`` arrivals and at the end."""
        start = time.perf_counter()
        engines = [sim.start_engine() for sim in self.replicas]
        with fewer_gc_passes():
            self._route_all(progress)
            for sim, engine in zip(self.replicas, engines):
                if self.until is None:
                    sim.env.run(until=engine)
                elif self.until > sim.env.now:
                    stop = sim.env.timeout(self.until - sim.env.now)
                    sim.env.run(until=sim.env.any_of([engine, stop]))
            end = max(sim.env.now for sim in self.replicas)
            self._advance(end)  # every replica's run spans the fleet's
        if progress is not None:
            progress(end, self._num_done())
        wall = time.perf_counter() - start
        results = [sim.collect(wall) for sim in self.replicas]

        def column(values: array[Any], dtype: type) -> np.ndarray:
            out: np.ndarray = np.frombuffer(values, dtype=dtype).copy()
            return out

        return FleetSimResult(
            replicas=results,
            route_time_s=column(self._route_time, np.float64),
            route_replica=column(self._route_replica, np.int64),
            route_seq_id=column(self._route_seq, np.int64),
            route_prefix_blocks=column(self._route_prefix, np.int64),
            route_prompt_blocks=column(self._route_blocks, np.int64),
            wall_time_s=wall,
            route_step=column(self._route_step, np.int64),
            route_free_blocks=column(self._route_free, np.int64),
        )


def _cancel(sim: ReplicaSimulation | CompiledReplicaSimulation, request_id: str, _: Any) -> None:
    """A request's cancellation deadline passed (``cancel_after_s``): abort it there."""
    sim.abort(request_id)
