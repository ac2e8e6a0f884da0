"""The CPU tier: a pool of chunk slots, ref counts, and a cache policy (vLLM 0.33's
CPUOffloadingManager, vllm/v1/kv_offload/cpu/manager.py, with store_threshold 0).

Life of a chunk: ``prepare_store`` inserts it not ready (ref -1), evicting ready idle chunks
when the pool is full (all or nothing: None when not enough can go, and nothing is stored);
``complete_store`` makes it ready (ref 0, evictable). ``prepare_load`` pins ready chunks
(ref + 1) and ``complete_load`` unpins them. ``lookup`` says HIT (ready), HIT_PENDING (being
stored) or MISS. The manager also records, per request, which keys it touched, so that the
policy sees one access per request when it finishes (``on_request_finished``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.compiled import chosen
from engine.offload.policies import ChunkStatus, OffloadKey, RequestContext, make_policy


class LookupResult(enum.Enum):
    MISS = "miss"
    HIT = "hit"
    HIT_PENDING = "hit_pending"  # held, but its store has not completed


@dataclass(frozen=True, slots=True)
class PrepareStoreOutput:
    """Keys to store now (the others offered are already held) and keys evicted for them."""

    keys_to_store: list[OffloadKey]
    evicted_keys: list[OffloadKey]


class CPUOffloadManager:
    """A tier of ``num_chunks`` chunk slots under ``policy`` ("lru" or "arc")."""

    def __init__(self, num_chunks: int, policy: str = "lru") -> None:
        if num_chunks < 0:
            raise ValueError(f"num_chunks must be >= 0, got {num_chunks}")
        self.num_chunks = num_chunks
        self.policy = make_policy(policy, num_chunks)
        self._num_allocated = 0  # slots ever handed out; freed ones wait in _free_slots
        self._free_slots: list[int] = []
        self.num_evictable = 0
        self.num_write_pending = 0
        # Totals for metrics: chunks stored, evicted, loaded (pinned) over the run.
        self.num_stored = 0
        self.num_evicted = 0

    # --- the pool ---------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Slots holding no chunk."""
        return len(self._free_slots) + self.num_chunks - self._num_allocated

    @property
    def num_held(self) -> int:
        """Chunks held, ready or being stored."""
        return self.num_chunks - self.num_free

    def _allocate(self, n: int) -> list[ChunkStatus]:
        fresh = min(n, self.num_chunks - self._num_allocated)
        chunks = [ChunkStatus(self._num_allocated + i) for i in range(fresh)]
        self._num_allocated += fresh
        chunks.extend(ChunkStatus(self._free_slots.pop()) for _ in range(n - fresh))
        return chunks

    # --- per-request access record ------------------------------------------------------------

    def new_context(self, seq_id: int) -> RequestContext:
        """A fresh access record for request ``seq_id`` (the compiled tier keeps its records
        itself and answers the id)."""
        return RequestContext()

    def add_positions(
        self, ctx: RequestContext, keys: Sequence[OffloadKey], first: int, step: int
    ) -> None:
        """``keys[i]``'s position is ``first + i * step`` tokens (its chunk's end)."""
        positions = ctx.positions
        for i, key in enumerate(keys):
            positions[key] = first + i * step

    def held_keys(self) -> list[OffloadKey]:
        """Every chunk held (ready or being stored)."""
        return list(self.policy.held_keys())

    def _record_access(
        self,
        keys: Sequence[OffloadKey],
        ctx: RequestContext,
        reused: Sequence[OffloadKey] = (),
    ) -> None:
        new_keys = [key for key in keys if key not in ctx.seen]
        if new_keys:
            ctx.seen.update(new_keys)
            ctx.seen_order.extend(new_keys)
            self.policy.on_request_access(new_keys, ctx)
        # Re-reading a chunk this request stored is not a second access.
        ctx.reused.update(key for key in reused if key not in ctx.inserted)

    # --- the manager's interface --------------------------------------------------------------

    def lookup(self, key: OffloadKey) -> LookupResult:
        chunk = self.policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Sequence[OffloadKey], ctx: RequestContext) -> None:
        """Pin ready chunks ``keys`` for a load."""
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None or not chunk.is_ready:
                raise ValueError(f"chunk {key} is not ready to load")
            if chunk.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
                self.num_evictable -= 1
            chunk.ref_cnt += 1
        self._record_access(keys, ctx, reused=keys)

    def complete_load(self, keys: Sequence[OffloadKey] | set[OffloadKey]) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None or chunk.ref_cnt <= 0:
                raise ValueError(f"chunk {key} completed a load it was not pinned for")
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.num_evictable += 1
                self.policy.mark_evictable(key)

    def prepare_store(
        self, keys: Sequence[OffloadKey], ctx: RequestContext
    ) -> PrepareStoreOutput | None:
        """Insert the ``keys`` not held yet, as being stored; None (nothing changes but the
        request's access record) when the pool cannot make room."""
        keys_to_store = []
        ready_existing = []
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None:
                keys_to_store.append(key)
            elif chunk.is_ready:
                ready_existing.append(key)
        new_misses = [key for key in keys_to_store if key not in ctx.store_misses]
        if new_misses:
            # ARC learns from its ghost lists before insert() drops the ghost entry.
            self.policy.on_store_miss(new_misses, ctx)
            ctx.store_misses.update(new_misses)
        recorded = set(keys_to_store)
        recorded.update(ready_existing)
        self._record_access([key for key in keys if key in recorded], ctx, reused=ready_existing)
        if not keys_to_store:
            return PrepareStoreOutput([], [])
        to_evict = len(keys_to_store) - self.num_free
        evicted_keys: list[OffloadKey] = []
        if to_evict > 0:
            if to_evict > self.num_evictable:
                return None
            # A chunk offered by this very store stays: it was already stored.
            victims = self.policy.evict(to_evict, set(keys))
            if victims is None:
                return None
            self.num_evictable -= len(victims)
            self.num_evicted += len(victims)
            for key, chunk in victims:
                self._free_slots.append(chunk.chunk_id)
                evicted_keys.append(key)
        for key, chunk in zip(keys_to_store, self._allocate(len(keys_to_store))):
            self.policy.insert(key, chunk, ctx)
        self.num_write_pending += len(keys_to_store)
        ctx.inserted.update(keys_to_store)
        return PrepareStoreOutput(keys_to_store, evicted_keys)

    def complete_store(self, keys: Sequence[OffloadKey] | set[OffloadKey]) -> list[OffloadKey]:
        """The stores of ``keys`` completed: they become ready. Returns those that did."""
        stored = []
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is not None and not chunk.is_ready:
                chunk.ref_cnt = 0
                self.num_write_pending -= 1
                self.num_evictable += 1
                self.num_stored += 1
                self.policy.mark_evictable(key)
                stored.append(key)
        return stored

    def on_request_finished(self, ctx: RequestContext) -> None:
        """The request's one access: its keys head to tail (by position)."""
        if ctx.finished:
            return
        ctx.finished = True
        keys = ctx.seen_order
        if all(key in ctx.positions for key in keys):
            keys = sorted(keys, key=ctx.positions.__getitem__)
        self.policy.on_request_finished(keys, ctx.inserted - ctx.reused, ctx.reused, ctx)


def make_cpu_tier(num_chunks: int, policy: str = "lru", *, compiled: bool | None = None) -> Any:
    """A CPU tier of ``num_chunks`` chunks under ``policy``: CPUOffloadManager, or its
    compiled mirror (engine/compiled: ``CpuTier``, same answers; docs/compiled.md).
    ``compiled``: None = the compiled one when the extension is built and
    ``KVSIM_PURE_PYTHON`` is not 1; True = the compiled one (RuntimeError when unavailable);
    False = the Python one."""
    core = chosen(compiled)
    if core is None:
        return CPUOffloadManager(num_chunks, policy)
    return core.CpuTier(num_chunks, policy)
