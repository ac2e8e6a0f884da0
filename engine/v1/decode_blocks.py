"""The BlockManager's decode-path block operations (FastV1Scheduler's running pass).

In a step where every running sequence decodes, few blocks change: a decoder whose next
token starts a block takes one from the front of the free queue (evicting its key if the
block is cached), one whose token fills a block caches it under a key made in O(1) from the
previous one. These are ``allocate_slots`` / ``cache_blocks`` for exactly one block, with
the same events; ``take_decode_blocks`` / ``cache_decode_blocks`` do a whole step's takes or
caches when there is no event sink (no keys are made for evictions then).
"""

from __future__ import annotations

from array import array

from engine.core.events import EventKind, EventSink
from engine.core.sequence import Sequence
from engine.v1.prefix_cache import ensure_block_hashes
from engine.v1.prefix_keys import GEN_TAG

APPEND_BLOCK, CACHE, EVICT = EventKind.APPEND_BLOCK, EventKind.CACHE, EventKind.EVICT
_NOT_QUEUED = -1


class DecodeBlocksMixin:
    """One-block takes and caches of the decode path (see the module docstring)."""

    # The BlockManager's state these read and write (engine/v1/kv_cache_manager.py,
    # engine/v1/prefix_cache.py).
    block_size: int
    event_sink: EventSink | None
    _free: list[int]
    _head: int
    _queue_pos: array[int]
    _num_stale: int
    _ref_counts: array[int]
    _owners: array[int]
    _has_key_c: array[int]
    _private_c: array[int]
    _block_key_c: array[int]
    _cached_at_c: array[int]
    _cache_clock: int
    _watch_keys: set[int] | None
    _watch_hit: bool
    num_evictions: int
    num_cached_free_blocks: int

    def get_num_free_blocks(self) -> int:
        raise NotImplementedError

    def _front_block(self) -> int:
        raise NotImplementedError

    def _compact(self) -> None:
        raise NotImplementedError

    def _drop_key(self, b: int) -> int:
        raise NotImplementedError

    def _map_insert(self, key: int, b: int) -> None:
        raise NotImplementedError

    def key_deferred_blocks(self, seq: Sequence) -> None:
        raise NotImplementedError

    def append_decode_block(self, seq: Sequence) -> None:
        """``allocate_slots`` of a running sequence whose next token starts a new block (the
        fast decode path): one block from the free queue, the same events."""
        b, key = self._take_one(seq)
        sink = self.event_sink
        if sink is not None:
            if key is not None and sink.prefix_cache_events:
                sink.record(EVICT, -1, self.get_num_free_blocks(), [b], 0)
                sink.record_hashes([key])
            sink.record_appends([seq.seq_id], [b], self.get_num_free_blocks())

    def _take_one(self, seq: Sequence) -> tuple[int, int | None]:
        """``append_decode_block`` without its events: the block ``seq`` took from the
        front of the free queue, and the key it was evicted with (None: it had none)."""
        b = self._front_block()
        key = None
        if self._has_key_c[b]:
            self._has_key_c[b] = 0
            self.num_cached_free_blocks -= 1
            key = self._drop_key(b)
        self._owners[b] = seq.seq_id
        seq.block_table.append(b)
        return b, key

    def decode_blocks(
        self, needing: list[Sequence], filling: list[Sequence], order: dict[int, int]
    ) -> None:
        """The block work of a decode-only pass (FastV1Scheduler's): each of ``needing``
        takes a block (``append_decode_block``), each of ``filling`` caches the block its
        token fills (``cache_decode_block``; the sequences' keys must not need their
        tokens, or be synced). Both lists are in running order; ``order`` (seq_id ->
        running position) merges them as the plain pass visits them. The events are those
        calls' events, recorded as one block run. With no event sink the takes and caches
        commute (a take touches free blocks, a cache held ones; the prefix-cache map ends the
        same either way): they run unmerged, in the two batches below."""
        sink = self.event_sink
        if sink is None:
            # each batch in one loop: with the unique-key table of engine/v1/prefix_keys.py,
            # Azure bench first 8,000 requests min thread CPU 2.12 -> 1.95 s (4 rounds)
            self.take_decode_blocks(needing)
            self.cache_decode_blocks(filling)
            return
        if not needing:
            visits = [(0, 1, s) for s in filling]
        elif not filling:
            visits = [(0, 0, s) for s in needing]
        elif filling is needing:  # block size 1: each takes a block and fills it, in order
            visits = [(0, c, s) for s in needing for c in (0, 1)]
        else:
            # (running position, take 0 / cache 1, seq): one sort of int-led tuples
            visits = sorted(
                [(order[s.seq_id], 0, s) for s in needing]
                + [(order[s.seq_id], 1, s) for s in filling]
            )
        cache_events = sink.prefix_cache_events
        kinds: list[int] = []
        seq_ids: list[int] = []
        blocks: list[int] = []
        tokens: list[int] = []
        keys: list[int] = []
        free_before = self.get_num_free_blocks()
        # _take_one and _cache_one inlined, with the pool's arrays in locals: a visit is a
        # few item reads and writes (full Azure conversation trace, v1 + caching, events
        # streamed: simulation loop 5.19 -> 4.91 s, medians of 6 interleaved)
        free, pos, refs, owners = self._free, self._queue_pos, self._ref_counts, self._owners
        has_key, private_c, block_key = self._has_key_c, self._private_c, self._block_key_c
        cached_at, bs = self._cached_at_c, self.block_size
        for _, caches, seq in visits:
            seq_id = seq.seq_id
            if not caches:
                head = self._head
                b = free[head]
                while pos[b] != head:  # a dead entry (its block left from the middle)
                    self._num_stale -= 1
                    head += 1
                    b = free[head]
                self._head = head + 1
                if head > 4096 and head * 2 > len(free):
                    self._compact()
                pos[b] = _NOT_QUEUED
                refs[b] = 1
                if has_key[b]:
                    has_key[b] = 0
                    self.num_cached_free_blocks -= 1
                    if private_c[b]:
                        private_c[b] = 0
                        self.num_evictions += 1
                        key = block_key[b]
                    else:
                        key = self._drop_key(b)
                    if cache_events:
                        kinds.append(EVICT)
                        seq_ids.append(-1)
                        blocks.append(b)
                        tokens.append(0)
                        keys.append(key)
                owners[b] = seq_id
                seq.block_table.append(b)
                kinds.append(APPEND_BLOCK)
                tokens.append(1)
            else:
                i = seq._num_cached_blocks
                source = seq.prefix
                private = source is not None and not source.shared
                if private and seq._num_keyed_blocks < i:  # deferred while there was no sink
                    self.key_deferred_blocks(seq)
                hashes = seq.block_hashes
                if len(hashes) == i and source is not None and i > seq.num_prompt_tokens // bs:
                    key = hash((hashes[-1], GEN_TAG))
                    hashes.append(key)
                else:
                    key = ensure_block_hashes(seq, i + 1, bs)[i]
                b = seq.block_table[i]
                if private:
                    private_c[b] = 1
                    cached_at[b] = self._cache_clock
                else:
                    self._map_insert(key, b)
                self._cache_clock += 1
                block_key[b] = key
                has_key[b] = 1
                seq._num_cached_blocks = seq._num_keyed_blocks = i + 1
                if self._watch_keys is not None and key in self._watch_keys:
                    self._watch_hit = True
                if not cache_events:
                    continue
                kinds.append(CACHE)
                tokens.append(i)
                keys.append(key)
            seq_ids.append(seq_id)
            blocks.append(b)
        if kinds:
            sink.record_block_events(kinds, seq_ids, blocks, tokens, free_before)
            if keys:
                sink.record_hashes(keys)

    def cache_decode_block(self, seq: Sequence) -> None:
        """``cache_blocks`` when a decode token fills exactly one block (the fast decode
        path): its key made in O(1) from the previous one, the same events."""
        b, key = self._cache_one(seq)
        sink = self.event_sink
        if sink is not None and sink.prefix_cache_events:
            sink.record(
                CACHE, seq.seq_id, self.get_num_free_blocks(), (b,), seq._num_cached_blocks - 1
            )
            sink.record_hashes((key,))

    def _cache_one(self, seq: Sequence) -> tuple[int, int]:
        """Cache ``seq``'s next full block (``cache_decode_block`` without its event):
        returns the block and its key (0 when its caching is deferred)."""
        i = seq._num_cached_blocks
        source = seq.prefix
        if source is not None and not source.shared:
            if self.event_sink is None:  # deferred (PrefixCacheMixin.cache_blocks)
                seq._num_cached_blocks = i + 1
                return seq.block_table[i], 0
            if seq._num_keyed_blocks < i:  # deferred while there was no event sink
                self.key_deferred_blocks(seq)
        keys = seq.block_hashes
        if (
            len(keys) == i
            and seq.prefix is not None
            and i > seq.num_prompt_tokens // self.block_size
        ):
            key = hash((keys[-1], GEN_TAG))
            keys.append(key)
        else:
            key = ensure_block_hashes(seq, i + 1, self.block_size)[i]
        b = seq.block_table[i]
        if seq.prefix is not None and not seq.prefix.shared:
            self._private_c[b] = 1
            self._cached_at_c[b] = self._cache_clock
        else:
            self._map_insert(key, b)
        self._cache_clock += 1
        self._block_key_c[b] = key
        self._has_key_c[b] = 1
        seq._num_cached_blocks = seq._num_keyed_blocks = i + 1
        if self._watch_keys is not None and key in self._watch_keys:
            self._watch_hit = True
        return b, key

    def take_decode_blocks(self, seqs: list[Sequence]) -> None:
        """``_take_one`` for each of ``seqs`` in order, in one loop (no event sink: an
        evicted unique block's key is not read)."""
        free, pos, refs, owners = self._free, self._queue_pos, self._ref_counts, self._owners
        has_key, private = self._has_key_c, self._private_c
        head = self._head
        for seq in seqs:
            b = free[head]
            while pos[b] != head:  # a dead entry (its block left from the middle): skip it
                self._num_stale -= 1
                head += 1
                b = free[head]
            pos[b] = _NOT_QUEUED
            if head > 4096 and head * 2 > len(free):  # _front_block's compaction, exactly
                self._head = head + 1
                self._compact()
                head = self._head
            else:
                head += 1
            refs[b] = 1
            if has_key[b]:
                has_key[b] = 0
                self.num_cached_free_blocks -= 1
                if private[b]:
                    private[b] = 0
                    self.num_evictions += 1
                else:
                    self._drop_key(b)
            owners[b] = seq.seq_id
            seq.block_table.append(b)
        self._head = head

    def cache_decode_blocks(self, seqs: list[Sequence]) -> None:
        """``_cache_one`` for each of ``seqs`` in order, in one loop (no event sink: a unique
        prompt's caching is deferred); their keys must not need their tokens, or be
        synced."""
        if not seqs:
            return
        bs = self.block_size
        block_key, has_key = self._block_key_c, self._has_key_c
        clock, watch = self._cache_clock, self._watch_keys
        for seq in seqs:
            i = seq._num_cached_blocks
            source = seq.prefix
            if source is not None and not source.shared:
                seq._num_cached_blocks = i + 1  # deferred (cache_blocks)
                continue
            keys = seq.block_hashes
            if len(keys) == i and source is not None and i > seq.num_prompt_tokens // bs:
                key = hash((keys[-1], GEN_TAG))
                keys.append(key)
            else:
                key = ensure_block_hashes(seq, i + 1, bs)[i]
            b = seq.block_table[i]
            self._map_insert(key, b)
            clock += 1
            block_key[b] = key
            has_key[b] = 1
            seq._num_cached_blocks = seq._num_keyed_blocks = i + 1
            if watch is not None and key in watch:
                self._watch_hit = True
        self._cache_clock = clock
