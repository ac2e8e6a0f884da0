"""The prefix cache of the v1 BlockManager: which full blocks hold which content.

Full blocks are keyed by chained hashes of their tokens (engine.v1.prefix_keys), as vLLM 0.33's
BlockPool keys them. One key may map to several blocks (vLLM does not deduplicate, so block
tables stay append-only); a lookup takes the oldest. A cached block whose last holder frees
it stays cached, and evictable, until the free queue hands it out again (EVICT).
"""

from __future__ import annotations

from array import array
from collections import deque

import numpy as np

from engine.core.events import EventKind, EventSink
from engine.core.sequence import Sequence
from engine.v1.prefix_keys import GEN_TAG, TOKEN_ROOT

CACHE, EVICT, CACHE_RESET = EventKind.CACHE, EventKind.EVICT, EventKind.CACHE_RESET


def ensure_block_hashes(seq: Sequence, num_blocks: int, block_size: int) -> list[int]:
    """``seq.block_hashes`` extended to (at least) its first ``num_blocks`` full blocks,
    which must all be known tokens (num_blocks * block_size <= seq.num_tokens)."""
    keys = seq.block_hashes
    have = len(keys)
    if have >= num_blocks:
        return keys
    source = seq.prefix
    num_prompt = seq.num_prompt_tokens
    if source is None:
        prompt, generated = seq.prompt_token_ids, seq.generated_token_ids
        parent = keys[-1] if keys else TOKEN_ROOT
        for i in range(have, num_blocks):
            start, end = i * block_size, (i + 1) * block_size
            if end <= num_prompt:
                tokens = tuple(prompt[start:end])
            elif start >= num_prompt:
                tokens = tuple(generated[start - num_prompt : end - num_prompt])
            else:
                tokens = (*prompt[start:], *generated[: end - num_prompt])
            parent = hash((parent, tokens))
            keys.append(parent)
        return keys
    num_prompt_blocks = num_prompt // block_size
    if have < num_prompt_blocks:
        keys.extend(
            source.prompt_block_keys(
                seq.seq_id, have, min(num_blocks, num_prompt_blocks), block_size
            )
        )
        have = len(keys)
    if have < num_blocks:
        parent = keys[-1] if have > num_prompt_blocks else source.prompt_key(seq.seq_id, num_prompt)
        for _ in range(have, num_blocks):
            parent = hash((parent, GEN_TAG))
            keys.append(parent)
    return keys


class PrefixCacheMixin:
    """The BlockManager's prefix-cache map (see the module docstring)."""

    num_blocks: int
    block_size: int
    enable_prefix_caching: bool
    event_sink: EventSink | None
    _v1: bool
    num_cached_free_blocks: int

    def get_num_free_blocks(self) -> int:
        raise NotImplementedError

    def _init_prefix_cache(self) -> None:
        # key -> block id, or a list of block ids (oldest first) when several blocks hold
        # the same content (_num_shared_keys counts those); and each block's key, if any.
        # Keys are signed 64-bit, so a numpy column holds them: a table's keys are read and
        # written in one operation, and a batch of evictions pops its keys with one map().
        self._cached: dict[int, int | list[int]] = {}
        self._num_shared_keys = 0
        # C arrays (one block read as cheaply as a list item) with numpy views (a table's
        # blocks in one operation), as the BlockManager's reference counts.
        self._block_key_c = array("q", bytes(8 * self.num_blocks))
        self._has_key_c = array("b", bytes(self.num_blocks))
        self._block_key = np.frombuffer(self._block_key_c, dtype=np.int64)
        self._has_key = np.frombuffer(self._has_key_c, dtype=np.bool_)
        self._private_c = array("b", bytes(self.num_blocks))  # cached outside the map
        self._private = np.frombuffer(self._private_c, dtype=np.bool_)
        self._cached_at_c = array("q", bytes(8 * self.num_blocks))  # insertion order
        self._cached_at = np.frombuffer(self._cached_at_c, dtype=np.int64)
        self._cache_clock = 0
        self.num_evictions = 0
        # Keys a scheduler watches (FastV1Scheduler's blocked waiting head): caching any of
        # them sets _watch_hit.
        self._watch_keys: set[int] | None = None
        self._watch_hit = False

    def _evict(self, block_ids: list[int] | np.ndarray, as_list: list[int] | None = None) -> None:
        """Drop the keys of ``block_ids`` (cached free blocks being reused; a list, or an
        intp index array and optionally the same ids ``as_list``) from the prefix cache and
        record their EVICT event; the caller clears ``_has_key``."""
        sink = self.event_sink
        if sink is None or not sink.prefix_cache_events:
            self._drop_keys(block_ids, False)
            return
        keys = self._drop_keys(block_ids, True)
        ids = as_list if as_list is not None else block_ids
        if not isinstance(ids, list):
            ids = ids.tolist()
        sink.record(EVICT, -1, self.get_num_free_blocks(), ids, 0)
        sink.record_hashes(keys)

    def _drop_key(self, b: int) -> int:
        """``_drop_keys([b])`` for one block, returning its key: a decode step's take."""
        key = self._block_key_c[b]
        if self._private_c[b]:
            self._private_c[b] = 0
        else:
            entry = self._cached.pop(key)
            if isinstance(entry, list):  # several blocks hold this content
                self._unshare(key, entry, b)
        self.num_evictions += 1
        return key

    def _drop_keys(
        self, block_ids: list[int] | np.ndarray, want_keys: bool = True
    ) -> list[int] | np.ndarray:
        """The keys of ``block_ids`` (a list, or an int64 array), removed from the map
        (private ones only unmarked); without ``want_keys`` only those of blocks in the map
        are made (the rest: [])."""
        if len(block_ids) == 1:
            return [self._drop_key(int(block_ids[0]))]
        cached = self._cached
        index = np.asarray(block_ids, dtype=np.intp)
        private = self._private[index]
        private_bytes = private.tobytes()
        if b"\x00" not in private_bytes:  # prompts nobody shares: never in the map
            # (a byte test, not private.all(), and no keys unless an event needs them:
            # admission of an 80-block unique prompt 102 -> 87 us with free, micro_free.py;
            # the keys as an array, which the recorder takes as bytes)
            self._private[index] = False
            self.num_evictions += len(index)
            return self._block_key[index] if want_keys else []
        keys: list[int] = self._block_key[index].tolist()
        if b"\x01" in private_bytes:
            self._private[index[private]] = False
            in_map = index[~private]
        else:
            in_map = index
        if not self._num_shared_keys:
            # Each key maps to one block: pop them all at C speed.
            map_keys = keys if in_map is index else self._block_key[in_map].tolist()
            deque(map(cached.pop, map_keys), maxlen=0)
        else:
            for b, key in zip(in_map.tolist(), self._block_key[in_map].tolist()):
                entry = cached.pop(key)
                if isinstance(entry, list):  # several blocks hold this content
                    self._unshare(key, entry, b)
        self.num_evictions += len(keys)
        return keys

    def _unshare(self, key: int, entry: list[int], b: int) -> None:
        """Put back ``key``'s other blocks after ``b`` left (``entry`` was popped)."""
        entry.remove(b)
        if len(entry) == 1:
            self._cached[key] = entry[0]
            self._num_shared_keys -= 1
        else:
            self._cached[key] = entry

    def _map_insert(self, key: int, b: int) -> None:
        """Map ``key`` to block ``b`` too (after the blocks already holding it)."""
        cached = self._cached
        entry = cached.get(key)
        if entry is None:
            cached[key] = b
        elif isinstance(entry, int):
            cached[key] = [entry, b]
            self._num_shared_keys += 1
        else:
            entry.append(b)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks of ``seq``'s longest cached prefix, at most num_tokens - 1
        tokens (the last token is always recomputed, for its logits); [] without caching."""
        if not self.enable_prefix_caching:
            return []
        if seq.prefix is not None and not seq.prefix.shared:
            return self._find_private_prefix(seq)
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        cached = self._cached
        hits: list[int] = []
        if not max_blocks:
            return hits
        keys = seq.block_hashes
        if len(keys) < max_blocks:
            # Keys are made lazily; most lookups miss early, so make them a few at a time.
            have = len(keys)
            i = 0
            while i < max_blocks:
                if i >= have:
                    have = len(ensure_block_hashes(seq, min(max_blocks, max(2 * have, 8)), bs))
                entry = cached.get(keys[i])
                if entry is None:
                    return hits
                hits.append(entry if isinstance(entry, int) else entry[0])
                i += 1
            return hits
        for key in keys[:max_blocks]:
            entry = cached.get(key)
            if entry is None:
                break
            hits.append(entry if isinstance(entry, int) else entry[0])
        return hits

    def _find_private_prefix(self, seq: Sequence) -> list[int]:
        """``find_cached_prefix`` of a sequence whose blocks only it can hit: among the
        blocks of its earlier tables still carrying its key, the earliest cached."""
        tables = seq._cached_tables
        hits: list[int] = []
        if not tables:
            return hits  # nothing but itself could have cached its blocks
        bs = self.block_size
        max_blocks = min((seq.num_tokens - 1) // bs, max(len(t) for t in tables))
        keys = ensure_block_hashes(seq, max_blocks, bs)
        if len(tables) == 1:
            # Preempted once (the usual case): the leading blocks of that table still ours,
            # tested as arrays (a blocked, preempted waiting head is looked up after every
            # finish: 1.1% of the full Azure conversation trace's v1 run in the block loop)
            first = tables[0][:max_blocks]
            index = np.array(first, dtype=np.intp)
            still_ours = self._has_key[index] & self._private[index]
            still_ours &= self._block_key[index] == np.array(keys[: len(first)], dtype=np.int64)
            return first if still_ours.all() else first[: int(np.argmin(still_ours))]
        has_key, private, block_key = self._has_key_c, self._private_c, self._block_key_c
        cached_at = self._cached_at_c
        for i in range(max_blocks):
            key = keys[i]
            best = -1
            for table in tables:
                if i < len(table):
                    b = table[i]
                    ours = has_key[b] and private[b] and block_key[b] == key
                    if ours and (best < 0 or cached_at[b] < cached_at[best]):
                        best = b
            if best < 0:
                break
            hits.append(best)
        return hits

    def cache_blocks(
        self, seq: Sequence, num_tokens: int, table_index: np.ndarray | None = None
    ) -> None:
        """Cache ``seq``'s full blocks among its first ``num_tokens`` tokens (those not yet
        cached), under their chained keys. ``table_index``: its block table as an intp
        array, if the caller has one."""
        bs = self.block_size
        num_full = num_tokens // bs
        start = seq._num_cached_blocks
        if start >= num_full:
            return
        source = seq.prefix
        private = source is not None and not source.shared  # out of the map: module docstring
        if private:
            if self.event_sink is None:
                # Deferred: nobody else can hit these blocks and no event wants their keys
                # now, so their flags and keys are written when they are freed (or an event
                # sink appears): Azure bench v1+caching min thread CPU 4.56 -> 3.80 s.
                seq._num_cached_blocks = num_full
                return
            if seq._num_keyed_blocks < start:
                self.key_deferred_blocks(seq)
        keys = seq.block_hashes
        key_array = None
        if private and len(keys) == start and num_full * bs <= seq.num_prompt_tokens:
            # A unique prompt's next blocks: their keys made and stored as one array (not
            # through a list of Python ints: 87 -> 78 us per admission of 80 blocks + free,
            # micro_free.py).
            assert source is not None
            key_array = source.prompt_block_key_array(seq.seq_id, start, num_full)
            keys.extend(key_array.tolist())
        else:
            keys = ensure_block_hashes(seq, num_full, bs)
        table = seq.block_table
        cached = self._cached
        new_keys = keys[start:num_full]
        new_blocks = table[start:num_full]
        if not private:
            if cached.keys().isdisjoint(new_keys) and len(set(new_keys)) == len(new_keys):
                cached.update(zip(new_keys, new_blocks))  # the usual case: not cached yet
            else:
                for b, key in zip(new_blocks, new_keys):
                    self._map_insert(key, b)
        if num_full - start == 1:
            b = new_blocks[0]
            self._block_key_c[b] = new_keys[0]
            self._has_key_c[b] = 1
            if private:
                self._private_c[b] = 1
                self._cached_at_c[b] = self._cache_clock
        else:
            if table_index is not None:
                index = table_index[start:num_full]
            else:
                index = np.array(new_blocks, dtype=np.intp)
            self._block_key[index] = new_keys if key_array is None else key_array
            self._has_key[index] = True
            if private:
                self._private[index] = True
                self._cached_at[index] = np.arange(
                    self._cache_clock, self._cache_clock + len(index), dtype=np.int64
                )
        self._cache_clock += num_full - start
        seq._num_cached_blocks = seq._num_keyed_blocks = num_full
        if self._watch_keys is not None and not self._watch_keys.isdisjoint(new_keys):
            self._watch_hit = True
        sink = self.event_sink
        if sink is not None and sink.prefix_cache_events:
            sink.record(CACHE, seq.seq_id, self.get_num_free_blocks(), new_blocks, start)
            sink.record_hashes(new_keys if key_array is None else key_array)

    def key_deferred_blocks(self, seq: Sequence, table_index: np.ndarray | None = None) -> None:
        """Write the keys and cached flags of ``seq``'s cached blocks whose caching was
        deferred (a unique prompt's, with no event sink), as ``cache_blocks`` would have,
        in table order. Their CACHE events are not recorded (there was no sink).
        ``table_index``: its block table as an intp array, if the caller has one."""
        start, end = seq._num_keyed_blocks, seq._num_cached_blocks
        if start >= end:
            return
        if table_index is None:
            index = np.array(seq.block_table[start:end], dtype=np.intp)
        else:
            index = table_index[start:end]
        if len(seq.block_hashes) >= end:
            self._block_key[index] = seq.block_hashes[start:end]
        else:
            self._write_unique_keys(seq, start, end, index)
        self._has_key[index] = True
        self._private[index] = True
        clock = self._cache_clock
        self._cached_at[index] = np.arange(clock, clock + end - start, dtype=np.int64)
        self._cache_clock = clock + end - start
        seq._num_keyed_blocks = end

    def _write_unique_keys(self, seq: Sequence, start: int, end: int, index: np.ndarray) -> None:
        """The keys ``ensure_block_hashes`` gives ``seq``'s blocks start..end-1 (a unique
        prompt's), written to those blocks without growing ``seq.block_hashes``: the prompt
        part as one array, the generated part along its chain (with the table index reused
        from free_sequence_v1: Azure bench v1+caching min thread CPU 5.07 -> 4.89 s, a busy
        machine)."""
        source = seq.prefix
        assert source is not None
        keys = seq.block_hashes
        num_prompt_blocks = seq.num_prompt_tokens // self.block_size
        prompt_end = min(end, num_prompt_blocks)
        if start < prompt_end:
            self._block_key[index[: prompt_end - start]] = source.prompt_block_key_array(
                seq.seq_id, start, prompt_end
            )
        if end <= num_prompt_blocks:
            return
        block_key, table = self._block_key_c, seq.block_table
        first = max(start, num_prompt_blocks)
        known = max(len(keys), num_prompt_blocks)  # blocks from here on have no key yet
        for i in range(first, min(known, end)):
            block_key[table[i]] = keys[i]
        if known > num_prompt_blocks:
            parent = keys[known - 1]
        else:
            parent = source.prompt_key(seq.seq_id, seq.num_prompt_tokens)
        for i in range(known, end):
            parent = hash((parent, GEN_TAG))
            if i >= first:
                block_key[table[i]] = parent

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's reset_prefix_cache): only when no block is held;
        returns whether it did."""
        if not self._v1 or not self.enable_prefix_caching:
            return self.get_num_free_blocks() == self.num_blocks
        if self.get_num_free_blocks() != self.num_blocks:
            return False
        self._cached.clear()
        self._num_shared_keys = 0
        self.num_cached_free_blocks = 0
        self._has_key[:] = False
        self._private[:] = False
        sink = self.event_sink
        if sink is not None and sink.prefix_cache_events:
            sink.record(CACHE_RESET, -1, self.num_blocks)
        return True
