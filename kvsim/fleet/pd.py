"""A P/D fleet: P prefill replicas and D decode replicas on one simpy clock, the prompt's
KV moving from one to the other over each decode replica's network link (docs/fleet.md,
"Prefill/decode disaggregation").

At a request's arrival the router picks a **decode** replica among the D (its formula on the
decode replicas' views); llm-d's decider then looks at that replica's uncached prompt (prompt
- the leading blocks it holds, as its KV events said, x block size): at or above
``threshold`` tokens the request is disaggregated and the same router formula (a second
instance, its own state) picks a **prefill** replica among the P; below it the decode replica
runs the whole request. A disaggregated request runs on its prefill replica with max_tokens 1
(vLLM's P/D proxy); when it finishes there its blocks stay held (engine/pd/connector.py) and
it is submitted to its decode replica, which pulls the prompt tokens it does not hold over its
link (engine/pd/worker.py), waits for them, computes the last prompt token and decodes. The
pull's completion frees the prefill side's blocks (at that replica's next step).

Unlike the aggregated fleet (kvsim/fleet/simulation.py) the replicas share one simpy
environment: handing a request over and freeing held blocks couple them at any time, not only
at arrivals. The loads the routers read are published every ``stats_interval_s`` as there.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from engine.core.scheduler_output import SchedulerOutput
from engine.pd import PDTransfer
from kvsim.fleet.kv_index import KvEventIndex
from kvsim.fleet.pd_replica import PDReplicaSimulation
from kvsim.fleet.routers import ReplicaView, Router, RouteRequest
from kvsim.sim.gc_passes import fewer_gc_passes
from kvsim.sim.records import SimResult
from kvsim.sim.simulation import Progress
from workloads import Request

PROGRESS_EVERY_ARRIVALS = 256


class PDError(RuntimeError):
    """The P/D fleet was driven against its contract (a router's choice out of range)."""


class RouterBook:
    """A router's own bookkeeping for one pool (Dynamo's slot tracker, SGLang's counts), as
    kvsim/fleet/simulation.py keeps it: per routed, unfinished leg its uncached prompt tokens
    (until its first token) and blocks (until it ends)."""

    def __init__(self, n: int) -> None:
        self.tracked: list[dict[int, tuple[int, int]]] = [{} for _ in range(n)]
        self.prefilling: list[set[int]] = [set() for _ in range(n)]
        self.prefill_tokens = [0] * n
        self.active_blocks = [0] * n

    def add(self, replica: int, seq_id: int, uncached: int, blocks: int) -> None:
        self.tracked[replica][seq_id] = (uncached, blocks)
        self.prefilling[replica].add(seq_id)
        self.prefill_tokens[replica] += uncached
        self.active_blocks[replica] += blocks

    def prefilled(self, replica: int, seq_id: int) -> None:
        if seq_id in self.prefilling[replica]:
            self.prefilling[replica].discard(seq_id)
            self.prefill_tokens[replica] -= self.tracked[replica][seq_id][0]

    def finished(self, replica: int, seq_id: int) -> None:
        if seq_id not in self.tracked[replica]:
            return
        self.prefilled(replica, seq_id)
        self.active_blocks[replica] -= self.tracked[replica].pop(seq_id)[1]

    def step_ended(self, replica: int, out: SchedulerOutput) -> None:
        prefilling = self.prefilling[replica]
        for seq in out.seqs:
            if seq.seq_id in prefilling and seq.generated_token_ids:
                self.prefilled(replica, seq.seq_id)


@dataclass(slots=True)
class PDRoute:
    """Where one request went: its prefill leg (replica, seq id; -1 when not disaggregated)
    and its decode leg (replica, seq id; seq id -1 until handed over), replicas numbered
    fleet-wide (prefill 0..P-1, decode P..P+D-1)."""

    request: Request
    prefill_replica: int
    prefill_seq: int
    decode_replica: int
    decode_seq: int
    router_prefix_blocks: int  # what the router saw cached on the first replica it chose
    decode_prefix_blocks: int  # ... on the decode replica (the decider's input)
    index: int  # arrival order
    transfer: PDTransfer | None = None
    # each chosen replica at the routing: its last step begun and free blocks (ROUTE events)
    decode_state: tuple[int, int] = (0, 0)
    prefill_state: tuple[int, int] = (0, 0)

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replica >= 0

    @property
    def pending_key(self) -> int:
        """The decode pool's book key of a request still prefilling elsewhere (< 0)."""
        return -self.index - 1


@dataclass(slots=True)
class PDFleetResult:
    """The replicas' results (prefill first) and each request's route, in arrival order."""

    replicas: list[SimResult]
    routes: list[PDRoute]
    num_prefill: int
    wall_time_s: float


class PDFleetSimulation:
    """``requests`` through ``prefill`` and ``decode`` replicas (fresh, sharing ``env``)."""

    def __init__(
        self,
        requests: list[Request],
        prefill: Sequence[PDReplicaSimulation],
        decode: Sequence[PDReplicaSimulation],
        routers: tuple[Router, Router],
        prompt_keys_of: Callable[[Request], list[int]],
        *,
        block_size: int,
        threshold: int,
        event_delay_s: float = 0.05,
        stats_interval_s: float = 0.1,
        oracle: bool = False,
        until: float | None = None,
        speculative_ttl_s: float = 0.0,
    ) -> None:
        """``routers``: (prefill pool's, decode pool's), two instances of one formula;
        ``speculative_ttl_s`` as FleetSimulation's (each chosen replica's prediction)."""
        if stats_interval_s <= 0:
            raise ValueError(f"stats_interval_s must be > 0 seconds, got {stats_interval_s}")
        self.requests = requests
        self.prefill, self.decode = list(prefill), list(decode)
        self.replicas = self.prefill + self.decode
        self.env: simpy.Environment = self.replicas[0].env
        if any(sim.env is not self.env for sim in self.replicas):
            raise ValueError("a P/D fleet's replicas share one simpy environment")
        self.prefill_router, self.decode_router = routers
        self.block_size, self.threshold = block_size, threshold
        self.stats_interval_s, self.until = stats_interval_s, until
        self.index = KvEventIndex(
            len(self.replicas), 0.0 if oracle else event_delay_s, speculative_ttl_s
        )
        self._prompt_keys_of = prompt_keys_of
        self._stats = [(0, 0, 0.0)] * len(self.replicas)
        self._books = (RouterBook(len(self.prefill)), RouterBook(len(self.decode)))
        self.routes: list[PDRoute] = []
        self._by_prefill: dict[tuple[int, int], PDRoute] = {}
        self._by_decode: dict[tuple[int, int], PDRoute] = {}
        self._send_of_pull: dict[tuple[int, int], tuple[int, int]] = {}
        self.num_done = (
            0  # requests ended (on their decode leg, or on a prefill leg that sends nothing)
        )
        num_prefill = len(self.prefill)
        for i, sim in enumerate(self.replicas):
            sim.replica = i
            sim.on_finish = self._finished
            prefill_side = i < num_prefill
            router = self.prefill_router if prefill_side else self.decode_router
            if router.follows_prefills:
                book, local = (
                    self._books[0 if prefill_side else 1],
                    i - (0 if prefill_side else num_prefill),
                )
                sim._on_step_end = functools.partial(book.step_ended, local)
            # the decider reads the decode replicas' caches whatever the router
            if router.uses_prefix or not prefill_side:
                sim.attach_index(self.index)
            if not prefill_side:
                sim.pd_worker.on_complete = functools.partial(self._pulled, i)

    # --- routing ----------------------------------------------------------------------------

    def _views(
        self, pool: range, book: RouterBook, keys: list[int], uses_prefix: bool
    ) -> list[ReplicaView]:
        views = []
        for local, i in enumerate(pool):
            waiting, running, usage = self._stats[i]
            views.append(
                ReplicaView(
                    waiting=waiting,
                    running=running,
                    kv_usage=usage,
                    prefix_blocks=self.index.prefix_blocks(i, keys) if keys else 0,
                    cached_blocks=self.index.num_cached_blocks(i) if uses_prefix else 0,
                    routed_active=len(book.tracked[local]),
                    active_prefill_tokens=book.prefill_tokens[local],
                    active_blocks=book.active_blocks[local],
                )
            )
        return views

    def _choose(self, router: Router, request: RouteRequest, views: list[ReplicaView]) -> int:
        chosen = router.choose(request, views)
        if not 0 <= chosen < len(views):
            raise PDError(f"router {router.name} chose replica {chosen} of {len(views)}")
        return chosen

    def _route(self, request: Request) -> None:
        bs, num_prefill = self.block_size, len(self.prefill)
        self.index.advance(self.env.now)
        keys = self._prompt_keys_of(request)
        route_request = RouteRequest(request.prompt_tokens, request.prompt_tokens // bs, bs)
        pool_d = range(num_prefill, len(self.replicas))
        views_d = self._views(pool_d, self._books[1], keys, self.decode_router.uses_prefix)
        d = self._choose(self.decode_router, route_request, views_d)
        if self.decode_router.uses_prefix:
            self.index.speculate(self.env.now, num_prefill + d, keys)
        held_d = views_d[d].prefix_blocks
        uncached = max(0, request.prompt_tokens - held_d * bs)
        blocks = -(-request.prompt_tokens // bs)
        decode = self.decode[d]
        decode_state = decode.routing_state()
        if num_prefill and uncached >= self.threshold:  # llm-d's decider: disaggregate
            pool_p = range(num_prefill)
            prefill_keys = keys if self.prefill_router.uses_prefix else []
            views_p = self._views(
                pool_p, self._books[0], prefill_keys, self.prefill_router.uses_prefix
            )
            p = self._choose(self.prefill_router, route_request, views_p)
            self.index.speculate(self.env.now, p, prefill_keys)
            held_p = views_p[p].prefix_blocks
            sim = self.prefill[p]
            seq_id = len(sim.submitted)
            self._books[0].add(
                p, seq_id, max(0, request.prompt_tokens - held_p * bs), blocks - held_p
            )
            route = PDRoute(
                request, p, seq_id, num_prefill + d, -1, held_p, held_d, len(self.routes),
                decode_state=decode_state, prefill_state=sim.routing_state(),
            )  # fmt: skip
            # the decode replica's blocks for it count from now (it computes no prompt there)
            self._books[1].add(d, route.pending_key, 0, blocks - held_d)
            self._by_prefill[(p, seq_id)] = route
            self.routes.append(route)
            sim.connector.expect_remote_decode(seq_id)
            sim.submit(dataclasses.replace(request, output_tokens=1, cancel_after_s=None))
        else:
            seq_id = len(decode.submitted)
            self._books[1].add(d, seq_id, uncached, blocks - held_d)
            route = PDRoute(
                request, -1, -1, num_prefill + d, seq_id, held_d, held_d, len(self.routes),
                decode_state=decode_state,
            )  # fmt: skip
            self._by_decode[(d, seq_id)] = route
            self.routes.append(route)
            decode.submit(dataclasses.replace(request, cancel_after_s=None))
        if request.cancel_after_s is not None:
            deadline = self.env.timeout(request.cancel_after_s)
            deadline.callbacks.append(functools.partial(self._cancel, route))

    def _cancel(self, route: PDRoute, _: Any) -> None:
        """The client gives up (``cancel_after_s``): abort the leg it is on."""
        request_id = route.request.request_id
        if route.decode_seq >= 0:
            self.replicas[route.decode_replica].abort(request_id)
        else:
            self.prefill[route.prefill_replica].abort(request_id)

    # --- hand-over ----------------------------------------------------------------------------

    def _finished(self, replica: int, seq_id: int) -> None:
        num_prefill = len(self.prefill)
        if replica >= num_prefill:
            self.num_done += 1
            d = replica - num_prefill
            self._books[1].finished(d, seq_id)
            source = self._send_of_pull.get((d, seq_id))
            if source is not None and self.decode[d].connector.awaiting_pull(seq_id):
                # it ended before pulling (rejected, aborted): the prefill side frees now
                # (vLLM: the decode side's request_finished sends an empty read's notification)
                del self._send_of_pull[(d, seq_id)]
                self._release(*source)
            return
        route = self._by_prefill.pop((replica, seq_id))
        self._books[0].finished(replica, seq_id)
        d = route.decode_replica - num_prefill
        entry = self._books[1].tracked[d].pop(route.pending_key)
        self._books[1].active_blocks[d] -= entry[1]
        job = self.prefill[replica].connector.send_job(seq_id)
        if job is None:  # rejected or aborted there: the request ends
            self.num_done += 1
            return
        decode = self.decode[d]
        decode_seq = len(decode.submitted)
        route.decode_seq = decode_seq
        self._by_decode[(d, decode_seq)] = route
        self._send_of_pull[(d, decode_seq)] = (replica, job.job_id)
        self._books[1].add(d, decode_seq, 0, entry[1])
        decode.connector.expect_remote_prefill(decode_seq)
        decode.submit(dataclasses.replace(route.request, cancel_after_s=None))

    def _pulled(self, replica: int, transfer: PDTransfer) -> None:
        """A decode replica's pull completed: the prefill side may free the blocks."""
        d = replica - len(self.prefill)
        key = (d, transfer.job.seq_id)
        self._by_decode[key].transfer = transfer
        source = self._send_of_pull.pop(key, None)
        if source is not None:
            self._release(*source)

    def _release(self, prefill: int, job_id: int) -> None:
        sim = self.prefill[prefill]
        sim.pd_worker.notify(job_id)
        sim.wake()

    # --- processes ------------------------------------------------------------------------------

    def _publish(self) -> None:
        self._stats = [sim.load() for sim in self.replicas]
        self.prefill_router.on_stats()
        self.decode_router.on_stats()

    def _arrivals(self, progress: Progress | None) -> Generator[simpy.Event, Any, None]:
        env, interval, last_tick = self.env, self.stats_interval_s, -1
        for i, request in enumerate(self.requests):
            if progress is not None and i % PROGRESS_EVERY_ARRIVALS == 0:
                progress(env.now, self.num_done)
            t = request.arrival_time_s
            if self.until is not None and t >= self.until:
                break
            tick = math.floor(t / interval)  # the last publication at or before t
            if tick > last_tick:
                if tick * interval > env.now:
                    yield env.timeout(tick * interval - env.now)
                self._publish()
                last_tick = tick
            if t > env.now:
                yield env.timeout(t - env.now)
            self._route(request)

    def _watch(self, replica: int) -> Generator[simpy.Event, Any, None]:
        """Take a decode replica's pulls off its link when they complete (the prefill side
        hears of each at once, not at the decode replica's next step)."""
        env, worker = self.env, self.replicas[replica].pd_worker
        while True:
            submitted = env.event()
            worker.on_submit = functools.partial(_trigger, submitted)
            due = worker.next_completion_time()
            if due is None:
                yield submitted
            else:
                yield env.any_of([submitted, env.timeout(max(due - env.now, 0.0))])
            worker.on_submit = None
            worker.collect(env.now)

    def _lifetime(
        self, engines: list[simpy.Process], progress: Progress | None
    ) -> Generator[simpy.Event, Any, None]:
        """Close the prefill replicas' arrivals after the last arrival, the decode replicas'
        once every prefill replica is done (nothing more can be handed over)."""
        yield self.env.process(self._arrivals(progress))
        for sim in self.prefill:
            sim.close_arrivals()
        yield self.env.all_of(engines[: len(self.prefill)])
        for sim in self.decode:
            sim.close_arrivals()
        yield self.env.all_of(engines[len(self.prefill) :])

    def run(self, progress: Progress | None = None) -> PDFleetResult:
        """Replay the requests to the end (or ``until``); ``progress`` (simulated seconds,
        requests done) is called every ``PROGRESS_EVERY_ARRIVALS`` arrivals and at the end."""
        start = time.perf_counter()
        env = self.env
        engines = [sim.start_engine() for sim in self.replicas]
        for i in range(len(self.prefill), len(self.replicas)):
            env.process(self._watch(i))
        done: simpy.Event = env.process(self._lifetime(engines, progress))
        if self.until is not None:
            done = env.any_of([done, env.timeout(self.until)])
        with fewer_gc_passes():
            env.run(until=done)
        if progress is not None:
            progress(env.now, self.num_done)
        wall = time.perf_counter() - start
        return PDFleetResult(
            [sim.collect(wall) for sim in self.replicas], self.routes, len(self.prefill), wall
        )


def _trigger(event: simpy.Event) -> None:
    if not event.triggered:
        event.succeed()
