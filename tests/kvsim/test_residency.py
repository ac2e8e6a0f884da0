"""Block residency samples in bounded memory (kvsim/analysis/residency.py): the same lives
as vLLM's KVCacheMetricsCollector at sample rate 1 however the rows are batched, and a
reservoir that is exact up to its capacity and a seeded uniform sample past it."""

from __future__ import annotations

from collections import deque
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.analysis.residency import (
    ACCESS_HISTORY,
    ExactSum,
    ResidencyCollector,
    SampleReservoir,
    stable_order,
)

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


@settings(max_examples=60, deadline=None)
@given(st.lists(op_st, min_size=40, max_size=200), st.integers(1, 9))
def test_lives_are_vllms_however_the_rows_are_batched(
    raw: list[tuple[str, float, int, bool]], batch_rows: int
) -> None:
    lives_are_vllms(raw, batch_rows)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, min_size=40, max_size=200), st.integers(1, 9))
def test_lives_are_vllms_however_the_rows_are_batched_at_full_strength(
    raw: list[tuple[str, float, int, bool]], batch_rows: int
) -> None:
    lives_are_vllms(raw, batch_rows)


def lives_are_vllms(raw: list[tuple[str, float, int, bool]], batch_rows: int) -> None:
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
    reservoir.add(np.arange(4.0, 10.0), np.arange(4, 10))
    reservoir.add(np.arange(4.0), np.arange(4))
    assert reservoir.values().tolist() == list(np.arange(10.0))  # in the order of their ids
    got = reservoir.distribution()
    values = np.arange(10.0)
    assert got["mean"] == values.mean()
    assert got["p50"] == np.percentile(values, 50) and got["p99"] == np.percentile(values, 99)


def fill(capacity: int, values: np.ndarray, cuts: np.ndarray, order: np.ndarray) -> SampleReservoir:
    reservoir = SampleReservoir(capacity=capacity)
    for part in np.split(order, cuts):
        reservoir.add(values[part], part)
    return reservoir


def test_reservoir_past_its_capacity_is_a_uniform_sample_whatever_the_batches() -> None:
    rng = np.random.default_rng(7)
    values = rng.uniform(0.0, 100.0, size=500_000)
    a = fill(20_000, values, np.sort(rng.integers(0, 500_000, 60)), np.arange(500_000))
    # the same values in another order and other batches: the same sample, the same summary
    b = fill(20_000, values, np.sort(rng.integers(0, 500_000, 7)), rng.permutation(500_000))
    assert a.count == b.count == 500_000
    kept = a.values()
    assert len(kept) == 20_000
    np.testing.assert_array_equal(kept, b.values())
    assert a.distribution() == b.distribution()
    got = a.distribution()
    # the mean is every value's; a uniform sample's percentiles are near the population's
    assert got["mean"] == float(sum(Fraction(v) for v in values) / len(values))
    p50, p90 = got["p50"], got["p90"]
    assert p50 is not None and p90 is not None
    assert abs(p50 - 50.0) < 2.0 and abs(p90 - 90.0) < 2.0
    # the late values are kept as often as the early ones (not just the first 1,000)
    c = SampleReservoir(capacity=1_000)
    c.add(np.zeros(50_000), np.arange(50_000))
    c.add(np.ones(50_000), np.arange(50_000, 100_000))
    assert 400 < int(c.values().sum()) < 600


@given(
    st.lists(
        st.floats(-1e12, 1e12, allow_nan=False) | st.floats(-1e-9, 1e-9, allow_nan=False),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 60),
)
def test_exact_sum_is_the_exactly_rounded_mean_in_any_batches(
    values: list[float], cut: int
) -> None:
    total = ExactSum()
    total.add(np.array(values[:cut]))
    total.add(np.array(values[cut:]))
    assert total.mean(len(values)) == float(sum(map(Fraction, values)) / len(values))


def test_collector_summaries_do_not_depend_on_the_batches() -> None:
    """Past the reservoir's capacity too: the samples and means are the same whatever the
    batch size (the recorder's chunks decide the batches; a change there changes nothing)."""
    rng = np.random.default_rng(3)
    n = 30_000
    t = np.cumsum(rng.exponential(1.0, n))
    blocks = rng.integers(0, 50, n)
    pops = rng.random(n) < 0.4
    results = []
    for batch_rows in (1, 777, 4096, n):
        collector = ResidencyCollector(50, capacity=500, batch_rows=batch_rows)
        for part in np.array_split(np.arange(n), 97):
            collector.add(t[part], blocks[part], pops[part])
        results.append(collector.distributions())
        assert collector.lifetime.count > 500 and collector.reuse_gap.count > 500
    assert all(r == results[0] for r in results)


@pytest.mark.parametrize("bound", [1, 7_515, 1 << 16, (1 << 16) + 1, 1 << 32, 1 << 40])
def test_stable_order_is_numpys_stable_argsort(bound: int) -> None:
    keys = np.random.default_rng(bound % 1000).integers(0, bound, 5_000)
    np.testing.assert_array_equal(stable_order(keys, bound), np.argsort(keys, kind="stable"))
