"""Offline prefix-cache curves (kvsim.analysis.cache_curve, ``kvsim cache-curve``).

The fast one-pass results are checked against plain replays written here: an explicit LRU
list per capacity and an explicit Belady cache per capacity on random small traces (equal
exactly), an exhaustive search over every policy on tiny ones (optimal is the true upper
bound), and a straightforward replay of the Mooncake conversation trace keyed by its hash ids.
"""

from __future__ import annotations

import bisect
import csv
import functools
import itertools
import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner, Result

from kvsim.analysis.cache_curve import (
    CURVE_COLUMNS,
    cache_curve,
    default_capacities,
    lru_stack_distances,
    optimal_hit_blocks,
)
from kvsim.analysis.prefix_blocks import PrefixBlocksError, prefix_ids, touch_segments
from kvsim.cli import app
from workloads import Request, Trace, load_trace, shipped_trace_path

Key = tuple[tuple[int, ...], int]
INF = math.inf


# ---------------------------------------------------------------- plain reference replays


def block_keys(request: Request, hash_block_size: int, block_size: int) -> tuple[list[Key], int]:
    """A request's shareable blocks as (hash prefix, block index) keys, straight from the rule:
    block j is shareable if (j+1)*b <= min(prompt, len(hash_ids)*H) and is named by the hash ids
    of every hash block overlapping tokens [0, (j+1)*b). Also how many a lookup may hit."""
    if not request.hash_ids:
        return [], 0
    covered = min(request.prompt_tokens, len(request.hash_ids) * hash_block_size)
    keys = []
    for j in range(covered // block_size):
        last_token = (j + 1) * block_size - 1
        keys.append((tuple(request.hash_ids[: last_token // hash_block_size + 1]), j))
    cap = (request.prompt_tokens - 1) // block_size  # never the last prompt token
    return keys, min(len(keys), cap)


def leading_hits(keys: list[Key], lookup: int, cached: object) -> int:
    hits = 0
    while hits < lookup and keys[hits] in cached:  # type: ignore[operator]
        hits += 1
    return hits


def replay_lru(trace: Trace, block_size: int, capacity: float) -> list[int]:
    """Hit blocks per request with an explicit LRU list of ``capacity`` blocks."""
    cache: OrderedDict[Key, None] = OrderedDict()
    hits = []
    for request in trace.requests:
        keys, lookup = block_keys(request, trace.hash_block_size or 1, block_size)
        hits.append(leading_hits(keys, lookup, cache))
        for key in reversed(keys):  # block 0 ends most recent, the deepest block least
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits


def replay_belady(trace: Trace, block_size: int, capacity: float) -> int:
    """Hit blocks with an explicit Belady cache: after each request keep the ``capacity``
    blocks whose next use comes soonest. A block's next use is its next lookup, unless a request
    stores it again before that (then keeping it now gains nothing: never used until then)."""
    per_request = [block_keys(r, trace.hash_block_size or 1, block_size) for r in trace.requests]
    lookups: dict[Key, list[int]] = {}
    touches: dict[Key, list[int]] = {}
    for t, (keys, lookup) in enumerate(per_request):
        for key in keys[:lookup]:
            lookups.setdefault(key, []).append(t)
        for key in keys:
            touches.setdefault(key, []).append(t)

    def after(times: list[int], t: int) -> float:
        i = bisect.bisect_right(times, t)
        return times[i] if i < len(times) else INF

    def next_use(key: Key, t: int) -> tuple[float, int]:
        use = after(lookups.get(key, []), t)
        return (INF if after(touches[key], t) < use else use, key[1])

    cache: set[Key] = set()
    total = 0
    for t, (keys, lookup) in enumerate(per_request):
        total += leading_hits(keys, lookup, cache)
        available = cache | set(keys)
        if capacity < len(available):
            ranked = sorted(available, key=lambda k: (*next_use(k, t), repr(k)))
            available = set(ranked[: int(capacity)])
        cache = available
    return total


def best_possible(trace: Trace, block_size: int, capacity: int) -> int:
    """The most hit blocks any policy can get: every choice of what to keep, after every
    request (tiny traces only)."""
    per_request = [block_keys(r, trace.hash_block_size or 1, block_size) for r in trace.requests]

    @functools.cache
    def best(t: int, cache: frozenset[Key]) -> int:
        if t == len(per_request):
            return 0
        keys, lookup = per_request[t]
        hits = leading_hits(keys, lookup, cache)
        available = sorted(cache | set(keys))
        return hits + max(
            best(t + 1, frozenset(kept))
            for size in range(min(capacity, len(available)) + 1)
            for kept in itertools.combinations(available, size)
        )

    return best(0, frozenset())


# ---------------------------------------------------------------- random traces


@st.composite
def small_traces(draw: st.DrawFn, max_requests: int = 14, max_hash_blocks: int = 6) -> Trace:
    hash_block_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    alphabet = draw(st.integers(1, 3))  # few distinct ids: plenty of shared and diverging paths
    requests = []
    for i in range(draw(st.integers(1, max_requests))):
        if draw(st.integers(0, 9)) == 0:  # no hash_ids: nothing shareable
            prompt = draw(st.integers(1, 30))
            requests.append(Request(request_id=str(i), arrival_time_s=float(i),
                                    prompt_tokens=prompt, output_tokens=1))  # fmt: skip
            continue
        num_hash = draw(st.integers(1, max_hash_blocks))
        prompt = draw(st.integers((num_hash - 1) * hash_block_size + 1, num_hash * hash_block_size))
        hash_ids = draw(st.lists(st.integers(0, alphabet - 1), min_size=num_hash,
                                 max_size=num_hash))  # fmt: skip
        requests.append(Request(request_id=str(i), arrival_time_s=float(i), prompt_tokens=prompt,
                                output_tokens=1, hash_ids=hash_ids))  # fmt: skip
    if not any(r.hash_ids for r in requests):
        last = Request(request_id="last", arrival_time_s=float(len(requests)),
                       prompt_tokens=hash_block_size, output_tokens=1, hash_ids=[0])  # fmt: skip
        requests.append(last)
    return Trace(name="random", hash_block_size=hash_block_size, requests=requests)


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


# ---------------------------------------------------------------- the prefix-identity rule


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


# ---------------------------------------------------------------- kvsim cache-curve


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_error_line(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]


SAMPLE = "mooncake_fast25_conversation_first_1000"


def test_cli_writes_curve_csv_and_png(tmp_path: Path) -> None:
    out = tmp_path / "curve"
    result = kvsim("cache-curve", SAMPLE, "--capacity-tokens", "1e5,1e6,3e6,inf", "--out", out)
    assert result.exit_code == 0, result.output
    assert "KV pool of llama-2-7b on a100-80gb" in result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "curve.csv",
        "curve.png",
        "kvsim-manifest.json",
    ]
    with open(out / "curve.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CURVE_COLUMNS
    assert [(r["capacity_tokens"], r["capacity_blocks"], r["policy"]) for r in rows] == [
        (c, b, policy)
        for policy in ("lru", "optimal")
        for c, b in (("100000", "195"), ("1000000", "1953"), ("3000000", "5859"), ("inf", "inf"))
    ]
    expected = cache_curve(load_trace(shipped_trace_path(SAMPLE)), 512, [1e5, 1e6, 3e6, INF])
    assert [int(r["hit_tokens"]) for r in rows] == [r["hit_tokens"] for r in expected.rows]
    assert [float(r["hit_rate"]) for r in rows] == [r["hit_rate"] for r in expected.rows]
    with Image.open(out / "curve.png") as image:
        assert image.width > 400 and image.height > 200
    # A cache-curve folder is recognised and replaced with --force; the block size changes
    # the rows.
    args = ["cache-curve", SAMPLE, "--block-size", "64", "--capacity-tokens", "1e6", "--out", out]
    assert_one_error_line(kvsim(*args), "--force")
    again = kvsim(*args, "--force")
    assert again.exit_code == 0, again.output
    assert (out / "curve.csv").read_text().splitlines()[1].startswith("1000000,15625,lru,")


def test_cli_default_grid_without_out_prints_the_table_only(tmp_path: Path) -> None:
    result = kvsim("cache-curve", SAMPLE, "--gpu", "h100-sxm", "--model", "llama-3-70b",
                   "--tp", "4")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        "unlimited" in result.output and "KV pool of llama-3-70b on 4 x h100-sxm" in result.output
    )


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["azure_llm_2023_conv_first_2min"], ["has no hash_ids"]),
        ([SAMPLE, "--capacity-tokens", "1e5,lots"], ["--capacity-tokens", "'lots'"]),
        ([SAMPLE, "--capacity-tokens", "-5"], ["> 0 tokens"]),
        ([SAMPLE, "--capacity-tokens", "nan"], ["'nan' is not a number"]),
        ([SAMPLE, "--capacity-tokens", "1e400"], ["1e400 is too large", "write inf"]),
        ([SAMPLE, "--capacity-tokens", "1_000"], ["'1_000' is not a number"]),
        ([SAMPLE, "--capacity-tokens", "1e5,,1e6"], ["is not a number"]),
        ([SAMPLE, "--block-size", "0"], ["block size must be a positive integer"]),
        (["no_such_trace"], ["no such file"]),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args: list[str], fragments: list[str]) -> None:
    assert_one_error_line(kvsim("cache-curve", *args), *fragments)


def test_cli_never_replaces_a_folder_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    refusal = "not a kvsim cache-curve folder"
    assert_one_error_line(kvsim("cache-curve", SAMPLE, "--out", out, "--force"), refusal)
    # A curve.csv among other files is not enough either.
    (out / "curve.csv").write_text(",".join(CURVE_COLUMNS) + "\n")
    assert_one_error_line(kvsim("cache-curve", SAMPLE, "--out", out, "--force"), refusal)
    assert (out / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    assert_one_error_line(kvsim("cache-curve", SAMPLE, "--out", tmp_path / "file"), "not a folder")


def test_cli_echoes_odd_capacities(tmp_path: Path) -> None:
    # A fraction of a block holds nothing; a capacity past the working set holds everything.
    out = tmp_path / "odd"
    result = kvsim("cache-curve", SAMPLE, "--capacity-tokens", "1.5,1e30,inf", "--out", out)
    assert result.exit_code == 0, result.output
    rows = [line.split(",") for line in (out / "curve.csv").read_text().splitlines()[1:4]]
    assert [r[:3] for r in rows] == [["1.5", "0", "lru"], ["1e+30", "1.953125e+27", "lru"],
                                     ["inf", "inf", "lru"]]  # fmt: skip
    assert rows[0][4] == "0" and rows[1][4] == rows[2][4] != "0"


def test_plot_draws_both_policies_on_a_log_axis_with_the_pool_marked() -> None:
    from kvsim.plots import plot_cache_curve

    trace = load_trace(shipped_trace_path(SAMPLE))
    frame = cache_curve(trace, 512, [1e5, 1e6, 3e6, INF]).frame()
    fig = plot_cache_curve(frame, pool_tokens=5e5, pool_label="pool")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[:2] == ["LRU", "optimal (Belady)"]
    lru = ax.get_lines()[0]
    assert list(lru.get_xdata()) == [1e5, 1e6, 3e6]  # unlimited is a level, not a point
    assert list(lru.get_ydata()) == [100 * r for r in frame["hit_rate"][:3]]
    assert any("pool: 500,000 tokens" in label for label in labels)
    assert any("unlimited capacity" in label for label in labels)
