"""The KV-event index a router keeps: equal to each replica's cache when the delay is 0,
late by exactly the delay otherwise."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvsim.config import RunConfig, SchedulingLimits
from kvsim.fleet.kv_index import KvEventIndex
from kvsim.fleet.routers import ReplicaView, RoundRobin, RouteRequest
from kvsim.fleet.run import _Replica, prompt_keys
from kvsim.fleet.simulation import FleetSimulation
from kvsim.sim.engine_config import key_source_of, prefix_source_of
from kvsim.sim.executor import LinearStepExecutor
from workloads import Request, Trace

LIMITS = SchedulingLimits(max_num_seqs=8, max_num_batched_tokens=64, watermark=0.0)


def cache_keys(replica: _Replica) -> set[int]:
    """The keys the replica's BlockManager holds (every block with a key)."""
    bm = replica.sim.block_manager
    has_key = np.asarray(bm._has_key, dtype=bool)  # type: ignore[attr-defined]
    return set(np.asarray(bm._block_key)[has_key].tolist())  # type: ignore[attr-defined]


class CheckingRouter(RoundRobin):
    """Round-robin that, at every routing, compares the index with the caches."""

    name = "checking"
    uses_prefix = True

    def __init__(self, fleet_ref: list[Any], replicas: list[_Replica]) -> None:
        super().__init__(len(replicas), np.random.default_rng(0))
        self.fleet_ref, self.replicas, self.checks = fleet_ref, replicas, 0

    def choose(self, request: RouteRequest, views: Any) -> int:
        index = self.fleet_ref[0].index
        for i, replica in enumerate(self.replicas):
            assert index.keys(i) == cache_keys(replica)
        self.checks += 1
        return super().choose(request, views)


def fleet_of(
    requests: list[Request],
    num_replicas: int,
    delay_s: float,
    num_blocks: int,
    router: Any = None,
    *,
    fast: bool = True,
    compiled: bool = False,
) -> tuple[FleetSimulation, list[_Replica]]:
    config = RunConfig(
        trace="t",
        block_size=4,
        replicas=num_replicas,
        step_time="linear:0.01:0.001",
        fast_decode=fast,
    )
    trace = Trace(name="t", hash_block_size=4, requests=requests)
    prefix_of = prefix_source_of(trace, 4)
    key_source = key_source_of(trace, caching=True)
    executor = LinearStepExecutor(0.01, 0.001)
    replicas = [
        _Replica(
            config, LIMITS, num_blocks, None, executor, prefix_of, key_source, compiled=compiled
        )
        for _ in range(num_replicas)
    ]
    assert all(r.compiled == compiled for r in replicas)
    holder: list[Any] = []
    if router is None:
        router = CheckingRouter(holder, replicas)
    fleet = FleetSimulation(
        requests, [r.sim for r in replicas], router, prompt_keys(prefix_of, 4),
        block_size=4, event_delay_s=delay_s,
    )  # fmt: skip
    holder.append(fleet)
    return fleet, replicas


requests_strategy = st.lists(
    st.tuples(
        st.floats(0, 0.5),  # gap to the previous arrival (s)
        st.integers(0, 3),  # which of 4 shared system prompts
        st.integers(1, 6),  # own hash ids after it
        st.integers(1, 12),  # output tokens
    ),
    min_size=1,
    max_size=25,
)


def build_requests(spec: list[tuple[float, int, int, int]]) -> list[Request]:
    out, t, next_id = [], 0.0, 1000
    for i, (gap, system, own, output) in enumerate(spec):
        t += gap
        ids = [system * 10, system * 10 + 1, *range(next_id, next_id + own)]
        next_id += own
        out.append(
            Request(
                request_id=f"r{i}",
                arrival_time_s=t,
                prompt_tokens=4 * len(ids),
                output_tokens=output,
                hash_ids=ids,
            )
        )
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=requests_strategy,
    num_blocks=st.integers(12, 60),
    num_replicas=st.integers(1, 3),
    fast=st.booleans(),
)
def test_index_equals_every_replica_cache_when_events_are_not_late(
    spec: list[tuple[float, int, int, int]], num_blocks: int, num_replicas: int, fast: bool
) -> None:
    fleet, replicas = fleet_of(build_requests(spec), num_replicas, 0.0, num_blocks, fast=fast)
    fleet.run()
    assert fleet.router.checks == len(spec)  # type: ignore[attr-defined]
    fleet.index.advance(float("inf"))
    for i, replica in enumerate(replicas):
        assert fleet.index.keys(i) == cache_keys(replica)


def test_index_follows_evictions_and_shared_blocks() -> None:
    """A pool of 20 blocks under 25 requests of 7 hash blocks: blocks are evicted and
    re-cached all the time; the index stays equal to the caches at every routing."""
    spec = [(0.05, i % 4, 5, 8) for i in range(25)]
    fleet, replicas = fleet_of(build_requests(spec), 2, 0.0, 20)
    fleet.run()
    assert all(r.sim.block_manager.num_evictions > 10 for r in replicas)
    assert fleet.router.checks == 25  # type: ignore[attr-defined]
    fleet.index.advance(float("inf"))
    for i, replica in enumerate(replicas):
        assert fleet.index.keys(i) == cache_keys(replica)


def test_a_late_event_is_invisible_until_its_delay_has_passed() -> None:
    index = KvEventIndex(2, delay_s=5.0)
    index.publish(1.0, 0, 0, [11, 12, 13])  # BlockStored at t=1
    index.advance(5.9)
    assert index.prefix_blocks(0, [11, 12, 13]) == 0
    index.advance(6.0)
    assert index.prefix_blocks(0, [11, 12, 13]) == 3
    assert index.prefix_blocks(1, [11, 12, 13]) == 0
    index.publish(2.0, 0, 1, [12])  # BlockRemoved at t=2: the run breaks at 12
    index.advance(6.5)
    assert index.prefix_blocks(0, [11, 12, 13]) == 3  # still stale
    index.advance(7.0)
    assert index.prefix_blocks(0, [11, 12, 13]) == 1
    index.publish(3.0, 0, 2, ())  # AllBlocksCleared
    index.advance(8.0)
    assert index.num_cached_blocks(0) == 0


def test_a_key_held_by_two_blocks_stays_until_both_are_removed() -> None:
    index = KvEventIndex(1, delay_s=0.0)
    index.publish(0.0, 0, 0, [7])
    index.publish(0.0, 0, 0, [7])
    index.publish(0.0, 0, 1, [7])
    index.advance(0.0)
    assert index.prefix_blocks(0, [7]) == 1
    index.publish(0.0, 0, 1, [7])
    index.advance(0.0)
    assert index.prefix_blocks(0, [7]) == 0


def test_a_repeated_prompt_follows_its_cache_under_the_prefix_router() -> None:
    """Four groups of requests sharing a system prompt, 4 replicas: round-robin spreads
    each group over every replica, the prefix scorer sends repeats where the prefix is."""
    from kvsim.fleet.routers import PrefixScorer

    spec = [(1.0, i % 4, 1, 2) for i in range(40)]  # spaced: no queue, caches warm
    rates = {}
    for name, router_class in (("round-robin", RoundRobin), ("prefix", PrefixScorer)):
        requests = build_requests(spec)
        router = router_class(4, np.random.default_rng(0))
        fleet, _ = fleet_of(requests, 4, 0.05, 200, router=router)
        result = fleet.run()
        rates[name] = result.route_prefix_blocks.sum() / result.route_prompt_blocks.sum()
        if name == "prefix":
            # after each group's first request, every repeat lands where its prefix is
            by_group: dict[int, set[int]] = {}
            for i, replica in enumerate(result.route_replica.tolist()):
                by_group.setdefault(i % 4, set()).add(replica)
            assert all(len(replicas) == 1 for replicas in by_group.values())
    assert rates["prefix"] > 1.5 * rates["round-robin"]


def test_views_are_what_the_router_sees() -> None:
    requests = build_requests([(0.0, 0, 2, 3), (5.0, 0, 2, 3)])
    seen: list[list[ReplicaView]] = []

    class Spy(RoundRobin):
        uses_prefix = True

        def choose(self, request: RouteRequest, views: Any) -> int:
            seen.append(list(views))
            return 0

    fleet, _ = fleet_of(requests, 2, 0.0, 64, router=Spy(2, np.random.default_rng(0)))
    fleet.run()
    # the second request's system prompt (2 blocks of 4 tokens) is cached on replica 0 only
    assert [v.prefix_blocks for v in seen[1]] == [2, 0]
    assert seen[1][0].cached_blocks > 0 and seen[1][1].cached_blocks == 0
    assert seen[0][0].routed_active == 0 and seen[1][0].routed_active == 0  # first finished


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.lists(
        st.tuples(st.floats(0, 0.3), st.integers(0, 3), st.integers(1, 6), st.integers(1, 40)),
        min_size=1,
        max_size=40,
    ),
    num_blocks=st.integers(12, 80),
    router_name=st.sampled_from(["prefix", "kv-router", "cache-aware"]),
    delay_s=st.sampled_from([0.0, 0.011, 0.05]),
)
# short requests finishing in steps before a pending one: the router must hear of them
@example(
    spec=[(0.0, 0, 1, 1)] * 6 + [(0.0, 0, 1, 4)] * 2 + [(0.0625, 0, 2, 1), (0.0, 0, 1, 1)],
    num_blocks=12,
    router_name="kv-router",
    delay_s=0.0,
)
def test_every_replica_kind_routes_as_the_readable_scheduler(
    spec: list[tuple[float, int, int, int]], num_blocks: int, router_name: str, delay_s: float
) -> None:
    """Replicas run the placeholder-token v1 scheduler or the compiled core: their KV events
    must reach the router when the readable scheduler's would, so every decision and every
    step is the same."""
    from kvsim.fleet.routers import make_router

    kinds = [(False, False), (True, False), (True, True)]
    outcomes = []
    for fast, compiled in kinds:
        fleet, _ = fleet_of(
            build_requests(spec), 3, delay_s, num_blocks, make_router(router_name, 3, 1),
            fast=fast, compiled=compiled,
        )  # fmt: skip
        result = fleet.run()
        outcomes.append(
            (
                result.route_replica.tolist(),
                result.route_prefix_blocks.tolist(),
                [r.step_duration_s.tolist() for r in result.replicas],
            )
        )
    assert all(outcome == outcomes[0] for outcome in outcomes[1:])


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from([0, 0, 1, 1, 2]), st.lists(st.integers(0, 12), max_size=6)),
        max_size=60,
    )
)
def test_index_counts_match_a_multiset(ops: list[tuple[int, list[int]]]) -> None:
    """Stored / removed / cleared in any order, keys repeated within an event or not
    (removals only of held blocks, as a cache emits them): the keys held, the blocks held
    and the prefix runs are a multiset's."""
    index = KvEventIndex(1, delay_s=0.0)
    model: dict[int, int] = {}
    for op, keys in ops:
        if op == 1:
            held_keys = [k for k in keys if model.get(k, 0) > 0]
            keys = []
            for k in held_keys:  # a key may leave twice in one event if two blocks held it
                if model[k] > 0:
                    model[k] -= 1
                    keys.append(k)
        elif op == 0:
            for k in keys:
                model[k] = model.get(k, 0) + 1
        else:
            model.clear()
            keys = []
        index.publish(0.0, 0, op, keys)
        index.advance(0.0)
        held = {k for k, n in model.items() if n > 0}
        assert index.keys(0) == held
        assert index.num_cached_blocks(0) == sum(model.values())
        probe = list(range(13))
        expected = next((i for i, k in enumerate(probe) if k not in held), len(probe))
        assert index.prefix_blocks(0, probe) == expected
