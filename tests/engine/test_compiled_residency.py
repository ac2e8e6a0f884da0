"""The compiled residency tracker (engine/compiled/csrc/residency.hpp) gives the Python
collector's samples (kvsim/analysis/residency.py, fed by BlockStateTracker), id for id: the
same kept sample, count, exact sum and distribution, and the same eviction count.

Both read the same event stream, cut into chunks at different places: random streams with
pops, hits, frees, evictions and cache resets, and the events of real compiled v1 runs
(V1Core with ``track_residency``); small reservoirs make both sample."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from engine import EventKind
from engine.compiled import load
from kvsim.analysis.block_states import BlockStateTracker
from kvsim.analysis.residency import _SEED as SEED
from kvsim.analysis.residency import RESERVOIR_SIZE, ResidencyCollector

core = load()
pytestmark = pytest.mark.skipif(core is None, reason="the compiled core is not built")
METRICS = ("lifetime", "idle", "reuse_gap")

BLOCK_KINDS = [
    EventKind.ALLOCATE,
    EventKind.APPEND_BLOCK,
    EventKind.PREFIX_HIT,
    EventKind.FREE,
    EventKind.CACHE,
    EventKind.EVICT,
]
PLAIN_KINDS = [EventKind.STEP, EventKind.ARRIVE, EventKind.FINISH]


def random_stream(seed: int, num_events: int, num_blocks: int) -> dict[str, np.ndarray]:
    """Events of random kinds on few blocks (so lives end often), a cache reset now and then,
    times that repeat (several events per step)."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(np.array(BLOCK_KINDS + PLAIN_KINDS, dtype=np.int8), num_events)
    kinds[rng.random(num_events) < 0.005] = EventKind.CACHE_RESET
    is_block = np.isin(kinds, BLOCK_KINDS)
    counts = np.where(is_block, rng.integers(1, 5, num_events), 0).astype(np.int32)
    time_s = np.cumsum(rng.choice([0.0, 0.0, 0.25, 1.5, 1e-3], num_events))
    block_ids = rng.integers(0, num_blocks, int(counts.sum())).astype(np.int32)
    return {"kind": kinds, "num_blocks": counts, "time_s": time_s, "block_ids": block_ids}


def cuts(rng: np.random.Generator, n: int) -> list[int]:
    inner = sorted(set(rng.integers(0, n, int(rng.integers(0, 6))).tolist()))
    return [0, *inner, n]


def python_samples(
    stream: dict[str, np.ndarray], num_blocks: int, seed: int, capacity: int
) -> dict[str, Any]:
    """BlockStateTracker's evictions and reservoirs, the stream fed in random chunks and
    folded in small batches (lives carried from batch to batch)."""
    tracker = BlockStateTracker(num_blocks, track_states=False)
    tracker.residency = ResidencyCollector(
        num_blocks, capacity=capacity, batch_rows=int(seed % 7) * 5 + 3
    )
    offsets = np.concatenate([[0], np.cumsum(stream["num_blocks"])])
    bounds = cuts(np.random.default_rng(seed), len(stream["kind"]))
    for lo, hi in itertools.pairwise(bounds):
        cols = {k: stream[k][lo:hi] for k in ("kind", "num_blocks", "time_s")}
        tracker.consume(cols, stream["block_ids"][offsets[lo] : offsets[hi]])
    tracker.residency.samples()
    return {"num_evictions": tracker.num_evictions, **reservoirs(tracker.residency)}


def reservoirs(res: ResidencyCollector) -> dict[str, Any]:
    out = {}
    for name in METRICS:
        reservoir = getattr(res, name)
        values = reservoir.values()
        out[name] = {
            "values": values,
            "ids": reservoir._ids[0],
            "count": reservoir.count,
            "sum_by_exponent": {k: v for k, v in reservoir._sum._by_exponent.items() if v},
            "distribution": reservoir.distribution(),
        }
    return out


def compiled_samples(
    stream: dict[str, np.ndarray], num_blocks: int, seed: int, capacity: int
) -> dict[str, Any]:
    """The compiled tracker fed the stream in other chunks, its state restored into a Python
    collector (what a compiled run's summary reads)."""
    tracker = core.ResidencyTracker(num_blocks, capacity, SEED)
    offsets = np.concatenate([[0], np.cumsum(stream["num_blocks"])])
    bounds = cuts(np.random.default_rng(seed + 1), len(stream["kind"]))
    for lo, hi in itertools.pairwise(bounds):
        tracker.consume(
            stream["kind"][lo:hi],
            stream["num_blocks"][lo:hi],
            stream["time_s"][lo:hi],
            stream["block_ids"][offsets[lo] : offsets[hi]],
        )
    return restored(tracker.state(), num_blocks, capacity)


def restored(state: dict[str, Any], num_blocks: int, capacity: int) -> dict[str, Any]:
    tracker = BlockStateTracker(num_blocks, track_states=False)
    tracker.residency = ResidencyCollector(num_blocks, capacity=capacity)
    tracker.restore_compiled(state)
    return {"num_evictions": tracker.num_evictions, **reservoirs(tracker.residency)}


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["num_evictions"] == want["num_evictions"], "evictions"
    for name in METRICS:
        g, w = got[name], want[name]
        assert g["count"] == w["count"], name
        np.testing.assert_array_equal(g["ids"], w["ids"], err_msg=name)
        np.testing.assert_array_equal(g["values"], w["values"], err_msg=name)
        assert g["sum_by_exponent"] == w["sum_by_exponent"], name
        assert g["distribution"] == w["distribution"], name


@pytest.mark.parametrize("seed", range(12))
def test_random_streams_give_the_python_samples(seed: int) -> None:
    """Small reservoirs (capacity 40 or 300) sample; the default one keeps every value."""
    num_blocks = [1, 3, 8, 40][seed % 4]
    capacity = [40, 300, RESERVOIR_SIZE][seed % 3]
    stream = random_stream(seed, 3000, num_blocks)
    want = python_samples(stream, num_blocks, seed, capacity)
    assert want["lifetime"]["count"] > 50, "the stream must end lives"
    if num_blocks > 1:
        assert want["reuse_gap"]["count"] > 0, "and report reuse gaps"
    if capacity == 40:
        assert want["lifetime"]["count"] > capacity, "and sample"
    assert_same(compiled_samples(stream, num_blocks, seed, capacity), want)


def test_a_reset_ends_no_life_and_keeps_the_row_numbers() -> None:
    # block 0: popped, hit twice, reset, popped (no sample), hit, popped again (a sample
    # numbered by its row among all pops and hits, the reset's rows included)
    A, H, R = EventKind.ALLOCATE, EventKind.PREFIX_HIT, EventKind.CACHE_RESET
    kinds = np.array([A, H, H, R, A, H, A], dtype=np.int8)
    counts = np.array([1, 1, 1, 0, 1, 1, 1], dtype=np.int32)
    times = np.array([0.0, 1.0, 3.0, 4.0, 5.0, 7.0, 10.0])
    tracker = core.ResidencyTracker(1, 10, SEED)
    tracker.consume(kinds, counts, times, np.zeros(6, dtype=np.int32))
    state = tracker.state()
    assert state["lifetime"]["values"].tolist() == [5.0]
    assert state["idle"]["values"].tolist() == [3.0]
    assert state["lifetime"]["ids"].tolist() == [5]
    assert state["lifetime"]["sum_by_exponent"] == {-50: 5 << 50}  # 5.0 = (5 * 2**50) * 2**-50
    assert state["reuse_gap"]["count"] == 0 and state["num_evictions"] == 0


def test_bad_columns_are_refused() -> None:
    tracker = core.ResidencyTracker(2, 10, SEED)
    one = np.array([EventKind.ALLOCATE], dtype=np.int8)
    with pytest.raises(ValueError, match="block ids must be in"):
        tracker.consume(one, [1], [0.0], [2])
    with pytest.raises(ValueError, match="sum to"):
        tracker.consume(one, [2], [0.0], [1])
    with pytest.raises(ValueError, match="capacity"):
        core.ResidencyTracker(2, 0, SEED)


@pytest.mark.parametrize(("block_size", "num_blocks"), [(16, 60), (1, 700), (4, 2000)])
def test_compiled_runs_give_the_python_samples(block_size: int, num_blocks: int) -> None:
    """A V1Core run's own tracking equals the Python collector over its taken events."""
    rng = np.random.default_rng(block_size)
    v1 = core.V1Core(num_blocks, block_size, True, max_num_seqs=16, max_num_batched_tokens=256,
                     track_residency=True, residency_capacity=64, residency_seed=SEED)  # fmt: skip
    events = []
    prompts = [list(range(int(rng.integers(1, 20)) * 8)) for _ in range(12)]
    for seq_id in range(150):
        shared = prompts[int(rng.integers(0, len(prompts)))]
        tokens = shared + [1000 + seq_id] * int(rng.integers(0, 40))
        v1.set_time(seq_id * 0.5)
        v1.add_token_request(seq_id, tokens, int(rng.integers(1, 30)), seq_id * 0.5)
        for _ in range(3):
            v1.set_time(seq_id * 0.5 + 0.1)
            v1.schedule()
            v1.update()
        cols, block_ids, _, _ = v1.take_events()
        events.append((cols, block_ids))
    stream = {
        "kind": np.concatenate([c["kind"] for c, _ in events]),
        "num_blocks": np.concatenate([c["num_blocks"] for c, _ in events]),
        "time_s": np.concatenate([c["time_s"] for c, _ in events]),
        "block_ids": np.concatenate([b for _, b in events]),
    }
    want = python_samples(stream, num_blocks, block_size, 64)
    assert want["lifetime"]["count"] > 64, "the run must end more lives than the sample keeps"
    assert_same(restored(v1.residency_state(), num_blocks, 64), want)
    # at the run's end the state is taken once, each reservoir freed as it is copied out
    assert_same(restored(v1.take_residency_state(), num_blocks, 64), want)
    assert v1.take_residency_state() is None and v1.residency_state() is None
