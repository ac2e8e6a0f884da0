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

It also feeds the block pops and prefix hits to a ``ResidencyCollector``
(kvsim/analysis/residency.py): vLLM's block residency samples (lifetime, idle time, reuse
gaps), for every block rather than vLLM's 1% sample, in bounded memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine import EventKind
from engine.core.events import Columns
from kvsim.analysis.residency import RESERVOIR_SIZE, ResidencyCollector, stable_order

_POP_KINDS = (EventKind.ALLOCATE, EventKind.APPEND_BLOCK)
_BLOCK_KINDS = (*_POP_KINDS, EventKind.PREFIX_HIT, EventKind.FREE, EventKind.CACHE, EventKind.EVICT)


def _kind_table(kinds: dict[EventKind, int], dtype: type = np.int8) -> np.ndarray:
    """A lookup table indexed by EventKind code (cheaper than np.isin on every row)."""
    table: np.ndarray = np.zeros(len(EventKind), dtype=dtype)
    for kind, value in kinds.items():
        table[kind] = value
    return table


_IS_BLOCK_KIND = _kind_table(dict.fromkeys(_BLOCK_KINDS, 1), bool)
_IS_POP = _kind_table(dict.fromkeys(_POP_KINDS, 1), bool)
_ACCESS_KINDS = (*_POP_KINDS, EventKind.PREFIX_HIT)
_IS_ACCESS = _kind_table(dict.fromkeys(_ACCESS_KINDS, 1), bool)
# A row's change of its block's reference count: a pop or a prefix hit adds a holder.
_REF_STEP = _kind_table({**dict.fromkeys(_ACCESS_KINDS, 1), EventKind.FREE: -1})
_SETS_KEY = _kind_table({EventKind.CACHE: 1, EventKind.EVICT: 1}, bool)


class BlockStateTracker:
    """Cached-evictable blocks at every STEP event, evictions, and block residency samples
    (see the module docstring). ``consume`` is an ``on_chunk`` callback; the recorder's chunks
    must arrive in order and carry every block id (``on_chunk`` always receives them)."""

    def __init__(
        self,
        num_blocks: int,
        *,
        keep_transitions: bool = False,
        keep_residency: bool = True,
        track_states: bool = True,
        residency_capacity: int = RESERVOIR_SIZE,
    ) -> None:
        """With ``keep_transitions`` it also keeps every moment a block became cached,
        evictable (+1) or stopped being so (-1): ``transitions()``, for the occupancy map.
        Without ``keep_residency`` it keeps no pops and hits (``residency_samples`` is then
        empty): vLLM collects residency only with prefix caching. Without ``track_states``
        it follows no block's state (no ``cached_blocks_at_steps`` or transitions), only the
        evictions and the residency samples: a run's simulation measures the cached blocks
        at each step (SimResult.step_cached_free_blocks), and the state replay was a tenth
        of the full Azure conversation trace's simulation loop under v1.
        ``residency_capacity``: samples kept per residency metric (a fleet's replicas share
        the one-run budget)."""
        if keep_transitions and not track_states:
            raise ValueError("transitions need the blocks' states tracked")
        self.num_blocks = num_blocks
        self.keep_residency = keep_residency
        self.keep_transitions = keep_transitions
        self.track_states = track_states
        self._transitions: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._ref = np.zeros(num_blocks, dtype=np.int64)
        self._key = np.zeros(num_blocks, dtype=bool)
        self._num_cached_free = 0
        self.num_evictions = 0  # blocks whose key left the cache by reuse (EVICT)
        self._at_steps: list[np.ndarray] = []
        self.residency = ResidencyCollector(num_blocks, capacity=residency_capacity)

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
                if self.keep_residency:
                    self.residency.reset()
            seg = slice(lo, hi)
            b_lo = int(starts[lo]) if lo < n else len(block_ids)
            b_hi = int(starts[hi - 1] + counts[hi - 1]) if hi > lo else b_lo
            self._segment(kind[seg], counts[seg], block_ids[b_lo:b_hi], cols["time_s"][seg],
                          delta[seg])  # fmt: skip
        if not self.track_states:
            return
        cached = np.cumsum(delta) + self._num_cached_free_before(delta)
        self._at_steps.append(cached[kind == EventKind.STEP])

    def restore_compiled(self, state: dict[str, Any]) -> None:
        """What the compiled core computed from the whole run's events instead of
        ``consume`` (a tracker without ``track_states``): ``V1Core.residency_state()``, its
        eviction count and residency reservoirs (ResidencyCollector.restore)."""
        if self.track_states:
            raise ValueError("the compiled core follows no block states (track_states=False)")
        self.num_evictions = int(state["num_evictions"])
        if self.keep_residency:
            self.residency.restore(state)

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
        is_block = _IS_BLOCK_KIND[kind]
        if counts[~is_block].any():  # drop the rows of events whose blocks change no state
            block_ids = block_ids[np.repeat(is_block, counts)]
            counts = np.where(is_block, counts, 0)
        if not len(block_ids):
            return
        block_ids = block_ids.astype(np.int64, copy=False)
        # Rows refer to their event by index; per-row values are looked up through it.
        event = np.repeat(np.arange(len(kind), dtype=np.int32), counts)
        self.num_evictions += int(counts[kind == EventKind.EVICT].sum())
        if self.keep_residency:
            access = np.repeat(_IS_ACCESS[kind], counts)
            access_event = event[access]
            self.residency.add(time_s[access_event], block_ids[access], _IS_POP[kind[access_event]])
        if not self.track_states:
            return
        # Without any key, held or arriving, no block can be cached-evictable: only the
        # reference counts move (azure_llm_2023_conv without prefix caching: 0.07 s of
        # tracking instead of 0.93 s).
        if not self._key.any() and not counts[kind == EventKind.CACHE].any():
            step = _REF_STEP[kind[event]]
            self._ref += np.bincount(block_ids, weights=step, minlength=self.num_blocks).astype(
                np.int64
            )
            return
        order = stable_order(block_ids, self.num_blocks)  # each block's rows together, in order
        ev = event[order]
        k = kind[ev]
        # the blocks in order and their rows, counted (no gather of the sorted ids)
        rows_of = np.bincount(block_ids, minlength=self.num_blocks)
        b_first = np.flatnonzero(rows_of)
        sizes = rows_of[b_first]
        group_end = np.cumsum(sizes)
        group_start = group_end - sizes
        group_end -= 1
        m = len(ev)
        first = np.zeros(m, dtype=bool)
        first[group_start] = True
        # reference count after each row: a cumulative sum per block from its carried count
        step = _REF_STEP[k]
        cs = np.cumsum(step, dtype=np.int64)
        base = cs[group_start] - step[group_start] - self._ref[b_first]
        ref_after = cs - np.repeat(base, sizes)
        # key after each row: the last CACHE (1) or EVICT (0) of the block so far, else carried
        sets = _SETS_KEY[k]
        value = k == EventKind.CACHE
        value[group_start] = np.where(sets[group_start], value[group_start], self._key[b_first])
        known = np.flatnonzero(sets | first)
        key_after = np.repeat(value[known], np.diff(np.append(known, m)))
        # cached-evictable (free, with a key) after each row; before it: after the row above
        # in the block, or the carried state
        cached_after = (ref_after == 0) & key_after
        cached_before = np.empty(m, dtype=bool)
        cached_before[1:] = cached_after[:-1]
        cached_before[group_start] = (self._ref[b_first] == 0) & self._key[b_first]
        change = cached_after.view(np.int8) - cached_before.view(np.int8)
        # Count the +1s and -1s per event apart: integer bincounts (no float weights over
        # every row; 190 ms of the run's 1.1 s before)
        up, down = np.flatnonzero(change > 0), np.flatnonzero(change < 0)
        delta += np.bincount(ev[up], minlength=len(kind))
        delta -= np.bincount(ev[down], minlength=len(kind))
        if self.keep_transitions:
            moved = np.flatnonzero(change)
            b = np.repeat(b_first, sizes)
            self._transitions.append((time_s[ev[moved]], b[moved], change[moved].astype(np.int64)))
        self._num_cached_free += len(up) - len(down)
        self._ref[b_first] = ref_after[group_end]
        self._key[b_first] = key_after[group_end]

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
        events (``track_states`` only)."""
        if not self.track_states:
            raise ValueError("this tracker follows no block states (track_states=False)")
        if not self._at_steps:
            return np.zeros(0, dtype=np.int64)
        if len(self._at_steps) > 1:
            self._at_steps = [np.concatenate(self._at_steps)]
        return self._at_steps[0][:num_steps]

    def residency_samples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """vLLM's ``kv_block_lifetime_seconds``, ``kv_block_idle_before_evict_seconds`` and
        ``kv_block_reuse_gap_seconds`` samples (s), one per eviction (the gaps: up to
        ``ACCESS_HISTORY - 1`` per eviction), up to kvsim/analysis/residency.py's reservoir
        size each."""
        return self.residency.samples()
