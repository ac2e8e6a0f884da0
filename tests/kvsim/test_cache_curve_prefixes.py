"""The prefix-identity rule of the offline prefix-cache curves (kvsim.analysis.prefix_blocks,
kvsim.analysis.cache_curve): a block is shared exactly when its whole hash prefix is; hits stop
short of the last prompt token and count full blocks only; requests without hash ids share
nothing; the default capacity grid."""

from __future__ import annotations

import numpy as np
import pytest
from cache_curve_replays import (
    INF,
    small_traces,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.analysis.cache_curve import (
    cache_curve,
    default_capacities,
    lru_stack_distances,
)
from kvsim.analysis.prefix_blocks import PrefixBlocksError, prefix_ids, touch_segments
from workloads import Request, Trace, load_trace, shipped_trace_path


@settings(max_examples=100, deadline=None)
@given(trace=small_traces(max_requests=30), numpy_level_min=st.sampled_from([1, 2, 5, 10**9]))
def test_prefix_names_are_equal_exactly_when_hash_prefixes_are(
    trace: Trace, numpy_level_min: int
) -> None:
    # Every depth by numpy (1), every depth by the dict (10**9), or a mix.
    requests = [r for r in trace.requests if r.hash_ids]
    ids = np.array([h for r in requests for h in r.hash_ids or ()], np.int64)
    lengths = np.array([len(r.hash_ids or ()) for r in requests], np.int64)
    names = prefix_ids(ids, lengths, numpy_level_min=numpy_level_min).tolist()
    prefixes = [
        tuple(r.hash_ids or ())[: d + 1] for r in requests for d in range(len(r.hash_ids or ()))
    ]
    name_of: dict[tuple[int, ...], int] = {}
    for prefix, name in zip(prefixes, names):
        assert name_of.setdefault(prefix, name) == name
    assert len(set(name_of.values())) == len(name_of)


def two_requests(first: list[int], second: list[int], prompt: int = 1024) -> Trace:
    return Trace(
        name="pair",
        hash_block_size=512,
        requests=[
            Request(request_id="a", arrival_time_s=0.0, prompt_tokens=prompt, output_tokens=1,
                    hash_ids=first),
            Request(request_id="b", arrival_time_s=1.0, prompt_tokens=prompt, output_tokens=1,
                    hash_ids=second),
        ],
    )  # fmt: skip


def second_request_hits(trace: Trace, block_size: int) -> int:
    return int(
        lru_stack_distances(touch_segments(trace, block_size)).hit_blocks_per_request(INF)[1]
    )


def test_small_blocks_inside_a_hash_block_share_exactly_its_hash_prefix() -> None:
    # 16-token blocks: 32 per 512-token hash block; the second hash block differs, so only the
    # first 32 blocks are shared.
    assert second_request_hits(two_requests([7, 8], [7, 9]), 16) == 32
    assert second_request_hits(two_requests([7, 8], [6, 8]), 16) == 0  # a prefix, not a set
    # The same prefix throughout: every block but the one holding the last prompt token.
    assert second_request_hits(two_requests([7, 8], [7, 8]), 16) == 63


def test_a_block_spanning_hash_blocks_needs_them_all() -> None:
    # 1,024-token blocks over 512-token hash blocks: block j is hash blocks 2j and 2j+1.
    ids = [7, 8, 9, 10, 11]
    assert second_request_hits(two_requests(ids, ids, prompt=2049), 1024) == 2
    assert second_request_hits(two_requests(ids, [7, 8, 9, 12, 11], prompt=2049), 1024) == 1
    assert second_request_hits(two_requests(ids, [7, 6, 9, 10, 11], prompt=2049), 1024) == 0


def test_hits_stop_short_of_the_last_prompt_token_and_count_full_blocks_only() -> None:
    trace = two_requests([1, 2], [1, 2], prompt=1000)  # 1.95 hash blocks
    assert second_request_hits(trace, 512) == 1  # the partial second block is never shared
    assert second_request_hits(trace, 100) == 9  # 9 full blocks of 100 within 999 tokens
    exact = two_requests([1, 2], [1, 2], prompt=1024)
    assert second_request_hits(exact, 512) == 1  # 2 full blocks, but not the last token's


def test_requests_without_hash_ids_count_as_queries_and_share_nothing() -> None:
    with_none = Trace(
        name="mixed",
        hash_block_size=4,
        requests=[
            Request(request_id="a", arrival_time_s=0.0, prompt_tokens=9, output_tokens=1,
                    hash_ids=[1, 2, 3]),
            Request(request_id="b", arrival_time_s=1.0, prompt_tokens=9, output_tokens=1),
            Request(request_id="c", arrival_time_s=2.0, prompt_tokens=9, output_tokens=1,
                    hash_ids=[1, 2, 3]),
        ],
    )  # fmt: skip
    curve = cache_curve(with_none, 4, [INF])
    assert curve.rows[0]["query_tokens"] == 27
    assert curve.rows[0]["hit_tokens"] == 8


def test_a_trace_without_hash_ids_is_refused() -> None:
    trace = load_trace(shipped_trace_path("azure_llm_2023_conv_first_2min"))
    with pytest.raises(PrefixBlocksError, match="has no hash_ids"):
        cache_curve(trace)


def test_default_capacities_are_a_log_grid_up_to_the_working_set() -> None:
    trace = load_trace(shipped_trace_path("mooncake_fast25_conversation_first_1000"))
    segments = touch_segments(trace)
    grid = default_capacities(segments)
    working_set = segments.num_distinct_blocks * 512
    assert grid[-2:] == [working_set, INF]
    assert grid == sorted(grid) and len(set(grid)) == len(grid)
    assert grid[0] <= working_set / 1e4 * 1.5 and len(grid) > 20
