"""The v1 block pool block by block: reference counts, prefix-cache keys, cached-evictable
blocks, evictions and vLLM's block residency samples, from the event stream.

Under the v1 scheduler with prefix caching a block is in one of three states at any moment:

- held: some sequence's table holds it (reference count > 0; a prefix hit adds a reference,
  so one block may be held by several sequences and still counts once in the pool);
- cached, evictable: nobody holds it but it keeps its prefix-cache key. vLLM's
  ``get_num_free_blocks`` counts it as free (the free queue hands it out, evicting it), yet
  a later prefix hit takes it back without computing anything;
- free: nobody holds it and it has no key.

``BlockStateTracker`` replays the block events (ALLOCATE / APPEND_BLOCK take a block from
the free queue, PREFIX_HIT adds a reference, FREE drops one, CACHE gives a key, EVICT and
CACHE_RESET take keys away) chunk by chunk as the recorder packs them (an ``on_chunk``
callback), vectorised per chunk with each block's reference count and key carried over.

It also collects what vLLM's ``KVCacheMetricsCollector`` samples (vllm/v1/core/
kv_cache_metrics.py), for every block rather than a 1% sample: a block's life starts when
the free queue hands it out and ends when it hands it out again (vLLM calls both
``get_new_blocks``; it reports the second as an eviction whether or not the block was still
cached); its accesses are its prefix hits. At each such eviction: lifetime (seconds since
it was handed out), idle time (seconds since its last access, or since it was handed out),
and the gaps between its last four accesses. Blocks never handed out again report nothing.
"""

from __future__ import annotations

import numpy as np

from engine import EventKind
from engine.events import Columns

_POP_KINDS = (EventKind.ALLOCATE, EventKind.APPEND_BLOCK)
_BLOCK_KINDS = np.array(
    (*_POP_KINDS, EventKind.PREFIX_HIT, EventKind.FREE, EventKind.CACHE, EventKind.EVICT)
)
# The last accesses a block remembers (vLLM's BlockMetricsState.access_history maxlen).
ACCESS_HISTORY = 4


class BlockStateTracker:
    """Cached-evictable blocks at every STEP event, evictions, and block residency samples
    (see the module docstring). ``consume`` is an ``on_chunk`` callback; the recorder's chunks
    must arrive in order and carry every block id (``on_chunk`` always receives them)."""

    def __init__(
        self, num_blocks: int, *, keep_transitions: bool = False, keep_residency: bool = True
    ) -> None:
        """With ``keep_transitions`` it also keeps every moment a block became cached,
        evictable (+1) or stopped being so (-1): ``transitions()``, for the occupancy map.
        Without ``keep_residency`` it keeps no pops and hits (``residency_samples`` is then
        empty): vLLM collects residency only with prefix caching."""
        self.num_blocks = num_blocks
        self.keep_residency = keep_residency
        self.keep_transitions = keep_transitions
        self._transitions: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._ref = np.zeros(num_blocks, dtype=np.int64)
        self._key = np.zeros(num_blocks, dtype=bool)
        self._num_cached_free = 0
        self.num_evictions = 0  # blocks whose key left the cache by reuse (EVICT)
        self._at_steps: list[np.ndarray] = []
        # Block pops and accesses, kept compact for the residency samples (computed once).
        self._times: list[np.ndarray] = []
        self._blocks: list[np.ndarray] = []
        self._is_pop: list[np.ndarray] = []
        self._segments: list[np.ndarray] = []
        self._num_resets = 0

    def consume(self, cols: Columns, block_ids: np.ndarray) -> None:
        """Account one chunk of events (in recording order)."""
        kind = cols["kind"]
        n = len(kind)
        delta = np.zeros(n, dtype=np.int64)
        resets = np.flatnonzero(kind == EventKind.CACHE_RESET)
        counts = cols["num_blocks"].astype(np.int64)
        starts = np.cumsum(counts) - counts
        bounds = [0, *(int(r) for r in resets), n]
        for i in range(len(bounds) - 1):
            lo, hi = bounds[i], bounds[i + 1]
            if i:  # event lo is a reset: every key leaves the cache (nothing is held then)
                if self.keep_transitions:
                    ended = np.flatnonzero(self._key & (self._ref == 0))
                    t = np.full(len(ended), cols["time_s"][lo])
                    self._transitions.append((t, ended, np.full(len(ended), -1)))
                delta[lo] = -self._num_cached_free
                self._num_cached_free = 0
                self._key[:] = False
                self._num_resets += 1
            seg = slice(lo, hi)
            b_lo = int(starts[lo]) if lo < n else len(block_ids)
            b_hi = int(starts[hi - 1] + counts[hi - 1]) if hi > lo else b_lo
            self._segment(kind[seg], counts[seg], block_ids[b_lo:b_hi], cols["time_s"][seg],
                          delta[seg])  # fmt: skip
        cached = np.cumsum(delta) + self._num_cached_free_before(delta)
        self._at_steps.append(cached[kind == EventKind.STEP])

    def _num_cached_free_before(self, delta: np.ndarray) -> int:
        # _num_cached_free is the count after the chunk; the chunk's cumsum starts before it
        return self._num_cached_free - int(delta.sum())

    def _segment(
        self,
        kind: np.ndarray,
        counts: np.ndarray,
        block_ids: np.ndarray,
        time_s: np.ndarray,
        delta: np.ndarray,
    ) -> None:
        """Events without a reset among them: fill ``delta`` (change of the cached-evictable
        count per event) and carry the blocks' states."""
        event = np.repeat(np.arange(len(kind)), counts)
        row_kind = np.repeat(kind, counts)
        keep = np.isin(row_kind, _BLOCK_KINDS)
        event, row_kind, blocks = event[keep], row_kind[keep], block_ids[keep].astype(np.int64)
        if not len(blocks):
            return
        self.num_evictions += int((row_kind == EventKind.EVICT).sum())
        is_pop = np.isin(row_kind, _POP_KINDS)
        if self.keep_residency:
            access = is_pop | (row_kind == EventKind.PREFIX_HIT)
            self._times.append(np.repeat(time_s, counts)[keep][access])
            self._blocks.append(blocks[access].astype(np.int32))
            self._is_pop.append(is_pop[access])
            self._segments.append(np.full(int(access.sum()), self._num_resets, dtype=np.int32))
        order = np.argsort(blocks, kind="stable")  # each block's rows together, in order
        b, k = blocks[order], row_kind[order]
        m = len(b)
        first = np.ones(m, dtype=bool)
        first[1:] = b[1:] != b[:-1]
        last = np.ones(m, dtype=bool)
        last[:-1] = first[1:]
        step = np.where(is_pop[order] | (k == EventKind.PREFIX_HIT), 1, 0)
        step = np.where(k == EventKind.FREE, -1, step)
        # reference count after each row: a cumulative sum per block from its carried count
        cs = np.cumsum(step)
        group_start = np.flatnonzero(first)
        base = (cs - step)[first] - self._ref[b[first]]
        ref_after = cs - np.repeat(base, np.diff(np.append(group_start, m)))
        ref_before = ref_after - step
        # key after each row: the last CACHE (1) or EVICT (0) of the block so far, else carried
        sets = (k == EventKind.CACHE) | (k == EventKind.EVICT)
        value = np.where(sets, k == EventKind.CACHE, self._key[b])
        pos = np.arange(m)
        key_after = value[np.maximum.accumulate(np.where(sets | first, pos, 0))]
        key_before = np.empty(m, dtype=bool)
        key_before[1:] = key_after[:-1]
        key_before[first] = self._key[b[first]]
        change = ((ref_after == 0) & key_after).astype(np.int64) - ((ref_before == 0) & key_before)
        delta += np.bincount(event[order], weights=change, minlength=len(kind)).astype(np.int64)
        if self.keep_transitions:
            moved = change != 0
            self._transitions.append((time_s[event[order][moved]], b[moved], change[moved]))
        self._num_cached_free += int(change.sum())
        self._ref[b[last]] = ref_after[last]
        self._key[b[last]] = key_after[last]

    def transitions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time_s, block_id, change) of every block becoming cached, evictable (+1: freed
        with its key) or ceasing to be (-1: hit, evicted or reset), in order per block."""
        if not self._transitions:
            empty = np.zeros(0, dtype=np.int64)
            return np.zeros(0), empty, empty
        parts = list(zip(*self._transitions))
        return tuple(np.concatenate(p) for p in parts)  # type: ignore[return-value]

    def cached_blocks_at_steps(self, num_steps: int) -> np.ndarray:
        """Cached-evictable blocks (free, with a key) at each of the first ``num_steps`` STEP
        events."""
        if not self._at_steps:
            return np.zeros(0, dtype=np.int64)
        if len(self._at_steps) > 1:
            self._at_steps = [np.concatenate(self._at_steps)]
        return self._at_steps[0][:num_steps]

    def residency_samples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """vLLM's ``kv_block_lifetime_seconds``, ``kv_block_idle_before_evict_seconds`` and
        ``kv_block_reuse_gap_seconds`` samples (s), one per eviction (the gaps: up to
        ``ACCESS_HISTORY - 1`` per eviction)."""
        empty = np.zeros(0)
        if not self._times:
            return empty, empty, empty
        t = np.concatenate(self._times)
        b = np.concatenate(self._blocks).astype(np.int64)
        pop = np.concatenate(self._is_pop)
        seg = np.concatenate(self._segments).astype(np.int64)
        order = np.lexsort((np.arange(len(t)), b, seg))  # per (reset segment, block), in order
        t, b, pop, seg = t[order], b[order], pop[order], seg[order]
        n = len(t)
        first = np.ones(n, dtype=bool)
        first[1:] = (b[1:] != b[:-1]) | (seg[1:] != seg[:-1])
        pos = np.arange(n)
        # the row of the pop that started each row's life (-1: none yet in this group)
        group_start = np.maximum.accumulate(np.where(first, pos, 0))
        life_start = np.maximum.accumulate(np.where(pop, pos, -1))
        life_start = np.where(life_start >= group_start, life_start, -1)
        prev_life = np.full(n, -1)
        prev_life[1:] = life_start[:-1]
        prev_life[first] = -1
        evicts = pop & (prev_life >= 0)  # a pop ending an earlier life
        lifetime = t[evicts] - t[prev_life[evicts]]
        idle = t[evicts] - t[pos[evicts] - 1]  # the row before: the last access or the pop
        # Reuse gaps: between consecutive accesses (hits) of one life that an eviction ends,
        # the last ACCESS_HISTORY of them.
        hit = ~pop & (life_start >= 0)
        ended = np.zeros(n, dtype=bool)  # the life this row belongs to ends in an eviction
        ended_lives = prev_life[evicts]
        life_ended = np.zeros(n, dtype=bool)
        life_ended[ended_lives] = True
        ended[hit] = life_ended[life_start[hit]]
        hit_no = np.cumsum(hit)  # running count of hits, to number them within a life
        base = np.zeros(n, dtype=np.int64)
        base[life_start >= 0] = (hit_no - hit)[life_start[life_start >= 0]]
        index_in_life = hit_no - base  # 1, 2, ... for the hits of a life
        hits_in_life = np.zeros(n, dtype=np.int64)
        life_rows = life_start[hit]
        np.add.at(hits_in_life, life_rows, 1)
        total = hits_in_life[np.where(life_start >= 0, life_start, 0)]
        gap_row = hit & ended & (index_in_life >= 2)
        gap_row &= index_in_life > total - (ACCESS_HISTORY - 1)
        gaps = t[gap_row] - t[pos[gap_row] - 1]
        return lifetime, idle, gaps
