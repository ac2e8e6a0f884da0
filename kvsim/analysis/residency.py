"""vLLM's KV block residency samples (``kv_block_lifetime_seconds``,
``kv_block_idle_before_evict_seconds``, ``kv_block_reuse_gap_seconds``), in bounded memory.

vLLM's ``KVCacheMetricsCollector`` (vllm/v1/core/kv_cache_metrics.py) starts tracking a
block when the free queue hands it out (``get_new_blocks``), records each prefix hit on it
as an access (its history keeps the last ``ACCESS_HISTORY``), and when the queue hands the
block out again (whether or not it was still cached) reports that life: lifetime (seconds
since it was handed out), idle time (since its last access, or since it was handed out)
and the gaps between the accesses in its history. A cache reset drops every life
unreported. vLLM samples 1% of the blocks; kvsim reports every life.

``ResidencyCollector`` takes the pops and hits in event order, batch by batch, and carries
each block's open life from batch to batch (when it started, its last accesses), so memory
holds one batch of rows and the samples, never the whole run's rows (a million-request run
hands out tens of millions of blocks). The samples go to a ``SampleReservoir`` per metric,
which keeps every one up to ``RESERVOIR_SIZE`` and past that a uniform, seeded sample of
that many (the mean still over every sample, summed exactly). Each sample carries an id (the
index of the event row that ended its life), and both the sample and the mean depend only
on the samples and their ids, not on how the rows were batched: the recorder's chunking is
an implementation detail that must not move a summary's last digit.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from kvsim.analysis.load import distribution

# The last accesses a block remembers (vLLM's BlockMetricsState.access_history maxlen).
ACCESS_HISTORY = 4
# Samples kept per metric before the reservoir samples them (16 bytes each with its id, up
# to a quarter more between trims: ~40 MiB a metric). The full Azure conversation trace has
# 1.6 M lives, so its samples are exact; the million-request benchmark has tens of millions.
RESERVOIR_SIZE = 1 << 21
# Rows buffered before a batch is folded in: bounds the batch's temporaries (~150 bytes a
# row) while keeping numpy's per-call costs negligible: `bench_sim.py --million --requests
# 100000` peaks at 447 MiB RSS with 1 << 19, 724 MiB with 1 << 21, in the same time.
BATCH_ROWS = 1 << 19
_SEED = 0x6B76_7369_6D  # any constant: the same run gives the same sample

Distribution = dict[str, float | None]  # {mean, p50, p90, p99}, as summary.json writes them


def stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for integer keys in ``[0, bound)``: numpy's stable
    sort of 16-bit integers is a radix sort, so one or two 16-bit passes (least significant
    first) beat its timsort of int64 (400k block ids: 9 ms against 36 ms)."""
    if bound <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    if bound <= 1 << 32:
        order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
        high = (keys[order] >> 16).astype(np.uint16)
        return order[np.argsort(high, kind="stable")]
    return np.argsort(keys, kind="stable")


def _priority(ids: np.ndarray, seed: int) -> np.ndarray:
    """A fixed pseudo-random uint64 per id (splitmix64's finalizer): the sample keeps the
    smallest, so it depends on which values came, not on their order or batches."""
    with np.errstate(over="ignore"):
        z = ids.astype(np.uint64) ^ np.uint64(seed)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: np.ndarray = z ^ (z >> np.uint64(31))
        return out


class ExactSum:
    """The exact sum of finite float64 values, however they are batched: each value is split into
    integer mantissa halves per binary exponent, summed as integers, so the mean is the
    correctly rounded mean of every value (a float sum's last bits depend on its order)."""

    _HALF = 26  # mantissa bits in the low half: 2**27 per high half, sums exact in float64

    def __init__(self) -> None:
        self._by_exponent: dict[int, int] = {}

    def add(self, values: np.ndarray) -> None:
        step = 1 << 25  # bincount's float64 sums stay exact below 2**53
        for lo in range(0, len(values), step):
            mantissa, exponent = np.frexp(values[lo : lo + step])
            m = (mantissa * 2.0**53).astype(np.int64)  # exact: 53 significant bits
            base = int(exponent.min())
            e = exponent - base
            high = np.bincount(e, weights=(m >> self._HALF).astype(np.float64))
            low = np.bincount(e, weights=(m & ((1 << self._HALF) - 1)).astype(np.float64))
            for i in np.flatnonzero(high.astype(bool) | low.astype(bool)):
                k = base + int(i) - 53
                total = (int(high[i]) << self._HALF) + int(low[i])
                self._by_exponent[k] = self._by_exponent.get(k, 0) + total

    def mean(self, count: int) -> float:
        total = sum(
            (Fraction(v) * Fraction(2) ** k for k, v in self._by_exponent.items()), Fraction(0)
        )
        return float(total / count)


class SampleReservoir:
    """Values added in batches, each with an id that is unique and does not depend on the
    batching (for a block life: the event row that ended it): all of them up to
    ``capacity``, then the ``capacity`` whose seeded pseudo-random priorities are smallest
    (a uniform sample, bottom-k). Neither the sample nor the mean depends on how the values
    were batched or ordered."""

    def __init__(self, capacity: int = RESERVOIR_SIZE, seed: int = _SEED) -> None:
        self.capacity = capacity
        self.count = 0  # values added
        self._seed = seed
        self._sum = ExactSum()
        self._values: list[np.ndarray] = []
        self._ids: list[np.ndarray] = []
        self._num_kept = 0  # values in _values (kept or candidates)
        self._threshold: int | None = None  # once sampling: priorities below it may stay

    @classmethod
    def restored(cls, capacity: int, seed: int, state: dict[str, Any]) -> SampleReservoir:
        """A reservoir in the state another one reached (the compiled core's, which keeps the
        same sample): its kept ``values`` and ``ids`` (at most ``capacity``, in id order),
        ``count`` and ``sum_by_exponent`` (ExactSum's integers)."""
        out = cls(capacity, seed)
        values = np.asarray(state["values"], dtype=np.float64)
        ids = np.asarray(state["ids"], dtype=np.int64)
        if len(values) != len(ids) or len(values) > capacity:
            raise ValueError(f"{len(values)} values, {len(ids)} ids for capacity {capacity}")
        out.count = int(state["count"])
        out._sum._by_exponent = dict(state["sum_by_exponent"])
        out._values, out._ids, out._num_kept = [values], [ids], len(values)
        if out.count > capacity:  # sampling: nothing beyond the kept priorities may enter
            out._threshold = int(_priority(ids, seed).max())
        return out

    def add(self, values: np.ndarray, ids: np.ndarray) -> None:
        if not len(values):
            return
        values = np.asarray(values, dtype=np.float64)
        ids = np.asarray(ids, dtype=np.int64)
        self.count += len(values)
        self._sum.add(values)
        if self._threshold is not None:  # only values that can still be sampled
            keep = _priority(ids, self._seed) < np.uint64(self._threshold)
            values, ids = values[keep], ids[keep]
        self._values.append(values)
        self._ids.append(ids)
        self._num_kept += len(values)
        if self._num_kept > self.capacity + self.capacity // 4:  # bounded slack, rare trims
            self._trim()

    def _trim(self) -> None:
        """Keep the ``capacity`` smallest priorities; the largest kept is the threshold."""
        if not self._values:
            self._values, self._ids = [np.zeros(0)], [np.zeros(0, dtype=np.int64)]
        if len(self._values) == 1 and self._num_kept <= self.capacity:
            return  # one array and nothing to drop (a restored reservoir): no copy
        values, ids = np.concatenate(self._values), np.concatenate(self._ids)
        if len(values) > self.capacity:
            priority = _priority(ids, self._seed)
            keep = np.argpartition(priority, self.capacity - 1)[: self.capacity]
            values, ids = values[keep], ids[keep]
            self._threshold = int(priority[keep].max())
        self._values, self._ids, self._num_kept = [values], [ids], len(values)

    def values(self) -> np.ndarray:
        """Every value added or, past ``capacity``, the sample: in the order of their ids."""
        self._trim()
        values, ids = self._values[0], self._ids[0]
        # The compiled core's samples come in id order: sorting and copying them again (and
        # _trim's concatenation) took 90-140 ms of CPU for the three metrics of the whole
        # Azure conversation trace's 1.5 M block lives, 2 ms without.
        if not np.all(ids[1:] > ids[:-1]):
            order = np.argsort(ids, kind="stable")
            self._values, self._ids = [values[order]], [ids[order]]
        return self._values[0]

    def distribution(self) -> Distribution:
        """``{mean, p50, p90, p99}`` (None when empty): exact up to ``capacity`` values;
        past it the percentiles are the sample's. The mean is every value's, always."""
        out = distribution(self.values())
        if self.count:
            out["mean"] = self._sum.mean(self.count)
        return out


class _DroppedReservoir:
    """A reservoir whose samples were dropped (ResidencyCollector.drop_samples)."""

    def values(self) -> np.ndarray:
        raise RuntimeError("the residency samples were dropped (ResidencyCollector.drop_samples)")

    def distribution(self) -> Distribution:
        raise RuntimeError("the residency samples were dropped (ResidencyCollector.drop_samples)")


class ResidencyCollector:
    """Block lives from pops and hits (see the module docstring). ``add`` takes rows in
    event order; ``reset`` is a cache reset (every open life ends unreported)."""

    def __init__(
        self, num_blocks: int, capacity: int = RESERVOIR_SIZE, batch_rows: int = BATCH_ROWS
    ) -> None:
        """``capacity``: samples kept per metric; ``batch_rows``: rows buffered before they
        are folded into the open lives."""
        self.num_blocks = num_blocks
        self.batch_rows = batch_rows
        self.capacity, self.seed = capacity, _SEED
        # Each block's open life: its start (NaN: none) and its last accesses, right-aligned
        # in ``_history`` (the last ``_num_history`` columns hold them, oldest first).
        self._birth = np.full(num_blocks, np.nan)
        self._history = np.zeros((num_blocks, ACCESS_HISTORY))
        self._num_history = np.zeros(num_blocks, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._num_pending = 0
        self._num_rows = 0  # rows added: a row's index names the life it ends
        self.lifetime = SampleReservoir(capacity)
        self.idle = SampleReservoir(capacity)
        self.reuse_gap = SampleReservoir(capacity)

    def add(self, time_s: np.ndarray, blocks: np.ndarray, is_pop: np.ndarray) -> None:
        """Rows in event order: when (s), which block, and whether the free queue handed
        it out (else it was a prefix hit)."""
        if not len(blocks):
            return
        self._pending.append((time_s, blocks, is_pop))
        self._num_pending += len(blocks)
        if self._num_pending >= self.batch_rows:
            self._fold()

    def restore(self, state: dict[str, Any]) -> None:
        """Take the reservoirs of a collector that read the whole run elsewhere: the compiled
        core's ResidencyTracker (engine/compiled/csrc/residency.hpp, the same lives, ids and
        bounded sample), whose ``state()`` gives each reservoir's kept samples, count and
        exact sum. Rows added here before are dropped."""
        self._pending, self._num_pending = [], 0
        for name in ("lifetime", "idle", "reuse_gap"):
            setattr(self, name, SampleReservoir.restored(self.capacity, self.seed, state[name]))

    def reset(self) -> None:
        self._fold()
        self._birth[:] = np.nan
        self._num_history[:] = 0

    def samples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The kept lifetime, idle and reuse-gap samples (s): every one, up to the
        reservoir's capacity each."""
        self._fold()
        return self.lifetime.values(), self.idle.values(), self.reuse_gap.values()

    def distributions(self) -> tuple[Distribution, Distribution, Distribution]:
        """``{mean, p50, p90, p99}`` of lifetime, idle time and reuse gaps."""
        self._fold()
        return self.lifetime.distribution(), self.idle.distribution(), self.reuse_gap.distribution()

    def drop_samples(self) -> None:
        """Forget the samples, for a caller done with them (a run's summary, once made: full
        reservoirs hold ~100 MB); ``samples`` and ``distributions`` raise afterwards."""
        self._pending, self._num_pending = [], 0
        for name in ("lifetime", "idle", "reuse_gap"):
            setattr(self, name, _DroppedReservoir())

    def _fold(self) -> None:
        if not self._pending:
            return
        parts = list(zip(*self._pending))
        self._pending, self._num_pending = [], 0
        t = np.concatenate(parts[0]).astype(np.float64, copy=False)
        b = np.concatenate(parts[1]).astype(np.int64, copy=False)
        pop = np.concatenate(parts[2]).astype(bool, copy=False)
        self._fold_rows(t, b, pop, self._num_rows)
        self._num_rows += len(b)

    def _fold_rows(self, t: np.ndarray, b: np.ndarray, pop: np.ndarray, first_row: int) -> None:
        order = stable_order(b, self.num_blocks)  # each block's rows together, in time order
        t, b, pop = t[order], b[order], pop[order]
        n = len(b)
        starts = np.flatnonzero(np.diff(b, prepend=-1))
        blocks = b[starts]
        sizes = np.diff(np.append(starts, n))
        # Each block's open life goes in front of its rows as rows: its pop, then its last
        # accesses (hits), so the batch reads as if it held the whole life.
        open_life = ~np.isnan(self._birth[blocks])
        num_hist = np.where(open_life, self._num_history[blocks], 0)
        carried = open_life + num_hist
        total = sizes + carried
        g_start = np.cumsum(total) - total
        m = int(total.sum())
        rt = np.empty(m)
        rpop = np.zeros(m, dtype=bool)
        real = np.repeat(g_start + carried - starts, sizes) + np.arange(n)
        rt[real] = t
        rpop[real] = pop
        row = np.full(m, -1, dtype=np.int64)  # each real row's index among all rows added
        row[real] = first_row + order
        opened = np.flatnonzero(open_life)
        rt[g_start[opened]] = self._birth[blocks[opened]]
        rpop[g_start[opened]] = True
        k = num_hist[opened]
        if k.sum():
            grp = np.repeat(opened, k)
            within = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
            col = ACCESS_HISTORY - np.repeat(k, k) + within
            rt[g_start[grp] + 1 + within] = self._history[blocks[grp], col]
        # The pop that started each row's life (-1: none in this block's rows)
        first = np.zeros(m, dtype=bool)
        first[g_start] = True
        pos = np.arange(m)
        group_first = np.repeat(g_start, total)
        life_start = np.maximum.accumulate(np.where(rpop, pos, -1))
        life_start = np.where(life_start >= group_first, life_start, -1)
        prev_life = np.empty(m, dtype=np.int64)
        prev_life[1:] = life_start[:-1]
        prev_life[first] = -1
        evicts = np.flatnonzero(rpop & (prev_life >= 0))  # pops ending an earlier life
        life = prev_life[evicts]
        ends = row[evicts]  # a life's id: the row that ended it
        self.lifetime.add(rt[evicts] - rt[life], ends)
        self.idle.add(rt[evicts] - rt[evicts - 1], ends)  # the row before: last access, or pop
        # Reuse gaps: between consecutive accesses of the ending life, its last
        # ACCESS_HISTORY: on the rows from life + 2 (its second hit) or
        # evicts - (ACCESS_HISTORY - 1), whichever is later, to evicts - 1.
        gap_from = np.maximum(life + 2, evicts - (ACCESS_HISTORY - 1))
        num_gaps = np.maximum(evicts - gap_from, 0)
        gap_start = np.cumsum(num_gaps) - num_gaps  # each life's first gap, in the output
        offset = np.arange(int(num_gaps.sum())) - np.repeat(gap_start, num_gaps)
        gap_row = np.repeat(gap_from, num_gaps) + offset
        gap_ids = np.repeat(ends, num_gaps) * ACCESS_HISTORY + offset
        self.reuse_gap.add(rt[gap_row] - rt[gap_row - 1], gap_ids)
        # Carry each block's last life: its start and its last accesses.
        g_end = g_start + total - 1
        last_life = life_start[g_end]
        has = last_life >= 0
        self._birth[blocks] = np.where(has, rt[np.maximum(last_life, 0)], np.nan)
        k = np.where(has, np.minimum(g_end - last_life, ACCESS_HISTORY), 0)
        self._num_history[blocks] = k
        if k.sum():
            grp = np.repeat(np.arange(len(blocks)), k)
            within = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
            kk = np.repeat(k, k)
            col = ACCESS_HISTORY - kk + within
            self._history[blocks[grp], col] = rt[g_end[grp] - kk + 1 + within]
