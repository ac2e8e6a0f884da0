"""What a prefix-aware router knows of each replica's cache: its KV events, late.

vLLM publishes ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` after each step
(kvsim/outputs/kv_events.py writes the same schema); routers such as llm-d's precise
prefix-cache scorer and Dynamo's KV router keep an index of them per worker. The index here
receives each replica's events as the replica records them and applies them ``delay_s``
later, so a router decides on the cache as it was, not as it is. A key may be held by
several blocks of one replica (two sequences cached the same content); the index counts
them, so it holds a key exactly while some block of the replica does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from engine.core.event_kinds import EventKind
from engine.core.events import EventRecorder

# KvEventIndex.publish's ops: BlockStored, BlockRemoved, AllBlocksCleared
STORED, REMOVED, RESET = 0, 1, 2
_CACHE, _EVICT, _RESET = int(EventKind.CACHE), int(EventKind.EVICT), int(EventKind.CACHE_RESET)


class KvEventIndex:
    """Per replica, the block keys its KV events say it holds, ``delay_s`` after the fact;
    with ``speculative_ttl_s`` > 0 also the keys the router predicted there (``speculate``)
    for that long: llm-d's speculative indexing (its precise prefix-cache scorer writes a
    routed prompt's block keys for the chosen endpoint at once, with a TTL, default 2 s,
    closing the gap between a routing decision and the KV events that confirm it)."""

    def __init__(self, num_replicas: int, delay_s: float, speculative_ttl_s: float = 0.0) -> None:
        if delay_s < 0:
            raise ValueError(f"the router's event delay must be >= 0 seconds, got {delay_s}")
        if speculative_ttl_s < 0:
            raise ValueError(f"the speculative TTL must be >= 0 seconds, got {speculative_ttl_s}")
        self.delay_s = delay_s
        self.speculative_ttl_s = speculative_ttl_s
        # predicted keys per replica -> when they expire (the latest prediction's), and the
        # predictions in expiry order (routings come in time order and the TTL is one)
        self._speculated: list[dict[int, float]] = [{} for _ in range(num_replicas)]
        self._expiries: deque[tuple[float, int, Sequence[int]]] = deque()
        self._held: list[dict[int, int]] = [{} for _ in range(num_replicas)]  # key -> blocks
        self._num_held = [0] * num_replicas  # blocks held (a key held twice counts twice)
        # per replica (each runs on its own clock, so only its own events come in time order)
        self._pending: list[deque[tuple[float, int, Sequence[int]]]] = [
            deque() for _ in range(num_replicas)
        ]

    def publish(self, time_s: float, replica: int, op: int, keys: Sequence[int]) -> None:
        """A replica's event at ``time_s`` (simulated seconds), in the replica's time order."""
        self._pending[replica].append((time_s + self.delay_s, op, keys))

    def advance(self, now_s: float) -> None:
        """Apply every event due by ``now_s`` and drop the predictions expired by then."""
        for replica, pending in enumerate(self._pending):
            if pending and pending[0][0] <= now_s:
                self._apply(replica, pending, now_s)
        expiries = self._expiries
        while expiries and expiries[0][0] <= now_s:
            expiry, replica, keys = expiries.popleft()
            speculated = self._speculated[replica]
            for key in keys:
                if speculated.get(key) == expiry:  # not predicted again since
                    del speculated[key]

    def speculate(self, now_s: float, replica: int, keys: Sequence[int]) -> None:
        """The router sent a prompt with block ``keys`` to ``replica`` at ``now_s``: count them
        as held there until ``now_s + speculative_ttl_s`` (nothing without a TTL). Confirmed
        keys (KV events) are kept apart: an expiry never drops them, nor a BlockRemoved a
        prediction."""
        if self.speculative_ttl_s <= 0 or not keys:
            return
        expiry = now_s + self.speculative_ttl_s
        self._speculated[replica].update(dict.fromkeys(keys, expiry))
        self._expiries.append((expiry, replica, keys))

    def _apply(
        self, replica: int, pending: deque[tuple[float, int, Sequence[int]]], now_s: float
    ) -> None:
        counts = self._held[replica]
        while pending and pending[0][0] <= now_s:
            _, op, keys = pending.popleft()
            if op == STORED:
                _store(counts, keys)
                self._num_held[replica] += len(keys)
            elif op == REMOVED:
                _remove(counts, keys)
                self._num_held[replica] -= len(keys)
            else:
                counts.clear()
                self._num_held[replica] = 0

    def prefix_blocks(self, replica: int, keys: Sequence[int]) -> int:
        """How many of ``keys`` (a prompt's block keys in order) the replica holds from the
        first one on."""
        counts, speculated = self._held[replica], self._speculated[replica]
        n = 0
        for key in keys:
            if key not in counts and key not in speculated:
                break
            n += 1
        return n

    def num_cached_blocks(self, replica: int) -> int:
        """Blocks the replica holds under a key: the size of its cache as the router sees it."""
        return self._num_held[replica]

    def keys(self, replica: int) -> set[int]:
        """The keys the replica holds (tests compare them with the cache itself)."""
        return set(self._held[replica])


# An event carries a whole chain of blocks (hundreds for a long prompt) and is nearly always
# new keys (stored) or keys held once (removed): those cases run their loop in C (dict.update,
# map(pop)); the rest one key at a time. Per-key Python loops took a sixth of a fleet run.


def _store(counts: dict[int, int], keys: Sequence[int]) -> None:
    fresh = dict.fromkeys(keys, 1)
    if len(fresh) == len(keys) and counts.keys().isdisjoint(fresh):
        counts.update(fresh)
        return
    for key in keys:
        counts[key] = counts.get(key, 0) + 1


def _remove(counts: dict[int, int], keys: Sequence[int]) -> None:
    taken = list(map(counts.pop, keys, repeat(0)))
    if taken.count(1) == len(taken):
        return
    for key, count in zip(keys, taken):  # put back what was taken, then one at a time
        if count:
            counts[key] = count
    for key in keys:
        left = counts.get(key, 0) - 1
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)


class KvEventTap(EventRecorder):
    """A replica's event recorder that also hands its CACHE / EVICT / CACHE_RESET events
    (BlockStored / BlockRemoved / AllBlocksCleared) to a ``KvEventIndex`` as they happen.
    Set ``index`` and ``replica`` before the first event."""

    index: KvEventIndex | None = None
    replica: int = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.prefix_cache_events = True
        # (op, number of keys) of the CACHE / EVICT events whose keys come next
        self._awaiting: list[tuple[int, int]] = []

    def record(
        self,
        kind: EventKind,
        seq_id: int,
        free_blocks: int,
        block_ids: Sequence[int] = (),
        num_tokens: int = 0,
    ) -> None:
        super().record(kind, seq_id, free_blocks, block_ids, num_tokens)
        if kind == _CACHE:
            self._awaiting.append((STORED, len(block_ids)))
        elif kind == _EVICT:
            self._awaiting.append((REMOVED, len(block_ids)))
        elif kind == _RESET and self.index is not None:
            self.index.publish(self.clock(), self.replica, RESET, ())

    def record_block_events(
        self, kinds: list[int], seq_ids: list[int], block_ids: list[int], num_tokens: list[int],
        free_blocks: int,
    ) -> None:  # fmt: skip
        super().record_block_events(kinds, seq_ids, block_ids, num_tokens, free_blocks)
        for kind in kinds:
            if kind == _CACHE:
                self._awaiting.append((STORED, 1))
            elif kind == _EVICT:
                self._awaiting.append((REMOVED, 1))

    def record_hashes(self, block_hashes: Sequence[int] | np.ndarray) -> None:
        super().record_hashes(block_hashes)
        keys = block_hashes.tolist() if isinstance(block_hashes, np.ndarray) else block_hashes
        index, now, at = self.index, self.clock(), 0
        for op, count in self._awaiting:
            if index is not None:
                index.publish(now, self.replica, op, list(keys[at : at + count]))
            at += count
        if at != len(keys):
            raise RuntimeError(
                f"replica {self.replica}: {len(keys)} block keys for {at} awaited: the engine's "
                "event protocol changed (engine/core/events.py, record_hashes)"
            )
        self._awaiting.clear()
