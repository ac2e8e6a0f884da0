"""The v1 pool's breakdown and prefix-cache metrics against plain replays of events.parquet.

Under v1 a prefix hit shares blocks (reference count > 1) and a freed cached block stays
cached, evictable, until the free queue hands it out again. The replays here walk the event
rows one at a time with dicts, as vLLM's BlockPool and KVCacheMetricsCollector do, and the
runs' vectorised numbers must equal them.
"""

from __future__ import annotations

import itertools
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EventKind
from kvsim.analysis.block_states import BlockStateTracker
from kvsim.config import RunConfig
from kvsim.runner import RunResult, run

BREAKDOWN = [
    "filled_slots", "reserved_slots", "internal_frag_slots", "external_frag_slots",
    "cached_slots", "free_slots",
]  # fmt: skip


def replay_pool(result: RunResult) -> list[dict[str, int]]:
    """At every STEP row: blocks held (ref > 0), cached-evictable blocks (ref 0 with a key),
    and U = Σ over sequences of min(slots held, T) less the slots of extra references."""
    events, bs = result.events, result.config.block_size
    assert events is not None
    r = result.requests
    final = (r["prompt_tokens"] + r["output_tokens"]).to_numpy()
    ref: dict[int, int] = {}
    key: set[int] = set()
    held_by: dict[int, int] = {}
    out = []
    for kind, seq, block in zip(events["kind"].astype(str), events["seq_id"], events["block_id"]):
        if kind in ("ALLOCATE", "APPEND_BLOCK"):
            assert ref.get(block, 0) == 0 and block not in key
            ref[block] = 1
            held_by[seq] = held_by.get(seq, 0) + 1
        elif kind == "PREFIX_HIT":
            assert block in key
            ref[block] = ref.get(block, 0) + 1
            held_by[seq] = held_by.get(seq, 0) + 1
        elif kind == "FREE":
            ref[block] -= 1
            held_by[seq] -= 1
        elif kind == "CACHE":
            assert ref[block] > 0
            key.add(block)
        elif kind == "EVICT":
            assert ref.get(block, 0) == 0
            key.remove(block)
        elif kind == "CACHE_RESET":
            key.clear()
        elif kind == "STEP":
            held = sum(1 for c in ref.values() if c > 0)
            refs = sum(ref.values())
            usable = sum(min(h * bs, int(final[s])) for s, h in held_by.items())
            out.append(
                {
                    "held": held,
                    "cached": sum(1 for b in key if ref.get(b, 0) == 0),
                    "usable": usable - (refs - held) * bs,
                }
            )
    return out


def check_breakdown(result: RunResult) -> None:
    steps, bs = result.steps, result.config.block_size
    total = result.summary["num_blocks"] * bs
    parts = steps[BREAKDOWN].to_numpy()
    assert (parts >= 0).all(), steps[BREAKDOWN][(parts < 0).any(axis=1)].head()
    assert (parts.sum(axis=1) == total).all()
    replay = pd.DataFrame(replay_pool(result))
    assert len(replay) == len(steps)
    assert (steps["allocated_slots"].to_numpy() == replay["held"].to_numpy() * bs).all()
    assert (steps["cached_blocks"].to_numpy() == replay["cached"].to_numpy()).all()
    assert (steps["cached_slots"].to_numpy() == replay["cached"].to_numpy() * bs).all()
    usable = (steps["filled_slots"] + steps["reserved_slots"]).to_numpy()
    assert (usable == replay["usable"].to_numpy()).all()
    shares = [
        "kv_token_state_share_mean", "kv_reservation_share_mean", "kv_internal_frag_share_mean",
        "kv_external_frag_share_mean", "kv_cached_share_mean", "kv_free_share_mean",
    ]  # fmt: skip
    assert all(result.summary[s] >= 0 for s in shares)
    assert abs(sum(result.summary[s] for s in shares) - 1.0) < 1e-9


requests_strategy = st.lists(
    st.tuples(
        st.integers(0, 40).map(lambda t: t / 4),  # arrival (s)
        st.integers(1, 60),  # prompt tokens
        st.integers(1, 12),  # output tokens
    ),
    min_size=1,
    max_size=14,
).map(lambda rs: sorted(rs))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    requests=requests_strategy,
    block_size=st.sampled_from([1, 2, 4, 8]),
    extra_blocks=st.integers(0, 30),
    chunked=st.booleans(),
)
def test_the_v1_breakdown_partitions_the_pool_at_every_step(
    toy_sim: Any, requests: list[tuple[float, int, int]], block_size: int, extra_blocks: int,
    chunked: bool,
) -> None:  # fmt: skip
    # Toy prompts are range(prompt): every prompt is a prefix of a longer one, so hits share
    # blocks; a small pool preempts and evicts.
    longest = max(p + o for _, p, o in requests)
    num_blocks = -(-longest // block_size) + extra_blocks
    result = toy_sim(
        requests, num_blocks=num_blocks, block_size=block_size, scheduler="v1",
        enable_chunked_prefill=chunked, max_num_batched_tokens=64,
    )  # fmt: skip
    check_breakdown(result)
    check_prefix_counts(result)
    check_residency(result)


def check_prefix_counts(result: RunResult) -> None:
    """Hits and queries as vLLM counts them, from the event rows one at a time."""
    events, s = result.events, result.summary
    assert events is not None
    prompt = result.requests["prompt_tokens"].to_numpy()
    hit_at: dict[tuple[int, int], int] = {}
    for (seq, step), rows in events[events["kind"] == "PREFIX_HIT"].groupby(["seq_id", "step"]):
        hit_at[(int(seq), int(step))] = int(rows["num_tokens"].iloc[0])
    tokens_at_preempt: dict[int, deque[int]] = {}
    queries = hits = pq = ph = 0
    first_hits = np.zeros(len(prompt), dtype=np.int64)
    once = events.drop_duplicates(["kind", "seq_id", "step", "time_s", "num_tokens"])
    for kind, seq, step, n in once[["kind", "seq_id", "step", "num_tokens"]].itertuples(
        index=False
    ):
        kind = str(kind)
        if kind == "PREEMPT":
            tokens_at_preempt.setdefault(seq, deque()).append(int(n))
        elif kind == "ADMIT":
            queries += int(prompt[seq])
            hits += hit_at.get((seq, step), 0)
            first_hits[seq] = hit_at.get((seq, step), 0)
        elif kind == "RESUME":
            pq += tokens_at_preempt[seq].popleft()
            ph += hit_at.get((seq, step), 0)
    assert s["prefix_cache_queries"] == queries
    assert s["prefix_cache_hits"] == hits == s["prompt_tokens_cached"]
    assert s["prefix_cache_preempted_queries"] == pq
    assert s["prefix_cache_preempted_hits"] == ph
    assert s["prompt_tokens_recomputed"] == pq - ph
    assert s["prefix_cache_hit_rate"] == (hits / queries if queries else None)
    assert (result.requests["prefix_hit_tokens"].to_numpy() == first_hits).all()
    # the engine's own PREFIX_HIT events, all admissions together
    assert hits + ph == sum(hit_at.values())
    assert s["prefix_cache_evictions"] == int((events["kind"] == "EVICT").sum())


class BlockMetrics:
    """vLLM's BlockMetricsState, on simulated time."""

    def __init__(self, t: float) -> None:
        self.birth = self.last_access = t
        self.history: deque[float] = deque(maxlen=4)

    def access(self, t: float) -> None:
        self.last_access = t
        self.history.append(t)


def check_residency(result: RunResult) -> None:
    """vLLM's KVCacheMetricsCollector with sample rate 1: a pop of a tracked block is its
    eviction (lifetime, idle, reuse gaps), and starts tracking it again; a hit is an access."""
    events = result.events
    assert events is not None
    tracked: dict[int, BlockMetrics] = {}
    lifetimes: list[float] = []
    idles: list[float] = []
    gaps: list[float] = []
    for kind, t, block in zip(events["kind"].astype(str), events["time_s"], events["block_id"]):
        if kind in ("ALLOCATE", "APPEND_BLOCK"):
            m = tracked.pop(block, None)
            if m is not None:
                lifetimes.append(t - m.birth)
                idles.append(t - m.last_access)
                h = list(m.history)
                gaps.extend(h[i] - h[i - 1] for i in range(1, len(h)))
            tracked[block] = BlockMetrics(t)
        elif kind == "PREFIX_HIT":
            tracked[block].access(t)
        elif kind == "CACHE_RESET":
            tracked.clear()
    s = result.summary
    for name, values in (
        ("kv_block_lifetime_s", lifetimes),
        ("kv_block_idle_before_evict_s", idles),
        ("kv_block_reuse_gap_s", gaps),
    ):
        got = s[name]
        if not values:
            assert got["mean"] is None
            continue
        assert np.isclose(got["mean"], np.mean(values))
        assert np.isclose(got["p90"], np.percentile(values, 90))


def test_two_requests_sharing_a_three_block_prefix(toy_sim: Any) -> None:
    # Toy prompts are range(prompt): r1's 14 tokens start with r0's 13. r0 caches its 3 full
    # blocks of 4 while prefilling; r1, arriving later, hits all 3 (12 tokens) and computes 2.
    result = toy_sim([(0.0, 13, 2), (10.0, 14, 2)], num_blocks=16, block_size=4, scheduler="v1")
    r, s = result.requests, result.summary
    assert r["prefix_hit_tokens"].tolist() == [0, 12]
    assert s["prefix_cache_queries"] == 13 + 14
    assert s["prefix_cache_hits"] == 12
    assert s["prefix_cache_hit_rate"] == 12 / 27
    assert s["prompt_tokens_computed"] == 27 - 12
    assert s["prefix_cache_preempted_queries"] == 0 and s["prompt_tokens_recomputed"] == 0
    # r1's admission step prefills its 2 uncached tokens only
    admit_step = result.events.loc[
        (result.events["kind"] == "ADMIT") & (result.events["seq_id"] == 1), "step"
    ].iloc[0]
    step = result.steps.set_index("step").loc[admit_step]
    assert step["num_prefill_tokens"] == 2 and step["num_batched_tokens"] == 2
    check_breakdown(result)


def test_a_block_shared_by_two_running_requests_counts_once(toy_sim: Any) -> None:
    # Both run at once: r1 hits r0's blocks while r0 still holds them (ref count 2).
    result = toy_sim([(0.0, 13, 8), (1.0, 13, 8)], num_blocks=16, block_size=4, scheduler="v1")
    assert result.requests["prefix_hit_tokens"].tolist() == [0, 12]
    both = result.steps[result.steps["num_running"] == 2]
    assert len(both)
    # r0: 4 blocks (13 tokens + decodes), r1 the same 3 shared + its own
    assert (both["allocated_slots"] < 2 * 4 * 4).all()
    check_breakdown(result)


def test_caching_off_counts_no_lookups(toy_sim: Any) -> None:
    result = toy_sim(
        [(0.0, 13, 2), (10.0, 14, 2)], num_blocks=16, block_size=4, scheduler="v1",
        enable_prefix_caching=False,
    )  # fmt: skip
    s = result.summary
    assert s["prefix_cache_queries"] == 0 and s["prefix_cache_hits"] == 0
    assert s["prefix_cache_hit_rate"] is None
    assert s["prefix_cache_evictions"] == 0 and s["kv_block_lifetime_s"]["mean"] is None
    assert (result.steps["cached_slots"] == 0).all()
    check_breakdown(result)


def test_classic_outputs_have_no_v1_fields(toy_sim: Any) -> None:
    result = toy_sim([(0.0, 13, 2), (10.0, 14, 2)], num_blocks=16, block_size=4)
    assert "prefix_cache_hits" not in result.summary and "prefill_time_s" not in result.summary
    assert "prefix_hit_tokens" not in result.requests
    assert "cached_slots" not in result.steps and "num_prefill_tokens" not in result.steps


@pytest.fixture(scope="module")
def pressured_v1_run(conversation_trace: Path) -> RunResult:
    """A v1 run with sharing (hash_ids), preemptions and evictions: 51 conversation turns
    in a 40-block pool."""
    path = conversation_trace
    config = RunConfig(trace=str(path), model="llama-3.1-8b", gpu="h100-sxm", num_blocks=40)
    result = run(config)
    s = result.summary
    assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0
    assert s["prefix_cache_preempted_hits"] > 0 and s["prefix_cache_evictions"] > 0
    return result


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(min_value=0, max_value=1 << 30), max_size=10))
def test_block_states_are_the_same_however_the_events_are_chunked(
    pressured_v1_run: RunResult, cuts: list[int]
) -> None:
    result = pressured_v1_run
    cols, block_ids = result_columns(result)
    n = len(cols["kind"])
    bounds = sorted({0, n, *(c % (n + 1) for c in cuts)})
    tracker = BlockStateTracker(result.summary["num_blocks"])
    block_at = np.concatenate([[0], np.cumsum(cols["num_blocks"])])
    for a, b in itertools.pairwise(bounds):
        chunk = {name: c[a:b] for name, c in cols.items()}
        tracker.consume(chunk, block_ids[block_at[a] : block_at[b]])
    steps = result.steps
    np.testing.assert_array_equal(
        tracker.cached_blocks_at_steps(len(steps)), steps["cached_blocks"]
    )
    assert tracker.num_evictions == result.summary["prefix_cache_evictions"]
    lifetime = tracker.residency_samples()[0]
    assert np.isclose(lifetime.mean(), result.summary["kv_block_lifetime_s"]["mean"])


def test_block_states_are_the_same_for_block_ids_past_16_bits(
    pressured_v1_run: RunResult,
) -> None:
    # a pool of more than 65,536 blocks takes the tracker's two-pass radix sort
    cols, block_ids = result_columns(pressured_v1_run)
    num_blocks = pressured_v1_run.summary["num_blocks"]
    small, large = BlockStateTracker(num_blocks), BlockStateTracker(num_blocks + 100_000)
    small.consume(cols, block_ids)
    large.consume(cols, block_ids + 100_000)
    np.testing.assert_array_equal(
        large.cached_blocks_at_steps(10**9), small.cached_blocks_at_steps(10**9)
    )
    assert large.num_evictions == small.num_evictions
    for a, b in zip(large.residency_samples(), small.residency_samples(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_simulation_counts_the_cached_blocks_the_events_give(
    pressured_v1_run: RunResult,
) -> None:
    # The run's cached_blocks are the BlockManager's count at each step; replaying the
    # block events gives them too. A tracker that follows no block states (the run's) still
    # gives the same evictions and residency samples, and refuses the per-step counts.
    result = pressured_v1_run
    cols, block_ids = result_columns(result)
    full = BlockStateTracker(result.summary["num_blocks"])
    light = BlockStateTracker(result.summary["num_blocks"], track_states=False)
    full.consume(cols, block_ids)
    light.consume(cols, block_ids)
    cached = result.steps["cached_blocks"].to_numpy()
    assert cached.max() > 0
    np.testing.assert_array_equal(full.cached_blocks_at_steps(len(cached)), cached)
    assert light.num_evictions == full.num_evictions == result.summary["prefix_cache_evictions"]
    for a, b in zip(light.residency_samples(), full.residency_samples(), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="track_states"):
        light.cached_blocks_at_steps(1)
    with pytest.raises(ValueError, match="transitions"):
        BlockStateTracker(4, keep_transitions=True, track_states=False)


def test_a_block_cached_after_keyless_chunks_keeps_its_reference_count() -> None:
    # Chunks without any key take a shortcut that only carries reference counts: block 2,
    # allocated twice (a prefix hit) before any key exists, is cached-evictable only once
    # both holders freed it.
    k = EventKind
    tracker = BlockStateTracker(4)
    chunks = [
        ([k.ALLOCATE, k.STEP, k.PREFIX_HIT, k.STEP], [1, 0, 1, 0], [2, 2]),
        ([k.CACHE, k.FREE, k.STEP, k.FREE, k.STEP], [1, 1, 0, 1, 0], [2, 2, 2]),
    ]
    for kinds, counts, blocks in chunks:
        cols = {
            "kind": np.array(kinds, dtype=np.int8),
            "num_blocks": np.array(counts, dtype=np.int32),
            "time_s": np.arange(len(kinds), dtype=np.float64),
        }
        tracker.consume(cols, np.array(blocks, dtype=np.int64))
    np.testing.assert_array_equal(tracker.cached_blocks_at_steps(4), [0, 0, 0, 1])


def result_columns(result: RunResult) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """events.parquet back to recorder columns: consecutive rows equal but for block_id are
    one event (no two events in a row are alike: each carries its own free count or step)."""
    ev = result.events
    assert ev is not None
    keys = ["time_s", "step", "kind", "seq_id", "free_blocks", "num_tokens"]
    kind = np.array([EventKind[k] for k in ev["kind"].astype(str)], dtype=np.int8)
    vals = [ev[k].to_numpy() for k in keys[:2]] + [kind] + [ev[k].to_numpy() for k in keys[3:]]
    new = np.ones(len(ev), dtype=bool)
    new[1:] = np.any([v[1:] != v[:-1] for v in vals], axis=0)
    event = np.cumsum(new) - 1
    has_block = ev["block_id"].to_numpy() >= 0
    first = np.flatnonzero(new)
    cols = {k: v[first] for k, v in zip(keys, vals)}
    cols["num_blocks"] = np.bincount(event, weights=has_block).astype(np.int32)
    return cols, ev["block_id"].to_numpy()[has_block]


def test_the_pressured_v1_run_matches_the_replays(pressured_v1_run: RunResult) -> None:
    check_breakdown(pressured_v1_run)
    check_prefix_counts(pressured_v1_run)
    check_residency(pressured_v1_run)


def test_itl_counts_the_decodes_of_mixed_steps(pressured_v1_run: RunResult) -> None:
    from kvsim.analysis.load import itl_samples

    steps = pressured_v1_run.steps
    assert (steps["kind"] == "mixed").any()
    decoding = steps[steps["num_decode_tokens"] > 0]
    gaps, weights = itl_samples(steps)
    ends = (decoding["time_s"] + decoding["duration_s"]).to_numpy()
    np.testing.assert_allclose(gaps, np.diff(ends))
    assert weights.sum() == decoding["num_decode_tokens"].iloc[1:].sum()
    # a decode token per sequence computing its last token: batched = prefill + decode
    assert (
        steps["num_prefill_tokens"] + steps["num_decode_tokens"] == steps["num_batched_tokens"]
    ).all()
    assert (steps.loc[steps["kind"] == "decode", "num_prefill_tokens"] == 0).all()
    assert (steps.loc[steps["kind"] == "prefill", "num_decode_tokens"] == 0).all()
