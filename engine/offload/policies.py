"""Which offloaded chunk a full CPU tier evicts: vLLM 0.33's LRU and ARC cache policies
(vllm/v1/kv_offload/cpu/policies/lru.py and arc.py).

A chunk is ``offload block size`` tokens of KV (one or more GPU blocks) named by its chained
prefix key. Its ``ChunkStatus.ref_cnt`` is -1 while its store is in flight (not readable), 0
when it is ready and evictable, > 0 while loads read it. A policy keeps the chunks and picks
eviction victims; the manager (cpu_manager.py) owns ref counts and the chunk pool.

LRU (vLLM's default). Recency is a rank, not an insertion order: every request gets one rank
the first time it touches the tier, and a chunk it stores or reads gets ``(request rank,
-position)`` so that, within one request, the tail is older than the head; when the request
finishes, its chunks get fresh ranks tail to head (its head becomes the most recent). The
victim is the evictable chunk with the smallest rank.

ARC. T1 holds chunks seen once, T2 chunks reused; B1/B2 remember the keys evicted from each.
A store that misses but whose key is in B1 (B2) moves the target size of T1 up (down); a
finished request moves the chunks it reused (loaded, or offered for store while already
present) from T1 to T2 or to T2's MRU end; its insertion-only chunks keep their list and move
to its MRU end. The victim comes from T1 while T1 holds at least ``int(target)`` chunks,
else from T2, each from its LRU end.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

OffloadKey = int
# vLLM's rank is the pair (request rank, -position); kvsim packs it into one int ordered the
# same way, (rank << 32) + (2**31 - position), positions being below 2**31 tokens: heap entries
# then compare ints, not tuples (benchmarks/bench_offload.py, Mooncake's first 1,000 requests
# with a 64 GiB tier: 43.7 -> 37.9 s, one run each on a busy machine; the heap pops had taken
# 14.7 of 88.8 s under cProfile).
Rank = int
_POSITION_BIAS = 1 << 31


def _rank(major: int, position: int = 0) -> Rank:
    """vLLM's rank (major, -position) as one int of the same order."""
    return (major << 32) + _POSITION_BIAS - position


@dataclass(slots=True)
class ChunkStatus:
    """One CPU chunk slot: ``ref_cnt`` -1 = store in flight, 0 = ready and evictable, > 0 =
    that many loads read it; ``chunk_id`` = its slot in the tier."""

    chunk_id: int
    ref_cnt: int = -1

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


@dataclass(slots=True)
class RequestContext:
    """What the tier remembers about one request (vLLM's ReqContext): each of its chunk
    keys' position (tokens up to the chunk's end), its LRU rank once it has one, and the keys
    it touched (first-seen order; which it stored, which it reused)."""

    positions: dict[OffloadKey, int] = field(default_factory=dict)
    lru_rank: int | None = None
    seen_order: list[OffloadKey] = field(default_factory=list)
    seen: set[OffloadKey] = field(default_factory=set)
    inserted: set[OffloadKey] = field(default_factory=set)
    reused: set[OffloadKey] = field(default_factory=set)
    store_misses: set[OffloadKey] = field(default_factory=set)
    finished: bool = False


class CachePolicy:
    """The interface both policies implement (vLLM's CachePolicy)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        raise NotImplementedError

    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: RequestContext) -> None:
        raise NotImplementedError

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Remove exactly ``n`` evictable chunks not in ``protected`` and return them, or
        return None and change nothing if there are fewer."""
        raise NotImplementedError

    def held_keys(self) -> Iterable[OffloadKey]:
        """Every chunk held (ready or being stored)."""
        raise NotImplementedError

    def on_store_miss(self, keys: Sequence[OffloadKey], ctx: RequestContext) -> None:
        """Keys offered for store that the tier does not hold (before they are inserted)."""

    def on_request_access(self, keys: Sequence[OffloadKey], ctx: RequestContext) -> None:
        """Keys a request touches for the first time (stored, or found already present)."""

    def on_request_finished(
        self,
        keys: Sequence[OffloadKey],
        insertion_only: set[OffloadKey],
        reused: set[OffloadKey],
        ctx: RequestContext,
    ) -> None:
        """The request's keys head to tail, once, when it finishes."""

    def mark_evictable(self, key: OffloadKey) -> None:
        """``key``'s ref count went to 0."""

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """``key``'s ref count left 0."""


class LRUPolicy(CachePolicy):
    """vLLM's LRUCachePolicy (module docstring): ranks, and a heap of evictable chunks with
    stale entries skipped (a rank changes without a heap update)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self._ranks: dict[OffloadKey, Rank] = {}
        self._evictable: set[OffloadKey] = set()
        self._heap: list[tuple[Rank, OffloadKey]] = []
        self._next_rank = 0

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def held_keys(self) -> Iterable[OffloadKey]:
        return self.chunks.keys()

    def _request_rank(self, ctx: RequestContext) -> int:
        if ctx.lru_rank is None:
            self._next_rank += 1
            ctx.lru_rank = self._next_rank
        return ctx.lru_rank

    def _set_rank(self, key: OffloadKey, rank: Rank) -> None:
        self._ranks[key] = rank
        if key in self._evictable:
            heapq.heappush(self._heap, (rank, key))

    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: RequestContext) -> None:
        self.chunks[key] = chunk
        position = ctx.positions.get(key)
        if position is None:
            self._next_rank += 1
            self._ranks[key] = _rank(self._next_rank)
        else:
            self._ranks[key] = _rank(self._request_rank(ctx), position)
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
            heapq.heappush(self._heap, (self._ranks[key], key))

    def on_request_access(self, keys: Sequence[OffloadKey], ctx: RequestContext) -> None:
        request_rank = self._request_rank(ctx)
        for key in keys:
            position = ctx.positions.get(key)
            if position is None or key not in self.chunks:
                continue
            rank = _rank(request_rank, position)
            if self._ranks[key] < rank:  # never makes a chunk older
                self._set_rank(key, rank)

    def on_request_finished(
        self,
        keys: Sequence[OffloadKey],
        insertion_only: set[OffloadKey],
        reused: set[OffloadKey],
        ctx: RequestContext,
    ) -> None:
        for key in reversed(keys):  # tail first: the head ends most recent
            if key in self.chunks:
                self._next_rank += 1
                self._set_rank(key, _rank(self._next_rank))

    def mark_evictable(self, key: OffloadKey) -> None:
        self._evictable.add(key)
        heapq.heappush(self._heap, (self._ranks[key], key))

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.remove(key)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        heap, ranks, evictable = self._heap, self._ranks, self._evictable
        selected: list[tuple[Rank, OffloadKey]] = []
        selected_keys: set[OffloadKey] = set()
        passed_over: list[tuple[Rank, OffloadKey]] = []
        while heap and len(selected) < n:
            rank, key = heapq.heappop(heap)
            if key not in evictable or ranks.get(key) != rank or key in selected_keys:
                continue  # stale: the chunk was pinned, re-ranked or already chosen
            if key in protected:
                passed_over.append((rank, key))
                continue
            selected.append((rank, key))
            selected_keys.add(key)
        for entry in passed_over:
            heapq.heappush(heap, entry)
        if len(selected) < n:
            for entry in selected:
                heapq.heappush(heap, entry)
            return None
        victims = []
        for _, key in selected:
            evictable.remove(key)
            del ranks[key]
            victims.append((key, self.chunks.pop(key)))
        if len(heap) > max(64, 2 * len(evictable)):
            # Stale entries pile up as ranks change: rebuild from the live ones.
            self._heap = [(ranks[key], key) for key in evictable]
            heapq.heapify(self._heap)
        return victims


class ARCPolicy(CachePolicy):
    """vLLM's ARCCachePolicy (module docstring)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.target_t1_size = 0.0
        self.t1: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        chunk = self.t1.get(key)
        return chunk if chunk is not None else self.t2.get(key)

    def held_keys(self) -> Iterable[OffloadKey]:
        return [*self.t1.keys(), *self.t2.keys()]

    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: RequestContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: OffloadKey) -> None:
        if key in self.b1:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self.b2.move_to_end(key)

    def on_store_miss(self, keys: Sequence[OffloadKey], ctx: RequestContext) -> None:
        for key in reversed(keys):
            self._adapt_to_ghost_hit(key)

    def on_request_finished(
        self,
        keys: Sequence[OffloadKey],
        insertion_only: set[OffloadKey],
        reused: set[OffloadKey],
        ctx: RequestContext,
    ) -> None:
        for key in reversed(keys):
            if key in insertion_only:
                # Storing is not a second access: keep the list, refresh recency.
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused:
                if key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        t1_entries = iter(self.t1.items())
        t2_entries = iter(self.t2.items())

        def next_evictable(
            entries: Iterable[tuple[OffloadKey, ChunkStatus]],
        ) -> tuple[OffloadKey, ChunkStatus] | None:
            for key, chunk in entries:
                if chunk.ref_cnt == 0 and key not in protected:
                    return key, chunk
            return None

        # Choose all n first (T1's size as it would shrink), then apply: all or nothing.
        chosen: list[tuple[OffloadKey, ChunkStatus, bool]] = []
        t1_size = len(self.t1)
        for _ in range(n):
            entry = None
            from_t1 = False
            if t1_size >= int(self.target_t1_size):
                entry = next_evictable(t1_entries)
                from_t1 = entry is not None
            if entry is None:
                entry = next_evictable(t2_entries)
            if entry is None:
                entry = next_evictable(t1_entries)
                if entry is None:
                    return None
                from_t1 = True
            if from_t1:
                t1_size -= 1
            chosen.append((entry[0], entry[1], from_t1))
        victims = []
        for key, chunk, from_t1 in chosen:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            victims.append((key, chunk))
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)
        return victims


POLICIES: dict[str, type[CachePolicy]] = {"lru": LRUPolicy, "arc": ARCPolicy}


def make_policy(name: str, capacity: int) -> CachePolicy:
    """The policy called ``name`` ("lru" or "arc") for a tier of ``capacity`` chunks."""
    try:
        return POLICIES[name](capacity)
    except KeyError:
        raise ValueError(
            f"offload policy must be one of {sorted(POLICIES)}, got {name!r}"
        ) from None
