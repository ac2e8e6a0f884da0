"""Block residency samples in bounded memory (kvsim/analysis/residency.py): the same lives
as vLLM's KVCacheMetricsCollector at sample rate 1 however the rows are batched, and a
reservoir that is exact up to its capacity and a seeded uniform sample past it."""

from __future__ import annotations

from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.analysis.residency import ACCESS_HISTORY, ResidencyCollector, SampleReservoir

NUM_BLOCKS = 2


def vllm_collector(ops: list[tuple[str, float, int]]) -> tuple[list[float], ...]:
    """vLLM 0.33's collector, every block sampled: a pop of a tracked block reports its
    life and starts a new one; a hit is an access of a tracked block; a reset drops all."""
    birth: dict[int, float] = {}
    last: dict[int, float] = {}
    history: dict[int, deque[float]] = {}
    lifetimes: list[float] = []
    idles: list[float] = []
    gaps: list[float] = []
    for op, t, b in ops:
        if op == "pop":
            if b in birth:
                lifetimes.append(t - birth[b])
                idles.append(t - last[b])
                h = list(history[b])
                gaps.extend(h[i] - h[i - 1] for i in range(1, len(h)))
            birth[b], last[b], history[b] = t, t, deque(maxlen=ACCESS_HISTORY)
        elif op == "hit":
            if b in birth:
                last[b] = t
                history[b].append(t)
        else:
            birth.clear()
    return lifetimes, idles, gaps


# (kind, time step, block, where the batch is cut after it)
op_st = st.tuples(
    st.sampled_from(["pop"] * 4 + ["hit"] * 7 + ["reset"]),
    st.sampled_from([0.0, 0.25, 1.0, 3.5]),
    st.integers(0, NUM_BLOCKS - 1),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, min_size=40, max_size=200), st.integers(1, 9))
def test_lives_are_vllms_however_the_rows_are_batched(
    raw: list[tuple[str, float, int, bool]], batch_rows: int
) -> None:
    ops, t = [], 0.0
    for kind, dt, b, _ in raw:
        t += dt  # times never go back; several rows may share one
        ops.append((kind, t, b))
    collector = ResidencyCollector(NUM_BLOCKS, batch_rows=batch_rows)
    rows: list[tuple[float, int, bool]] = []

    def add() -> None:
        if rows:
            times, blocks, pops = zip(*rows, strict=True)
            collector.add(np.array(times), np.array(blocks), np.array(pops))
            rows.clear()

    for (kind, t, b), (_, _, _, cut) in zip(ops, raw, strict=True):
        if kind == "reset":
            add()
            collector.reset()
            continue
        rows.append((t, b, kind == "pop"))
        if cut:
            add()
    add()
    for got, want in zip(collector.samples(), vllm_collector(ops), strict=True):
        np.testing.assert_array_equal(np.sort(got), np.sort(np.array(want, dtype=float)))


def test_a_long_lived_block_reports_its_last_four_accesses() -> None:
    # block 0: handed out at 0, hit at 1, 2, 4, 7 and 11, handed out again at 20
    collector = ResidencyCollector(2, batch_rows=2)
    for t, pop in [(0, True), (1, False), (2, False), (4, False), (7, False), (11, False)]:
        collector.add(np.array([float(t)]), np.array([0]), np.array([pop]))
    collector.add(np.array([20.0]), np.array([0]), np.array([True]))
    lifetime, idle, gaps = collector.samples()
    assert lifetime.tolist() == [20.0]
    assert idle.tolist() == [9.0]
    assert sorted(gaps.tolist()) == [2.0, 3.0, 4.0]  # between 2, 4, 7 and 11


def test_reservoir_keeps_everything_up_to_its_capacity() -> None:
    reservoir = SampleReservoir(capacity=10)
    reservoir.add(np.arange(4.0))
    reservoir.add(np.arange(4.0, 10.0))
    assert reservoir.values().tolist() == list(np.arange(10.0))
    got = reservoir.distribution()
    values = np.arange(10.0)
    assert got["mean"] == values.mean()
    assert got["p50"] == np.percentile(values, 50) and got["p99"] == np.percentile(values, 99)


def test_reservoir_past_its_capacity_is_a_seeded_uniform_sample() -> None:
    def fill() -> SampleReservoir:
        reservoir = SampleReservoir(capacity=20_000)
        rng = np.random.default_rng(7)
        for _ in range(50):  # 500,000 values in uneven batches
            reservoir.add(rng.uniform(0.0, 100.0, size=int(rng.integers(1, 20_000))))
        return reservoir

    a, b = fill(), fill()
    assert a.count > 20_000 * 10
    kept = a.values()
    assert len(kept) == 20_000
    np.testing.assert_array_equal(kept, b.values())  # the same run, the same sample
    got = a.distribution()
    # the mean is every value's; a uniform sample's percentiles are near the population's
    assert abs(got["mean"] - 50.0) < 0.5
    assert abs(got["p50"] - 50.0) < 2.0 and abs(got["p90"] - 90.0) < 2.0
    # the late values are kept as often as the early ones (not just the first 20,000)
    c = SampleReservoir(capacity=1_000)
    c.add(np.zeros(50_000))
    c.add(np.ones(50_000))
    assert 400 < int(c.values().sum()) < 600
