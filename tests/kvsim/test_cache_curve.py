"""Offline prefix-cache curves (kvsim.analysis.cache_curve) against plain replays.

The fast one-pass results are checked against plain replays (cache_curve_replays.py): an
explicit LRU list per capacity and an explicit Belady cache per capacity on random small
traces (equal exactly), an exhaustive search over every policy on tiny ones (optimal is the
true upper bound), and a straightforward replay of the Mooncake conversation trace keyed by
its hash ids (here). The prefix-identity rule: test_cache_curve_prefixes.py; the command and
its picture: test_cli_cache_curve.py.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
from cache_curve_replays import (
    INF,
    best_possible,
    replay_belady,
    replay_lru,
    small_traces,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.analysis.cache_curve import (
    cache_curve,
    lru_stack_distances,
    optimal_hit_blocks,
)
from kvsim.analysis.prefix_blocks import touch_segments
from workloads import Trace, load_trace, shipped_trace_path

CAPACITIES = [*range(0, 26), INF]


@settings(max_examples=300, deadline=None)
@given(trace=small_traces(), block_size=st.sampled_from([1, 2, 3, 4, 5, 8, 16]))
def test_lru_and_optimal_equal_plain_replays_at_every_capacity(
    trace: Trace, block_size: int
) -> None:
    segments = touch_segments(trace, block_size)
    distances = lru_stack_distances(segments)
    optimal = optimal_hit_blocks(segments, CAPACITIES)
    for capacity, optimal_hits in zip(CAPACITIES, optimal.tolist()):
        lru_hits = replay_lru(trace, block_size, capacity)
        assert distances.hit_blocks_per_request(capacity).tolist() == lru_hits, capacity
        assert optimal_hits == replay_belady(trace, block_size, capacity), capacity
        assert optimal_hits >= sum(lru_hits)
    assert optimal[-1] == distances.hit_blocks(INF).sum()  # unlimited: every block seen before


def check_optimal_is_the_most_any_policy_can_hit(
    trace: Trace, block_size: int, capacity: int
) -> None:
    optimal = optimal_hit_blocks(touch_segments(trace, block_size), [capacity])
    assert optimal[0] == best_possible(trace, block_size, capacity)


OPTIMAL_CASES = given(
    trace=small_traces(max_requests=6, max_hash_blocks=3),
    block_size=st.sampled_from([1, 2, 3]),
    capacity=st.integers(0, 3),
)


# best_possible searches every policy (exponential in the trace): 20 examples by default
# (60 took 10 s of the default run), 200 under -m slow
@settings(max_examples=20, deadline=None)
@OPTIMAL_CASES
def test_optimal_is_the_most_any_policy_can_hit(
    trace: Trace, block_size: int, capacity: int
) -> None:
    check_optimal_is_the_most_any_policy_can_hit(trace, block_size, capacity)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@OPTIMAL_CASES
def test_optimal_is_the_most_any_policy_can_hit_at_full_strength(
    trace: Trace, block_size: int, capacity: int
) -> None:
    check_optimal_is_the_most_any_policy_can_hit(trace, block_size, capacity)


@settings(max_examples=100, deadline=None)
@given(trace=small_traces(), block_size=st.sampled_from([1, 2, 4, 16]))
def test_curve_rows_are_token_weighted_hit_rates(trace: Trace, block_size: int) -> None:
    capacities = [1.0, 2.5 * block_size, 10.0 * block_size, INF]
    curve = cache_curve(trace, block_size, capacities)
    query = sum(r.prompt_tokens for r in trace.requests)
    assert [(r["policy"], r["capacity_tokens"]) for r in curve.rows] == [
        (policy, c) for policy in ("lru", "optimal") for c in capacities
    ]
    for row in curve.rows:
        blocks = row["capacity_blocks"]
        assert blocks == (INF if row["capacity_tokens"] == INF else
                          math.floor(row["capacity_tokens"] / block_size))  # fmt: skip
        if row["policy"] == "lru":
            assert row["hit_tokens"] == block_size * sum(replay_lru(trace, block_size, blocks))
        assert row["query_tokens"] == query
        assert row["hit_rate"] == row["hit_tokens"] / query
        assert row["hit_tokens"] <= sum(r.prompt_tokens - 1 for r in trace.requests)


# ---------------------------------------------------------------- Mooncake conversation trace


def replay_mooncake_lru(trace: Trace, capacity_blocks: float) -> int:
    """Hit tokens of a plain LRU over 512-token blocks keyed by the hash ids themselves
    (Mooncake's ids already name the whole prefix): full blocks only, never the last token."""
    cache: OrderedDict[int, None] = OrderedDict()
    hit_tokens = 0
    for request in trace.requests:
        ids = request.hash_ids or ()
        full = ids[: request.prompt_tokens // 512]
        cap = (request.prompt_tokens - 1) // 512
        hits = 0
        while hits < min(cap, len(full)) and full[hits] in cache:
            hits += 1
        hit_tokens += 512 * hits
        for block in reversed(full):
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hit_tokens


def check_mooncake(name: str, capacities: list[float]) -> None:
    trace = load_trace(shipped_trace_path(name))
    curve = cache_curve(trace, 512, capacities)
    query = sum(r.prompt_tokens for r in trace.requests)
    lru = [r for r in curve.rows if r["policy"] == "lru"]
    optimal = [r for r in curve.rows if r["policy"] == "optimal"]
    for row in lru:
        replayed = replay_mooncake_lru(trace, row["capacity_blocks"]) / query
        assert abs(row["hit_rate"] - replayed) <= 0.005, row  # issue 13: within 0.5 point
    for lru_row, optimal_row in zip(lru, optimal):
        assert optimal_row["hit_tokens"] >= lru_row["hit_tokens"]
    assert optimal[-1]["hit_tokens"] == lru[-1]["hit_tokens"]  # unlimited
    assert lru[-1]["hit_rate"] > 0.2  # a conversation trace: much of the prompt is reused


def test_mooncake_sample_matches_a_straightforward_replay() -> None:
    check_mooncake("mooncake_fast25_conversation_first_1000", [1e5, 1e6, 3e6, 2e7, INF])


def test_mooncake_sample_at_small_blocks_matches_the_plain_lru_list() -> None:
    # 128-token blocks: four per hash block, and deep levels many requests share (the
    # vectorised prefix interning), against the tuple-keyed LRU list.
    trace = load_trace(shipped_trace_path("mooncake_fast25_conversation_first_1000"))
    distances = lru_stack_distances(touch_segments(trace, 128))
    for capacity in (2_000, 20_000):
        assert distances.hit_blocks_per_request(capacity).tolist() == replay_lru(
            trace, 128, capacity
        )


@pytest.mark.slow
def test_whole_mooncake_conversation_matches_a_straightforward_replay() -> None:
    check_mooncake("mooncake_fast25_conversation", [1e5, 1e6, 3e6, 1e7, 3e7, INF])
