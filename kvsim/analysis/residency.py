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
that many (the mean still over every sample), so a run's summary repeats exactly.
"""

from __future__ import annotations

import numpy as np

from kvsim.analysis.load import distribution

# The last accesses a block remembers (vLLM's BlockMetricsState.access_history maxlen).
ACCESS_HISTORY = 4
# Samples kept per metric before the reservoir samples them: 32 MiB of float64 each. The
# full Azure conversation trace has 1.6 M lives, the million-request benchmark tens of millions.
RESERVOIR_SIZE = 1 << 22
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


class SampleReservoir:
    """Values added in batches: all of them up to ``capacity``, then a uniform sample of
    ``capacity`` (Algorithm R: the i-th value replaces a random kept one with probability
    capacity / i), drawn from a generator with a fixed seed."""

    def __init__(self, capacity: int = RESERVOIR_SIZE, seed: int = _SEED) -> None:
        self.capacity = capacity
        self.count = 0  # values added
        self._total = 0.0  # their sum (the mean once sampling)
        self._parts: list[np.ndarray] = []  # every value, while count <= capacity
        self._kept: np.ndarray | None = None  # the sample, once count > capacity
        self._seed = seed
        # Made when sampling starts: numpy.random imports `secrets` (~10 ms of a short run).
        self._rng: np.random.Generator | None = None

    def add(self, values: np.ndarray) -> None:
        n = len(values)
        if not n:
            return
        values = np.asarray(values, dtype=np.float64)
        self._total += float(values.sum())
        if self._kept is None and self.count + n <= self.capacity:
            self._parts.append(values)
            self.count += n
            return
        if self._kept is None:  # fill up to capacity, then sample the rest
            room = self.capacity - self.count
            self._kept = np.concatenate([*self._parts, values[:room]])
            self._parts = []
            self.count += room
            values = values[room:]
            n = len(values)
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        # value number i (1-based) lands on slot j, uniform in [0, i), when j < capacity
        slots = self._rng.integers(0, np.arange(self.count + 1, self.count + n + 1))
        hit = np.flatnonzero(slots < self.capacity)
        # several values may land on one slot: the last one stays, as sequentially
        last_first = hit[::-1]
        _, at = np.unique(slots[last_first], return_index=True)
        winners = last_first[at]
        self._kept[slots[winners]] = values[winners]
        self.count += n

    def values(self) -> np.ndarray:
        """Every value added (in order) or, past ``capacity``, the sample."""
        if self._kept is not None:
            return self._kept
        if len(self._parts) != 1:
            self._parts = [np.concatenate(self._parts) if self._parts else np.zeros(0)]
        return self._parts[0]

    def distribution(self) -> Distribution:
        """``{mean, p50, p90, p99}`` (None when empty): exact up to ``capacity`` values;
        past it the percentiles are the sample's and the mean is every value's."""
        out = distribution(self.values())
        if self._kept is not None:
            out["mean"] = self._total / self.count
        return out


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
        # Each block's open life: its start (NaN: none) and its last accesses, right-aligned
        # in ``_history`` (the last ``_num_history`` columns hold them, oldest first).
        self._birth = np.full(num_blocks, np.nan)
        self._history = np.zeros((num_blocks, ACCESS_HISTORY))
        self._num_history = np.zeros(num_blocks, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._num_pending = 0
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

    def _fold(self) -> None:
        if not self._pending:
            return
        parts = list(zip(*self._pending))
        self._pending, self._num_pending = [], 0
        t = np.concatenate(parts[0]).astype(np.float64, copy=False)
        b = np.concatenate(parts[1]).astype(np.int64, copy=False)
        pop = np.concatenate(parts[2]).astype(bool, copy=False)
        self._fold_rows(t, b, pop)

    def _fold_rows(self, t: np.ndarray, b: np.ndarray, pop: np.ndarray) -> None:
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
        self.lifetime.add(rt[evicts] - rt[life])
        self.idle.add(rt[evicts] - rt[evicts - 1])  # the row before: last access, or the pop
        # Reuse gaps: between consecutive accesses of the ending life, its last
        # ACCESS_HISTORY: on the rows from life + 2 (its second hit) or
        # evicts - (ACCESS_HISTORY - 1), whichever is later, to evicts - 1.
        gap_from = np.maximum(life + 2, evicts - (ACCESS_HISTORY - 1))
        num_gaps = np.maximum(evicts - gap_from, 0)
        gap_start = np.cumsum(num_gaps) - num_gaps  # each life's first gap, in the output
        offset = np.arange(int(num_gaps.sum())) - np.repeat(gap_start, num_gaps)
        gap_row = np.repeat(gap_from, num_gaps) + offset
        self.reuse_gap.add(rt[gap_row] - rt[gap_row - 1])
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
